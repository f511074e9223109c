"""The launcher's clean-up of MPI segments after an abnormal end (issue 15, point 7): a
segment of the job still mapped by a rank that is exiting is removed once that rank is gone,
within the settle time, instead of being left behind (seen once in CI: one segment of a
failed 3-rank job)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from launch.cleanup import SHM_DIR, remove_stale_segments, stale_segments

_HOLD = """
import mmap, sys, time
with open(sys.argv[1], "r+b") as fh:
    m = mmap.mmap(fh.fileno(), 4096)
    print("mapped", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _segment() -> str:
    path = SHM_DIR / f"mpich_shm_test_{uuid.uuid4().hex[:8]}_0"
    with open(path, "wb") as fh:
        fh.truncate(4096)
    return str(path)


def _hold(path: str, seconds: float) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, path, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "mapped"
    return child


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
def test_a_segment_still_mapped_by_an_exiting_rank_is_removed_once_it_is_gone() -> None:
    started = time.time()
    path = _segment()
    child = _hold(path, 0.4)
    try:
        t0 = time.monotonic()
        removed, freed = remove_stale_segments(
            started, settle_s=5.0, exiting=lambda: child.poll() is None
        )
        waited = time.monotonic() - t0
        assert not os.path.exists(path), "the segment outlived its last mapping"
        assert removed >= 1 and freed >= 4096
        assert 0.2 < waited < 5.0  # it waited for the holder, not for the whole settle time
    finally:
        child.wait(timeout=10)
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
def test_a_segment_mapped_by_a_live_process_is_never_removed() -> None:
    started = time.time()
    path = _segment()
    child = _hold(path, 30)
    try:
        t0 = time.monotonic()
        remove_stale_segments(started, settle_s=0.3, exiting=lambda: True)
        assert time.monotonic() - t0 < 3.0  # bounded by the settle time
        t0 = time.monotonic()
        remove_stale_segments(started, settle_s=30, exiting=lambda: False)
        assert time.monotonic() - t0 < 3.0  # the job's processes are gone: no waiting
        assert os.path.exists(path)  # another job's memory (or a rank still running)
        assert path not in {str(p) for p in stale_segments(started)}
    finally:
        child.kill()
        child.wait(timeout=10)
        if os.path.exists(path):
            os.unlink(path)
