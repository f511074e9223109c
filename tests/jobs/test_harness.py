"""The MPI test harness: agreed verdicts, and no hang when one rank fails alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "jobs" / "harness_cases.py"


def run_cases(selector: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "SHMEM_TEST_FAILED_RANK_TIMEOUT_S": "2"}
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-n",
            "3",
            "--timeout",
            "60",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--color=no",
            "-q",
            "--only-mpi",
            "--timeout=30",
            "--timeout-method=thread",
            f"{CASES}::{selector}" if selector else str(CASES),
            *(["-k", "not before_a_collective"] if not selector else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )
    return proc, time.monotonic() - start


def test_a_failure_on_one_rank_fails_the_test_everywhere() -> None:
    proc, _ = run_cases("")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed on rank(s) [1]" in proc.stdout
    assert "---- rank 1 of 3 ----" in proc.stdout and "rank 1 disagrees" in proc.stdout
    assert "1 failed, 1 passed" in proc.stdout  # and the next test ran in step


def test_a_rank_failing_before_a_collective_does_not_hang_the_job() -> None:
    proc, elapsed = run_cases("test_rank_1_fails_before_a_collective")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert elapsed < 30, "ended by the harness deadline, not by a timeout"
    assert "root cause: rank 1 of 3" in proc.stderr
    assert "did not reach the verdict" in proc.stderr or "got no verdict" in proc.stderr
    assert "rank 1 gave up before the collective" in proc.stderr
