"""A rank that stops making progress (issue 33): the launcher names it as the root cause, not
a rank that timed out waiting for it, says what it was doing and what every rank's flight
recorder holds; ``--stall-timeout`` ends a job stalled where no call has a deadline."""

from __future__ import annotations

import json
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

# what rank 1's state and stack show, by mode (its stack points at stall.py's line for it; a
# spin is caught on either line of its loop: the signal is handled where the loop jumps back)
DOING = {
    "stop": (r"stopped \(SIGSTOP", None),
    "spin": (r"running on a CPU", "n += 1"),
    "sleep": (r"sleeping in the kernel", "time.sleep(600)"),
    "lock": (r"sleeping in the kernel", "a deadlock: never returns"),
}


def _line_of(text: str) -> int:
    return next(i for i, ln in enumerate(JOB.read_text().splitlines(), 1) if text in ln)


def _stack_at(frame: str) -> str:
    """A pattern for rank 1's stack at ``frame``'s line (for the spin: either line of its
    loop)."""
    lines = {_line_of(frame)}
    if frame == "n += 1":
        lines.add(_line_of("while True:"))
    return rf'stall_job\.py", line ({"|".join(map(str, sorted(lines)))}) in stall'


def _run(
    tmp_path: Path,
    n: int,
    mode: str,
    where: str,
    split: str,
    launch: tuple[str, ...] = (),
    job: tuple[str, ...] = (),
    code: int = 1,
) -> tuple[str, float]:
    event = tmp_path / "event"
    cmd = [sys.executable, "-m", "launch", "-n", str(n), "--timeout", "60", *launch]
    cmd += [str(JOB), mode, where, str(event), *job]
    env = {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split, "SHMEM_BACKEND": "host"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
    )
    assert proc.returncode == code, proc.stderr[-4000:]
    return proc.stderr, time.time() - float(event.read_text())


# every way to stall and both paths once, in five jobs (scripts/faults.py --stalls runs the
# whole matrix: 4 ways x 7 places x 2, 3, 4 ranks x both paths)
CASES = [
    ("stop", 3, "all_reduce", "node"),
    ("lock", 3, "family", "node"),
    ("sleep", 2, "all_reduce", "rank"),  # the MPI exchange between nodes: the board names it
    ("spin", 4, "barrier", "rank"),  # the dissemination barrier: waits in chains
    ("sleep", 3, "wait_until", "node"),  # a wait that names nobody: the flight recorder does
]


@pytest.mark.parametrize(("mode", "n", "where", "split"), CASES)
def test_the_stalled_rank_is_the_root_cause(
    tmp_path: Path, mode: str, n: int, where: str, split: str
) -> None:
    err, took = _run(tmp_path, n, mode, where, split, job=("--signal-timeout", "2"))
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
        assert re.search(_stack_at(frame), err), err[-4000:]
    assert re.search(r"timed out waiting for rank 1: rank \d .*SignalTimeoutError", err), err
    # the 2 s signal timeout, the 1 s look at rank 1 and the wait for a chain's records
    assert took < 2.0 + 4.0, f"the report came {took:.1f} s after the stall"
    # the flight recorder's lines: rank 1 stopped after its 20th call, the others in the 21st
    if where == "all_reduce" and split == "node":
        others = " and ".join(str(r) for r in range(n) if r != 1).replace(" and ", ", ", n - 3)
        assert re.search(
            rf"rank 1 last completed all_reduce #20; ranks {others} are in all_reduce #21 since",
            err,
        ), err[-3000:]
        assert re.search(r"rank 1: last completed all_reduce #20; in no recorded call", err)
    if where == "wait_until":
        assert "it never arrived at their call, says the flight recorder" in err, err[-3000:]


def test_a_stall_where_no_call_has_a_deadline_ends_at_the_stall_timeout(tmp_path: Path) -> None:
    """Rank 1 spins before its first all-reduce; the others wait with a 60 s deadline:
    ``--stall-timeout 2`` ends the job, names rank 1 and keeps every ring in flight.json."""
    logs = tmp_path / "logs"
    err, took = _run(
        tmp_path,
        3,
        "spin",
        "all_reduce",
        "node",
        launch=("--stall-timeout", "2", "--log-dir", str(logs)),
        job=("--at", "1", "--signal-timeout", "60"),
        code=125,
    )
    assert re.search(
        r"launch: job stalled: no rank completed a recorded call for 2 s \(--stall-timeout 2\); "
        r"root cause: rank 1 of 3 on \S+ \(pid \d+\) stalled: it never arrived at "
        r"all_reduce #1, which rank\(s\) 0, 2 wait in",
        err,
    ), err[-4000:]
    assert "what rank 1 was doing: running on a CPU" in err, err[-4000:]
    assert re.search(_stack_at("n += 1"), err), err[-4000:]
    assert took < 2.0 + 3.0, f"the report came {took:.1f} s after the stall"
    doc = json.loads((logs / "flight.json").read_text())
    assert doc["never_arrived"] == [1] and doc["waiting"] == [0, 2]
    assert doc["target"]["op"] == "all_reduce" and doc["target"]["seq"] == 1
    assert {r["op"] for r in doc["rings"]["1"]["records"]} >= {"init", "barrier"}
    assert json.loads((logs / "stall.json").read_text())["after_s"] == 2.0


def test_ranks_blocked_in_their_own_mpi_calls_end_at_the_stall_timeout(tmp_path: Path) -> None:
    """Every rank in the user's own MPI_Barrier (rank 1 asleep before it): nothing has a
    deadline; the stall timeout ends the job with every rank's state and stacks."""
    err, took = _run(tmp_path, 3, "sleep", "mpi", "node", launch=("--stall-timeout", "2"), code=125)
    assert (
        "no rank is behind the others: no rank is in a recorded call (every rank is in its "
        "own code)" in err
    ), err[-4000:]
    lines = JOB.read_text().splitlines()
    barrier = next(i for i, ln in enumerate(lines, 1) if ln.strip() == "MPI.COMM_WORLD.Barrier()")
    for r in (0, 2):  # their stacks show the user's MPI call
        assert re.search(rf"what rank {r} was doing: ", err), err[-4000:]
    assert err.count(f'stall_job.py", line {barrier} in main') >= 2, err[-4000:]
    assert "what rank 1 was doing: sleeping in the kernel" in err
    assert took < 30.0
