"""GPU tests: one probe in a subprocess decides, and every test skips cleanly without a GPU.

A probe in this process could hang it (cuda.core without a driver hangs on a second kernel
lookup), so a child process answers whether a CUDA device is usable.

``TESTS_KERNEL_TRACE=DIR``: every process appends the runtime kernels it loads to
``DIR/<pid>.txt`` (``file kernel`` per line, once each), so the GPU run's smoke tier can say
which kernel families never launched (``scripts/gpu_preflight.py coverage``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

_PROBE = "import shmem; print(shmem.Device.count('cuda'))"


@functools.cache
def probe() -> tuple[int, str]:
    """``(CUDA devices, what the probe said)``, from a child process."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        return 0, f"the probe did not finish: {exc}"
    said = (out.stdout + out.stderr).strip()[-2000:]
    try:
        return (int(out.stdout.strip() or 0) if out.returncode == 0 else 0), said
    except ValueError:
        return 0, said


def gpu_count() -> int:
    return probe()[0]


def pytest_configure(config: pytest.Config) -> None:
    trace = os.environ.get("TESTS_KERNEL_TRACE")
    if trace:
        _trace_kernels(Path(trace))


def _trace_kernels(directory: Path) -> None:
    """Wrap the runtime's one kernel lookup (``shmem.device.cuda.kernels.kernel``, which every
    launch goes through, also under its re-exported name ``shmem.device.cuda.kernel``) so that
    each kernel it hands out is written down once."""
    from shmem.device import cuda as _cuda
    from shmem.device.cuda import kernels as _cuda_kernels

    directory.mkdir(parents=True, exist_ok=True)
    lookup = _cuda_kernels.kernel
    seen: set[tuple[str, str]] = set()

    def traced(device_id: int, relative: str, name: str) -> Any:
        fn = lookup(device_id, relative, name)
        if (relative, name) not in seen:
            seen.add((relative, name))
            with (directory / f"{os.getpid()}.txt").open("a") as f:
                f.write(f"{relative} {name}\n")
        return fn

    _cuda_kernels.kernel = _cuda.kernel = traced  # type: ignore[assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [it for it in items if "tests/gpu/" in str(it.path).replace("\\", "/")]
    if not gpu_items or gpu_count() > 0:
        return
    if os.environ.get("SHMEM_REQUIRE_GPU") == "1":  # a GPU run: no GPU is a failure
        raise pytest.UsageError(
            f"SHMEM_REQUIRE_GPU=1 but the CUDA probe found no usable device: {probe()[1]}"
        )
    skip = pytest.mark.skip(reason="no CUDA device (probed once in a subprocess)")
    for it in gpu_items:
        it.add_marker(skip)
