"""Streams, kernels and buffers: the same code on the host device and on a GPU.

A DeviceContext is a stream: work is queued and runs in order; synchronize() waits for it.
On the host, a "kernel" is a Python function run once per block (blocks in parallel).

    python examples/03_device_context.py           # host device
    python examples/03_device_context.py cuda:0    # a GPU (CUDA C++ kernel via NVRTC)
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import shmem
from shmem import Block, Buffer, DeviceContext

N = 1 << 16
BLOCK = 1024

CUDA_SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def host_saxpy(
    block: Block, a: float, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], n: int
) -> None:
    lo = block.block_idx.x * BLOCK  # each block owns one tile of the vectors
    hi = min(lo + BLOCK, n)
    y[lo:hi] = a * x[lo:hi] + y[lo:hi]


def main() -> None:
    device = shmem.CPU() if len(sys.argv) < 2 else shmem.Accelerator(int(sys.argv[1][5:]))
    with DeviceContext(device) as ctx:
        x = ctx.enqueue_create_buffer("float32", N)
        y = ctx.enqueue_create_buffer("float32", N)
        ctx.enqueue_copy(x, np.arange(N, dtype=np.float32))
        ctx.enqueue_memset(y, 1.0)
        if device.is_host:
            fn = ctx.compile_function(host_saxpy)
            args: tuple[Any, ...] = (2.0, x, y, N)
        else:
            fn = ctx.compile_function(CUDA_SAXPY, "saxpy")
            args = (np.float32(2.0), x, y, np.uint64(N))
        grid = (N + BLOCK - 1) // BLOCK
        ns = ctx.execution_time(
            lambda c: c.enqueue_function(fn, *args, grid_dim=grid, block_dim=BLOCK), 1
        )
        out = ctx.enqueue_create_host_buffer("float32", N)
        ctx.enqueue_copy(out, y)
        ctx.synchronize()
        expected = 2 * np.arange(N, dtype=np.float32) + 1
        assert np.array_equal(out.to_numpy(), expected), "saxpy result is wrong"
        view = Buffer.from_numpy(out.to_numpy().reshape(256, 256))[::64, 1:3]
        print(
            f"device context ok on {device.label}: saxpy of {N} elements in {grid} blocks "
            f"took {ns / 1e6:.2f} ms; a strided view {view.shape} strides {view.strides}"
        )


if __name__ == "__main__":
    main()
