"""The symheap torch.distributed backend in whole jobs (issue 31): a rank that raises, dies
or stalls ends every rank within seconds, naming that rank, never after torch's 30-minute
default; ``init_process_group(timeout=)`` is every wait's deadline; the launcher sets what
torch's ``env://`` init reads."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.jobs

JOBS = Path(__file__).resolve().parent / "jobs"
ROOT = Path(__file__).resolve().parents[2]


def _launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    cmd = [sys.executable, "-m", "launch", "-n", "3", "--timeout", "60", "--console", "all", *args]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize("split", ["node", "rank"])
@pytest.mark.parametrize(
    ("mode", "code", "cause"),
    [
        ("raise", 1, r"root cause: rank 1 of 3 .*ValueError: injected failure in the training"),
        ("kill", 137, r"root cause: rank 1 of 3 .*died first: killed by signal 9 \(SIGKILL\)"),
    ],
)
def test_a_failing_rank_ends_a_torch_job_at_once(
    tmp_path: Path, split: str, mode: str, code: int, cause: str
) -> None:
    event = tmp_path / "event"
    proc = _launch(
        str(JOBS / "torch_faulty.py"), mode, str(event), env={"SHMEM_HEAP_NODE_SPLIT": split}
    )
    end = time.time()
    assert proc.returncode == code, proc.stderr[-3000:]
    assert re.search(cause, proc.stderr), proc.stderr[-3000:]
    assert end - float(event.read_text()) < 5.0, "the job ends within 5 s of the failure"
    assert "done" not in proc.stdout


def test_init_timeout_is_the_deadline(tmp_path: Path) -> None:
    event = tmp_path / "event"
    proc = _launch(str(JOBS / "torch_faulty.py"), "hang", str(event), "3")
    end = time.time()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(r"timed out after 3 s waiting for rank 1", proc.stderr), proc.stderr[-3000:]
    assert end - float(event.read_text()) < 10.0, "a 3 s timeout, not torch's 30 minutes"


def test_a_clean_torch_job_and_its_environment(tmp_path: Path) -> None:
    proc = _launch(str(JOBS / "torch_faulty.py"), "ok", str(tmp_path / "event"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) done: (\S+)", proc.stdout)) == [
        (str(r), "3.0") for r in range(3)
    ], proc.stdout
    proc = _launch(str(JOBS / "torch_faulty.py"), "env", "-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sorted(m.split() for m in re.findall(r"ENV (.*)", proc.stdout))
    assert [r[:4] for r in rows] == [[str(r), "3", str(r), "3"] for r in range(3)]
    assert len({(r[4], r[5]) for r in rows}) == 1 and int(rows[0][5]) > 0
    proc = _launch(
        str(JOBS / "torch_faulty.py"), "env", "-", env={"MASTER_PORT": "29999", "RANK": "7"}
    )
    rows = [m.split() for m in re.findall(r"ENV (.*)", proc.stdout)]
    assert len(rows) == 3 and all(r[0] == "7" and r[5] == "29999" for r in rows), proc.stdout
