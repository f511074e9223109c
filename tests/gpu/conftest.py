"""GPU tests: one probe in a subprocess decides, and every test skips cleanly without a GPU.

A probe in this process could hang it (cuda.core without a driver hangs on a second kernel
lookup), so a child process answers whether a CUDA device is usable.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

_PROBE = "import shmem; print(shmem.Device.count('cuda'))"


@functools.cache
def gpu_count() -> int:
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
        return int(out.stdout.strip() or 0) if out.returncode == 0 else 0
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [it for it in items if "tests/gpu/" in str(it.path).replace("\\", "/")]
    if gpu_items and gpu_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device (probed once in a subprocess)")
        for it in gpu_items:
            it.add_marker(skip)
