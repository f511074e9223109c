"""The runtime's kernels that no collective test reaches, on one GPU (skipped without one):
``reduce_local_*`` (the all-reduce's reduction loop over buffers one process owns, which
``benchmarks/gpu_allreduce.py`` times against the copy roofline and NVSHMEM's reduce),
bitwise against the host's rank-order reduction."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectives.gpu import KERNELS, THREADS, grid_blocks
from collectives.ops import accumulate_dtype, reduce_into
from shmem.dtypes import as_dtype
from tests.gpu.params import grid

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("dtype", "op", "count"),
    grid(
        ["float16", "bfloat16", "float32", "float32_acc64", "float64"],
        ["sum", "avg", "prod", "min", "max"],
        [3],
        smoke=[("bfloat16", "avg", 3)],
    ),
)
def test_reduce_local_equals_the_rank_order_reduction(dtype: str, op: str, count: int) -> None:
    from cuda.core import Buffer as CCBuffer
    from cuda.core import Device, LaunchConfig, launch

    from shmem import cuda as shmem_cuda

    elem = as_dtype("float32" if dtype == "float32_acc64" else dtype)
    acc = accumulate_dtype(elem, np.dtype(np.float64 if dtype == "float32_acc64" else np.float32))
    n = 70_001  # not a multiple of the block
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal(n) * 3).astype(elem) for _ in range(count)]
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()

    def upload(a: np.ndarray[Any, Any]) -> Any:
        buf = dev.allocate(a.nbytes, stream=stream)
        buf.copy_from(CCBuffer.from_handle(int(a.ctypes.data), a.nbytes), stream=stream)
        return buf

    on_gpu = [upload(a) for a in inputs]
    table = np.array([int(b.handle) for b in on_gpu], np.uint64)
    table_gpu = upload(table)
    out = dev.allocate(n * elem.itemsize, stream=stream)
    fn = shmem_cuda.load_kernel(0, KERNELS, f"reduce_local_{dtype}_{op}")
    blocks = grid_blocks(n, int(dev.properties.multiprocessor_count))
    launch(
        stream,
        LaunchConfig(grid=blocks, block=THREADS),
        fn,
        np.uint64(int(table_gpu.handle)),
        np.uint64(int(out.handle)),
        np.uint64(n),
        np.int32(count),
    )
    got = np.empty(n, elem)
    out.copy_to(CCBuffer.from_handle(int(got.ctypes.data), got.nbytes), stream=stream)
    stream.sync()
    want = np.empty(n, elem)
    reduce_into(want, inputs, op, acc, avg_count=count)
    assert got.tobytes() == want.tobytes(), (got[:4], want[:4])
    for b in (*on_gpu, table_gpu, out):
        b.close(stream)
