"""``./dev test TIER ...`` (issue 32): the named tiers only, unknown names refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes
ROOT = Path(__file__).resolve().parents[2]


def _suite(logs: Path, *tiers: str) -> subprocess.CompletedProcess[str]:
    # its own log folder: the suite running this test keeps its logs in logs/test
    env = {**os.environ, "PY": sys.executable, "OMPI_PY": "", "TEST_LOGS": str(logs)}
    return subprocess.run(
        ["bash", "scripts/test.sh", *tiers],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        check=False,
    )


def test_an_unknown_tier_is_refused_naming_the_tiers(tmp_path: Path) -> None:
    proc = _suite(tmp_path / "logs", "unit", "nope")
    assert proc.returncode == 2
    known = "lint unit compile processes fakegpu mpi openmpi jobs examples docs gpu"
    assert f"unknown tier 'nope' (expected any of: {known})" in proc.stderr
    assert "== " not in proc.stdout  # nothing ran


def test_only_the_named_tier_runs(tmp_path: Path) -> None:
    proc = _suite(tmp_path / "logs", "gpu")  # without a GPU its tests skip: a quick tier
    steps = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert steps == ["== gpu"], proc.stdout
    assert "ci: 0 passed, 0 failed" in proc.stdout and proc.returncode == 0, proc.stdout
