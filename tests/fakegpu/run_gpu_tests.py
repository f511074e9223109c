"""Run tests of ``tests/gpu`` on the fake driver, one rank: a check of the GPU tests' own code
(arguments, shapes, references, tolerances) before a lent GPU's time is spent on them. Not a
check of the kernels: the fake emulates them (tests/fakegpu/README.md).

    cc -shared -fPIC -O1 -o /tmp/fake/libcuda.so.1 tests/fakegpu/fake_libcuda.c -lm
    ln -sf libcuda.so.1 /tmp/fake/libcuda.so
    LD_LIBRARY_PATH=/tmp/fake PYTHONPATH=tests/fakegpu:. SHMEM_BACKEND=nvshmem \\
        python -m launch -n 1 tests/fakegpu/run_gpu_tests.py --only-mpi \\
        tests/gpu/test_nvshmem_ranks.py::test_gpu_sequence_parallel_equals_one_gpu

Tests that need what the fake has not (a second PE, torch on CUDA, IPC between processes)
fail or skip here; pick the ones to check.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

import shmem._cuda_device as _c
import shmem.backends as _backends

_c._driver_present = lambda: True  # the fake libcuda stands in for a driver
_c.device_count.cache_clear()
_backends._nvshmem_status = lambda: None  # and the fake nvshmem for nvshmem4py


class _FakeProbe:
    """tests/gpu's probe says one device (the fake's)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: Any) -> None:
        import tests.gpu.conftest

        gpu_conftest: Any = tests.gpu.conftest
        gpu_conftest.probe = lambda: (1, "the fake driver")


if __name__ == "__main__":
    sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", *sys.argv[1:]], plugins=[_FakeProbe()]))
