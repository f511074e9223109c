"""Every example runs through the real launcher and prints its success line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.examples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
EXPECT = {
    "01_ring_exchange.py": "ring exchange ok",
    "02_work_queue.py": "work queue ok: 200 tasks",
    "03_device_context.py": "device context ok on cpu:0",
    "04_allreduce.py": "all-reduce ok",
    "05_stencil_2d.py": "stencil ok",
    "06_torch_ddp.py": "ddp ok: 3 ranks, identical weights; sequence-parallel attention ok",
    "tour.py": "steps passed",
}


def test_every_example_is_listed() -> None:
    assert {p.name for p in EXAMPLES} == set(EXPECT)


# the stencil also at 4 ranks: a 2 x 2 grid, where the strided column halos, east/west
# neighbours and row teams of more than one rank run (3 ranks make one column)
CASES = [(p, 3) for p in EXAMPLES] + [(ROOT / "examples" / "05_stencil_2d.py", 4)]


@pytest.mark.parametrize("split", ["node", "rank"])
@pytest.mark.parametrize(("path", "ranks"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_example_runs(path: Path, ranks: int, split: str) -> None:
    env = {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split, "SHMEM_HEAP_NBYTES": "64MiB"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch", "-n", str(ranks), "--timeout", "120", str(path)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert EXPECT[path.name] in proc.stdout
    # a newcomer's console shows no warning that looks like the library's (issue 44: the
    # tour's timing loops overflowed float32 in place)
    assert "Warning" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
