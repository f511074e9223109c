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


def fake_env(tmp_path: Path) -> dict[str, str]:
    """Build the fake libcuda into ``tmp_path`` and return the environment that loads it
    (skips without a C compiler or cuda.core)."""
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
    env.pop("SHMEM_REQUIRE_GPU", None)
    return env


def run_on_the_fake(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` of tests/fakegpu with ``args``, one rank under the launcher, on the fake
    driver built into ``tmp_path``."""
    cmd = [sys.executable, "-m", "launch", "-n", "1", "--timeout", "240", str(FAKE / script)]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=fake_env(tmp_path),
        cwd=ROOT,
        check=False,
    )


def test_gpu_paths_run_end_to_end_on_the_fake_driver(tmp_path: Path) -> None:
    run = run_on_the_fake(tmp_path, "run_nvshmem_paths.py")
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


# tests/gpu tests the fake cannot host: torch built without CUDA here, and the ten
# sequence-parallel cases (two minutes of emulated kernels: run_gpu_tests.py runs them by hand)
_NOT_ON_THE_FAKE = "not torch and not sequence_parallel_equals_one_gpu and not shared_with_torch"


@pytest.mark.parametrize(
    ("files", "mpi"),
    [
        (
            [
                "tests/gpu/test_attention_gpu.py",
                "tests/gpu/test_device_gpu.py",
                "tests/gpu/test_gpu_ipc.py",  # two processes: the fake's IPC pools are memfds
            ],
            False,
        ),
        (["tests/gpu/test_nvshmem_ranks.py"], True),
    ],
    ids=["one-process", "one-rank"],
)
def test_the_gpu_tests_pass_on_the_fake_driver(tmp_path: Path, files: list[str], mpi: bool) -> None:
    """The GPU tier's own code (arguments, references, tolerances) at one rank on the fake
    driver, so a GPU run does not spend its time on a stale test."""
    mpi_only = ["--only-mpi"] if mpi else []
    run = run_on_the_fake(tmp_path, "run_gpu_tests.py", *mpi_only, "-k", _NOT_ON_THE_FAKE, *files)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert " passed" in output and " failed" not in output, output[-4000:]
