"""Run tests of ``tests/gpu`` on the fake driver: the GPU tests' own code (arguments, shapes,
references, tolerances) and the kernels themselves, which run from their own source on the
CPU (tests/fakegpu/cudacpu), before a lent GPU's time is spent on them.

    env $(python tests/fakegpu/build.py logs/fakegpu --env logs/fakegpu/kernels | tail -n +2) \\
        PYTHONPATH=tests/fakegpu:. SHMEM_BACKEND=nvshmem \\
        python -m launch -n 1 tests/fakegpu/run_gpu_tests.py --only-mpi \\
        tests/gpu/test_nvshmem_ranks.py::test_gpu_sequence_parallel_equals_one_gpu

Tests that need what the fake has not (a second PE, torch on CUDA) fail or skip here; pick
the ones to check. GPU IPC between processes runs: the fake's IPC pools are memfds.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.fakegpu import fakedriver, planted

fakedriver.install()  # here and in the Python processes the tests start
planted.plant_from_environment()  # PLANTED_BUG: a kernel bug (tests/fakegpu/planted.py)


class _FakeProbe:
    """tests/gpu's probe says one device (the fake's)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: Any) -> None:
        import tests.gpu.conftest

        gpu_conftest: Any = tests.gpu.conftest
        gpu_conftest.probe = lambda: (1, "the fake driver")


if __name__ == "__main__":
    sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", *sys.argv[1:]], plugins=[_FakeProbe()]))
