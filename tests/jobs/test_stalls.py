"""A rank that stops making progress (issue 33): the launcher names it as the root cause, not
a rank that timed out waiting for it, and says what it was doing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "scripts" / "stall_job.py"

# what rank 1's state and stack show, by mode (its stack points at stall.py's line for it)
DOING = {
    "stop": (r"stopped \(SIGSTOP", None),
    "spin": (r"running on a CPU", "n += 1"),
    "sleep": (r"sleeping in the kernel", "time.sleep(600)"),
    "lock": (r"sleeping in the kernel", "a deadlock: never returns"),
}


def _line_of(text: str) -> int:
    return next(i for i, ln in enumerate(JOB.read_text().splitlines(), 1) if text in ln)


def _run(tmp_path: Path, n: int, mode: str, where: str, split: str) -> tuple[str, float]:
    event = tmp_path / "event"
    cmd = [sys.executable, "-m", "launch", "-n", str(n), "--timeout", "60"]
    cmd += [str(JOB), mode, where, str(event)]
    env = {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split, "SHMEM_BACKEND": "host"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    return proc.stderr, time.time() - float(event.read_text())


# every way to stall and every place and path once, in four jobs (scripts/faults.py --stalls
# runs the whole matrix: 4 ways x 2 places x 2, 3, 4 ranks x both paths)
CASES = [
    ("stop", 3, "all_reduce", "node"),
    ("lock", 3, "all_reduce", "node"),
    ("sleep", 2, "all_reduce", "rank"),  # the MPI exchange between nodes: the board names it
    ("spin", 4, "barrier", "rank"),  # the dissemination barrier: waits in chains
]


@pytest.mark.parametrize(("mode", "n", "where", "split"), CASES)
def test_the_stalled_rank_is_the_root_cause(
    tmp_path: Path, mode: str, n: int, where: str, split: str
) -> None:
    err, took = _run(tmp_path, n, mode, where, split)
    head = re.search(
        r"root cause: rank (\d+) of \d+ on \S+ \(pid \d+\) stalled: "
        r"rank\(s\) ([\d, ]+) timed out waiting for it",
        err,
    )
    assert head, err[-4000:]
    assert head.group(1) == "1", err[-4000:]
    state, frame = DOING[mode]
    assert re.search(r"what rank 1 was doing: " + state, err), err[-4000:]
    if frame is not None:  # its own stack, at the line that stalls
        assert f'stall_job.py", line {_line_of(frame)} in stall' in err, err[-4000:]
    assert re.search(r"timed out waiting for rank 1: rank \d .*SignalTimeoutError", err), err
    # the 3 s signal timeout, the 1 s look at rank 1 and the wait for a chain's records
    assert took < 3.0 + 4.0, f"the report came {took:.1f} s after the stall"
