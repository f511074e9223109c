"""The fake driver's parameter header (generated from tests/fakegpu/kernel_signatures.py)
compiles with the fake's C: a C compiler, no GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fakegpu import kernel_signatures as table

FAKE = Path(__file__).resolve().parents[1] / "fakegpu"


def test_the_generated_header_compiles_with_the_fake(tmp_path: Path) -> None:
    table.write_header(tmp_path)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    run = subprocess.run(
        [cc, "-fsyntax-only", "-I", str(tmp_path), str(FAKE / "fake_libcuda.c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
