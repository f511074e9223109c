"""Run tests of ``tests/gpu`` on the fake driver, one rank: a check of the GPU tests' own code
(arguments, shapes, references, tolerances) before a lent GPU's time is spent on them. Not a
check of the kernels: the fake emulates them (tests/fakegpu/README.md).

    mkdir -p /tmp/fake && python3 tests/fakegpu/kernel_signatures.py /tmp/fake
    cc -shared -fPIC -O1 -I /tmp/fake -o /tmp/fake/libcuda.so.1 tests/fakegpu/fake_libcuda.c \\
        -lm -lpthread
    ln -sf libcuda.so.1 /tmp/fake/libcuda.so
    LD_LIBRARY_PATH=/tmp/fake PYTHONPATH=tests/fakegpu:. SHMEM_BACKEND=nvshmem \\
        python -m launch -n 1 tests/fakegpu/run_gpu_tests.py --only-mpi \\
        tests/gpu/test_nvshmem_ranks.py::test_gpu_sequence_parallel_equals_one_gpu

Tests that need what the fake has not (a second PE, torch on CUDA) fail or skip here; pick
the ones to check. GPU IPC between processes runs: the fake's IPC pools are memfds.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.fakegpu import fakedriver

fakedriver.install()  # here and in the Python processes the tests start


class _FakeProbe:
    """tests/gpu's probe says one device (the fake's)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: Any) -> None:
        import tests.gpu.conftest

        gpu_conftest: Any = tests.gpu.conftest
        gpu_conftest.probe = lambda: (1, "the fake driver")


if __name__ == "__main__":
    sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", *sys.argv[1:]], plugins=[_FakeProbe()]))
