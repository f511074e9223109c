"""Bugs planted in the real kernels are caught (tests/fakegpu/planted.py; the layer's README):
the mutated kernel runs through the product's own GPU code on the fake driver, built for the
CPU, and a named test of tests/gpu fails; the release bug is caught by ThreadSanitizer on
the all-reduce's stage protocol. Without a bug the same tests pass (the other fakegpu tests
run them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakegpu import build, planted
from tests.fakegpu.test_fake_gpu_paths import FAKE, ROOT, fake_env

pytestmark = pytest.mark.fakegpu

FORWARD = "tests/gpu/test_attention_gpu.py::test_forward_matches_float64_and_the_host"

# bug -> the tests of tests/gpu/test_attention_gpu.py that must fail with it (the case ids
# of test_forward_matches_float64_and_the_host on the path the bug is in)
CAUGHT = {
    "mma-lane-swap": ("bfloat16", "float16"),
    "ldmatrix-without-trans": ("bfloat16", "float16"),
    "missing-cp-async-wait": ("bfloat16", "float16"),
    "missing-syncthreads": ("float32",),
}


@pytest.mark.parametrize("bug", sorted(CAUGHT))
def test_a_planted_kernel_bug_fails_a_named_test(tmp_path: Path, bug: str) -> None:
    env = {
        **fake_env(tmp_path),
        "PLANTED_BUG": bug,
        # no NVRTC: the mutated source's "cubin" only names it (fake_nvrtc.c), in a cache
        # of this test's own
        "FAKE_NVRTC": "cpu-only",
        "SHMEM_KERNEL_CACHE": str(tmp_path / "kernels"),
        "FAKE_KERNEL_SOURCES": str(tmp_path / "kernels" / "sources"),
    }
    run = subprocess.run(
        [sys.executable, str(FAKE / "run_gpu_tests.py"), "-x", "-q", "-k", "not torch", FORWARD],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    failed = re.findall(r"^FAILED (\S+)", output, re.M)
    assert failed, output[-4000:]
    # the first case on the bug's path fails (-x stops there), and it fails on the numbers
    assert failed[0].startswith(FORWARD) and any(
        f"[{dtype}-" in failed[0] for dtype in CAUGHT[bug]
    ), failed
    assert "Mismatched elements" in output or "Max absolute difference" in output, output[-4000:]
    print(f"{bug} ({planted.BUGS[bug].what}): {failed[0]}")


def test_a_flag_stored_without_release_is_a_race_thread_sanitizer_reports(
    tmp_path: Path,
) -> None:
    """tsan_allreduce runs the one-shot all-reduce's stages across the blocks of one
    launch: clean on the real kernel, a data race with the stage flag stored plainly and
    no fence. (x86 orders that store before the flag anyway: only the memory model catches
    it, and only between the blocks of one process, not between processes.)"""
    found = build.compilers()
    if found is None:
        pytest.skip("no C++ compiler")
    layer = ROOT / "tests" / "fakegpu" / "cudacpu"
    exe = tmp_path / "tsan_allreduce"
    subprocess.run(
        [found[1], "-std=c++20", "-O0", "-fsanitize=thread", "-rdynamic",
         f'-DCUDACPU_INCLUDE_DIR="{layer}"', "-I", str(layer), str(layer / "runtime.cpp"),
         str(layer / "tsan_allreduce.cpp"), "-o", str(exe), "-ldl", "-lpthread"],
        check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from shmem.device.cuda.nvrtc import source_of

    src = source_of(planted.ALLREDUCE)
    env = {**os.environ, "CUDACPU_CACHE": str(tmp_path / "modules")}
    results = {}
    for name, text in (
        ("real", src),
        ("bug", planted.mutated("flag-without-release", planted.ALLREDUCE, src)),
    ):
        path = tmp_path / f"{name}.cu"
        path.write_text(text)
        run = subprocess.run(
            [str(exe), str(path)], capture_output=True, text=True, timeout=600, env=env,
            check=False,
        )  # fmt: skip
        results[name] = (run.returncode, run.stdout + run.stderr)
    rc, out = results["real"]
    assert rc == 0 and "tsan_allreduce ok" in out and "ThreadSanitizer" not in out, out[-3000:]
    rc, out = results["bug"]
    assert rc == 66 and "WARNING: ThreadSanitizer: data race" in out, out[-3000:]
    assert re.search(r"#\d+ (arrive|wait_for)\(Sync const&", out), out[-3000:]
    print("flag-without-release:", next(line for line in out.splitlines() if "SUMMARY" in line))
