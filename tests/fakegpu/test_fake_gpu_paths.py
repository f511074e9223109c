"""The nvshmem backend's Python paths, end to end at one rank, on a fake libcuda and a one-PE
nvshmem stand-in (tests/fakegpu/README.md). Skipped without a C compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fakegpu

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakegpu"


def test_gpu_paths_run_end_to_end_on_the_fake_driver(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake libcuda")
    pytest.importorskip("cuda.core")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(FAKE / "fake_libcuda.c"), "-lm"],
        check=True,
        timeout=120,
    )
    (tmp_path / "libcuda.so").symlink_to(lib.name)
    env = {
        **{k: v for k, v in os.environ.items() if k != "TESTS_KERNEL_CACHE"},
        "LD_LIBRARY_PATH": f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        "PYTHONPATH": f"{FAKE}:{ROOT}",
        # the compile tier's cubins when the run shares them (scripts/test.sh)
        "SHMEM_KERNEL_CACHE": os.environ.get("TESTS_KERNEL_CACHE", str(tmp_path / "kernels")),
        "SHMEM_BACKEND": "nvshmem",
    }
    env.pop("FAKE_LOG", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-n",
            "1",
            "--timeout",
            "240",
            str(FAKE / "run_nvshmem_paths.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    summary = [line for line in output.splitlines() if line.startswith("SUMMARY")]
    assert summary and "; 0 failed" in summary[-1], output[-4000:]
    assert "OK   lock: set, test while held" in output and "OK   bitwise atomic" in output
    assert "OK   all_reduce honours check_args" in output, output[-4000:]
    assert "OK   family on the GPU stages" in output, output[-4000:]
    assert "OK   GPU attention backward" in output, output[-4000:]
    assert "OK   GPU attention unit: a query chunk" in output, output[-4000:]
    assert "OK   device fills of every element size" in output, output[-4000:]
    assert "OK   sequence_parallel_attention on the GPU" in output, output[-4000:]
    assert "OK   GPU sequence-parallel folds across segment pairs" in output, output[-4000:]
    assert int(summary[-1].split()[1]) >= 56, summary  # the OpenSHMEM refusals and locks
    for problem in (
        "MISMATCH",
        "PEERFAULT",
        "ARRIVE MISMATCH",
        "ENTRY:",
        "DRAIN:",
        "COUNTERS",
        "DVEC grid",
        "BWD grid",
        "RAGGED with",
        "MERGE grid",
    ):
        assert problem not in output, output[-4000:]
    assert "nvshmem calls: ['get_unique_id', 'init', 'buffer', 'barrier_all'" in output
    assert "'free', 'finalize']" in output
