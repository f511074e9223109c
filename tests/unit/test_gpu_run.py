"""scripts/gpu_run.py (``./dev gpu``): the plan, the budget's arithmetic, the dependencies
between steps, the kill at a step's limit, and the carried wheels' pins."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import ROOT, load_script

gpu_run = load_script("gpu_run")
gpu_setup = load_script("gpu_setup")


class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def results(**verdicts: str) -> list[object]:
    return [gpu_run.Result(gpu_run.BY_NAME[n.replace("_", "-")], v) for n, v in verdicts.items()]


def test_a_failed_nvshmem_canary_stops_only_the_nvshmem_steps() -> None:
    clock = gpu_run.Clock(400, FakeTime())
    done = results(
        setup="passed", pf_versions="passed", pf_mpi="passed", pf_kernel="passed",
        pf_canary_1="failed",
    )  # fmt: skip
    runs = {s.name for s in gpu_run.STEPS if s.tier > 0 and not gpu_run.decide(s, clock, done)[1]}
    assert {"compile", "smoke-1proc", "gpu-attention", "gpu-1proc"} <= runs
    assert {"bench-gpu-allreduce", "bench-gpu-attention"} <= runs
    for name in ("smoke-2ranks", "gpu-mpi-1", "gpu-mpi-2", "gpu-mpi-4", "examples"):
        limit, reason = gpu_run.decide(gpu_run.BY_NAME[name], clock, done)
        assert limit == 0 and "pf-canary" in reason, (name, reason)


def test_a_failed_setup_skips_everything_and_says_why() -> None:
    clock = gpu_run.Clock(400, FakeTime())
    done = results(setup="failed")
    for step in gpu_run.STEPS[1:]:
        assert gpu_run.decide(step, clock, done)[1].startswith("needs"), step.name


def test_coverage_runs_after_failed_smoke_steps_but_not_skipped_ones() -> None:
    clock = gpu_run.Clock(400, FakeTime())
    cov = gpu_run.BY_NAME["coverage"]
    ran = results(compile="passed", smoke_1proc="failed", smoke_2ranks="timed out")
    assert gpu_run.decide(cov, clock, ran)[1] == ""
    skipped = results(compile="passed", smoke_1proc="passed", smoke_2ranks="skipped")
    assert "smoke-2ranks" in gpu_run.decide(cov, clock, skipped)[1]


def test_limits_follow_the_cap_the_tier_window_and_the_budget() -> None:
    now = FakeTime()
    clock = gpu_run.Clock(400, now)
    everything = results(
        setup="passed", pf_versions="passed", pf_mpi="passed", pf_kernel="passed",
        pf_canary_1="passed", pf_canary_2="passed", compile="passed",
    )  # fmt: skip
    now.t += 50  # tier 0 took 50 s
    smoke = gpu_run.BY_NAME["smoke-2ranks"]
    assert gpu_run.decide(smoke, clock, everything)[0] == smoke.cap_s  # tier 1 opens at 50 s
    now.t += 150  # 150 s into tier 1: 30 s of its 180 s window are left
    assert gpu_run.decide(smoke, clock, everything)[0] == pytest.approx(30)
    mpi4 = gpu_run.BY_NAME["gpu-mpi-4"]
    assert gpu_run.decide(mpi4, clock, everything)[0] == pytest.approx(192)  # 400 - 8 - 200
    now.t += 120  # 320 s in: 400 - 8 (reserve) - 320 = 72 s left, gpu-mpi-4 needs 60
    assert gpu_run.decide(mpi4, clock, everything)[0] == pytest.approx(72)
    now.t += 20  # 52 s left: not enough for it
    limit, reason = gpu_run.decide(mpi4, clock, everything)
    assert limit == 0 and reason.startswith("time budget: 52 s left")


def test_the_default_budget_leaves_room_for_the_start_and_a_second_call() -> None:
    start_s = 120  # the machine's start, at worst
    assert start_s + gpu_run.DEFAULT_BUDGET_S <= 9 * 60
    assert gpu_run.TIER_WINDOW_S[0] <= 60 and gpu_run.TIER_WINDOW_S[1] <= 180
    assert gpu_run.TEST_TIMEOUT_S == 60 and gpu_run.MAX_FAILURES == 5
    for step in gpu_run.STEPS:  # one hung test never takes more than its step
        if step.kind == "pytest":
            assert step.cap_s >= gpu_run.TEST_TIMEOUT_S, step.name
    assert len(gpu_run.EVIDENCE) <= 8  # the device tool returns 8 files


def test_steps_named_run_after_tier_0_and_unknown_names_are_refused() -> None:
    picked = [s.name for s in gpu_run.selected_steps(["gpu-mpi-4", "examples"], 2)]
    assert picked[:6] == [s.name for s in gpu_run.STEPS if s.tier == 0]
    assert picked[6:] == ["gpu-mpi-4", "examples"]
    assert [s.tier for s in gpu_run.selected_steps([], 1)][-1] == 1
    with pytest.raises(SystemExit, match=r"unknown step\(s\) \['gpu-mpi-3'\]"):
        gpu_run.selected_steps(["gpu-mpi-3"], 2)


def test_the_tally_line_is_the_steps_detail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(
        "FAILED tests/gpu/a.py::t\n1 failed, 14 passed, 1 skipped in 12.08s\n"
        "launch: job failed; root cause: rank 1\nlaunch: removed 1 segment\n"
    )
    assert gpu_run.last_line(log) == "1 failed, 14 passed, 1 skipped in 12.08s"
    log.write_text("[0] canary ok\n\n")
    assert gpu_run.last_line(log) == "[0] canary ok"


def test_the_venvs_pth_puts_the_image_after_the_venv_and_its_prefixes_in_site() -> None:
    text = gpu_setup.pth_text(["/img/lib/python3.12/site-packages"], ["/img", "/usr"])
    lines = text.splitlines()
    assert lines[0] == "/img/lib/python3.12/site-packages"
    assert lines[1].startswith("import site; ")
    namespace: dict[str, object] = {}
    site = ModuleType("site")
    site.PREFIXES = ["/venv", "/usr"]  # type: ignore[attr-defined]
    sys.modules["site"], saved = site, sys.modules["site"]
    try:
        exec(lines[1], namespace, {})  # as site.addpackage runs it: a local namespace
    finally:
        sys.modules["site"] = saved
    assert site.PREFIXES == ["/venv", "/usr", "/img"]


def test_the_carried_wheels_have_pyprojects_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for req in [
        *project["dependencies"],
        *(r for e in project["optional-dependencies"].values() for r in e),
    ]:
        name, _, version = req.partition("==")
        pins[name.strip().lower()] = version.strip()
    carried = dict(w.split("==") for w in gpu_setup.WHEELS)
    for name in project["dependencies"]:
        dist = name.partition("==")[0]
        if dist != "numpy":  # the image's numpy serves its torch and cupy
            assert dist in carried, f"{dist} is a runtime dependency the image may lack"
    for dist in ("pytest", "pytest-mpi", "pytest-timeout", "cuda-core", "nvshmem4py-cu13"):
        assert dist in carried, dist
    for dist, version in carried.items():
        if dist in pins:
            assert version == pins[dist], (dist, version, pins[dist])


def test_the_fake_gpu_tier_runs_the_nvshmem4py_the_gpu_run_carries() -> None:
    """CI's fake-GPU tier and a lent GPU run the same nvshmem4py (./dev installs the gpu
    extra's pin; the GPU run carries scripts/gpu_setup.py's WHEELS)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("nvshmem4py-cu13")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvshmem4py is not installed here (./dev venv installs it)")
    assert f"nvshmem4py-cu13=={version}" in gpu_setup.WHEELS, (version, gpu_setup.WHEELS)
