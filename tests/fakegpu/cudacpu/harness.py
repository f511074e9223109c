"""The CUDA-on-CPU layer driven directly, without a driver: a kernel source built for the CPU
and launched on host memory (numpy arrays), for the layer's own tests
(tests/fakegpu/test_cudacpu.py) and the PTX probe (tests/gpu/kernels/ptx_probe.cu).

    python tests/fakegpu/cudacpu/harness.py SOURCE KERNEL [--grid N] [--block N]

runs ``KERNEL(int* out)`` of SOURCE once on a zeroed buffer of 4096 ints and prints the first
64 (the fault tests: a kernel that deadlocks or diverges ends the process with a report).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

__all__ = ["Layer", "Module"]


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def _dim3(v: int | tuple[int, ...]) -> _Dim3:
    t = (v, 1, 1) if isinstance(v, int) else (*v, 1, 1)[:3]
    return _Dim3(*t)


class Module:
    """A source built for the CPU: launch its kernels by name."""

    def __init__(self, layer: Layer, handle: int) -> None:
        self.layer, self.handle = layer, handle

    def launch(
        self,
        name: str,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        *args: Any,
        cooperative: bool = False,
        smem: int = 0,
        multiprocessors: int = 4,
    ) -> None:
        """Run kernel ``name`` to its end. Arguments: numpy arrays (passed as pointers to
        their data), numpy scalars or ctypes values, in the kernel's parameter order."""
        lib = self.layer.lib
        k = lib.cudacpu_kernel_of(self.handle, name.encode())
        if not k:
            raise KeyError(f"harness: no kernel {name!r} in the module")
        sizes = (ctypes.c_size_t * 64)()
        n = lib.cudacpu_params(k, sizes, 64)
        if n != len(args):
            raise TypeError(f"harness: {name} takes {n} parameters (got {len(args)})")
        keep: list[Any] = []
        params = (ctypes.c_void_p * max(n, 1))()
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                value: Any = ctypes.c_void_p(a.ctypes.data)
            elif isinstance(a, np.generic):
                value = ctypes.create_string_buffer(a.tobytes(), a.nbytes)
            else:
                value = a
            if ctypes.sizeof(value) != sizes[i]:
                raise TypeError(
                    f"harness: {name} parameter {i} has {sizes[i]} bytes (got "
                    f"{ctypes.sizeof(value)})"
                )
            keep.append(value)
            params[i] = ctypes.cast(ctypes.pointer(value), ctypes.c_void_p)
        err = ctypes.create_string_buffer(4096)
        rc = lib.cudacpu_launch(
            k, _dim3(grid), _dim3(block), smem, params, int(cooperative), multiprocessors,
            err, len(err),
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"harness: launch of {name} refused ({rc}): {err.value.decode()}")

    def kernels(self) -> list[str]:
        """The names of the module's kernels."""
        lib = self.layer.lib
        return [
            lib.cudacpu_kernel_at(self.handle, i).decode()
            for i in range(lib.cudacpu_kernel_count(self.handle))
        ]


class Layer:
    """libcudacpu.so of a build folder (tests/fakegpu/build.py)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        lib = ctypes.CDLL(str(Path(folder) / "libcudacpu.so"), mode=ctypes.RTLD_GLOBAL)
        lib.cudacpu_load.restype = ctypes.c_void_p
        lib.cudacpu_load.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
        ]  # fmt: skip
        lib.cudacpu_kernel_of.restype = ctypes.c_void_p
        lib.cudacpu_kernel_of.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.cudacpu_params.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.cudacpu_kernel_count.argtypes = [ctypes.c_void_p]
        lib.cudacpu_kernel_at.restype = ctypes.c_char_p
        lib.cudacpu_kernel_at.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.cudacpu_launch.argtypes = [
            ctypes.c_void_p, _Dim3, _Dim3, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int,
            ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
        ]  # fmt: skip
        self.lib = lib

    def load(self, source: str, options: str = "-arch=sm_90\n") -> Module:
        """Build ``source`` (the text NVRTC would compile) for the CPU and load it."""
        data = source.encode()
        err = ctypes.create_string_buffer(65536)
        handle = self.lib.cudacpu_load(data, len(data), options.encode(), err, len(err))
        if not handle:
            raise RuntimeError(f"harness: the CPU build failed: {err.value.decode()}")
        return Module(self, handle)


def source(relative: str) -> str:
    """A kernel file of the tree as NVRTC gets it (quoted includes in place)."""
    sys.path.insert(0, str(ROOT))
    from shmem.device.cuda.nvrtc import source_of

    return source_of(relative)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("kernel")
    ap.add_argument("--grid", type=int, default=2)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--build", default=os.environ.get("FAKEGPU_BUILD", str(ROOT / "logs/fakegpu")))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.fakegpu import build

    layer = Layer(build.build(args.build))
    module = layer.load(Path(args.source).read_text())
    out = np.zeros(4096, np.int32)
    module.launch(args.kernel, args.grid, args.block, out)
    print(" ".join(str(int(x)) for x in out[:64]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
