"""A mismatched job seen from outside (issue 40): each rank's line of the mismatch table and
the flight recorder's record of that rank agree (the same call number on the same
communicator, the same operation), in the error the launcher reports, in flight.json and in
the launcher's own flight lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "jobs" / "mismatched.py"
# a table line's call as the flight recorder names the operation
_OPS = {"World.empty": "alloc", "SHMEMBuffer.close": "free"}
_LINE = re.compile(r"^  rank (\d+)(?: \(member \d+\))? in its call (\d+): ([\w.]+)\(", re.M)


@pytest.mark.parametrize("split", ["node", "rank"])
@pytest.mark.parametrize(
    "case", ["collective", "count", "cached", "barrier", "allocation", "attention"]
)
def test_the_table_and_the_flight_recorder_agree(tmp_path: Path, case: str, split: str) -> None:
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "launch", "-n", "3", "--timeout", "90", "--log-dir", str(logs)]
    env = {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split, "SHMEM_BACKEND": "host"}
    proc = subprocess.run(
        [*cmd, str(JOB), case],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    error = json.loads(next(logs.glob("rank.*.error.json")).read_text())
    assert error["exception"].startswith("CollectiveMismatchError: "), error["exception"]
    table = {int(r): (int(n), name) for r, n, name in _LINE.findall(error["exception"])}
    assert sorted(table) == [0, 1, 2], error["exception"]
    rings = json.loads((logs / "flight.json").read_text())["rings"]
    for rank, (call, name) in table.items():
        failed = [rec for rec in rings[str(rank)]["records"] if rec["state"] == "failed"]
        assert failed, (rank, rings[str(rank)])
        last = failed[-1]
        assert (last["op"], last["seq"]) == (_OPS.get(name, name), call), (rank, last)
        # the launcher's own line for the rank names the same call
        assert f"rank {rank}: " in proc.stderr
        assert re.search(rf"rank {rank}: .*failed in {last['op']} #{call}\b", proc.stderr), (
            proc.stderr[-3000:]
        )
    names = {name for _, name in table.values()}
    assert len(names) == (1 if case in ("count", "cached", "allocation") else 2), table
