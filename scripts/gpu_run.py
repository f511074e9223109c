"""``./dev gpu``: the GPU validation on a lent GPU machine, in tiers under one time budget.

    ./dev gpu                       # tiers 0, 1 and 2, as far as the budget goes
    ./dev gpu --tier 1              # setup, the preflight and the smoke run only
    ./dev gpu gpu-mpi-4 examples    # setup, the preflight, then the steps named
    ./dev gpu --list                # the plan: every step, its tier, cap and what it needs
    python3 scripts/gpu_run.py setup  # the setup alone (scripts/gpu_setup.py)

Tier 0, about 60 s: **setup** (a virtualenv made ``--without-pip`` over the image's Python,
the image's packages and library search paths visible through a ``.pth``, the carried wheels
of ``./dev gpu-wheels`` installed ``--ignore-installed``) and the **preflight**: the real
NVIDIA libraries loaded (paths and versions), the compute mode, MPI at 2 ranks, one kernel
compiled and launched, the NVSHMEM canary at 1 and 2 ranks (NVSHMEM's debug output kept).
Tier 1, at most 180 s: every ``.cu`` compiles for this GPU, the smoke tests
(``pytest -m smoke``: attention on every head-dim path and a backward, at 2 ranks on the one
GPU put with signal, both all-reduce algorithms, the family, a CUDA-graph replay, one
sequence-parallel case, an IPC export/import) and a check that every kernel family of the
runtime launched. Tier 2, what is left: the whole of ``tests/gpu`` at 1, 2 and 4 ranks (less
the smoke tests already run), the examples and the benchmarks.

A step runs only when what it needs passed: a failed NVSHMEM canary skips the NVSHMEM steps,
not the single-process ones. It is capped by its own limit, its tier's and the budget's
(``GPU_BUDGET_S``, default 400 s, so the machine's start plus one command stays under nine
minutes; give the device call ``timeout_s`` = budget + 60). pytest steps stop a test after
60 s and the step after 5 failures. What the budget cut is listed, for a second call to name.

Evidence in ``$OUT`` (at most 8 files, all rewritten after every step, so a command killed at
its limit still returns them): ``summary.txt`` (a line per step), ``env.txt`` (nvidia-smi,
uname, driver, CUDA, NVSHMEM, packages, the libraries loaded and their paths),
``console.log``, ``tests.tsv`` (test id, ranks, outcome, seconds), ``bench.jsonl``,
``nvshmem-canary.log`` (NVSHMEM_DEBUG=INFO of the 2-rank canary) and ``gpu-logs.tar.gz``
(every step's and every rank's log). Exit status 0 only when nothing failed.

Environment: ``OUT`` (default ``logs/gpu``), ``GPU_BUDGET_S``, ``GPU_VENV``
(``/tmp/shmem-gpu-venv``), ``GPU_WHEELS`` (``.whl``), ``GPU_SETUP=skip`` (use ``$GPU_VENV``
as it is: the dry run on the fake driver, ``tests/fakegpu/dry_run.sh``).

Standard library only: it runs on the image's Python before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import ci_totals  # noqa: E402  (scripts/ is not a package)
import gpu_setup  # noqa: E402

DEFAULT_BUDGET_S = 400
TIER_WINDOW_S = {0: 60, 1: 180}  # tier 2 has what is left of the budget
RESERVE_S = 8  # kept back for the last bundle
TEST_TIMEOUT_S = 60
MAX_FAILURES = 5
EVIDENCE = (
    "summary.txt",
    "env.txt",
    "console.log",
    "tests.tsv",
    "bench.jsonl",
    "nvshmem-canary.log",
    "gpu-logs.tar.gz",
)


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One command of the run. ``needs``: capabilities that earlier steps must have proved
    (``"ran:NAME"``: step NAME ran, whatever its verdict); ``provides``: the capability this
    step proves when it passes."""

    name: str
    tier: int
    cap_s: int
    needs: tuple[str, ...] = ()
    provides: str = ""
    min_s: int = 20  # not started with less time than this
    ranks: int = 1
    kind: str = "plain"  # plain | pytest | bench
    what: str = ""


STEPS: tuple[Step, ...] = (
    Step("setup", 0, 240, (), "venv", 10, what="venv over the image's Python, carried wheels"),
    Step("pf-versions", 0, 45, ("venv",), "gpu", 10, what="libraries loaded, versions, mode"),
    Step("pf-mpi", 0, 30, ("venv",), "mpi", 10, ranks=2, what="mpiexec starts 2 ranks"),
    Step("pf-kernel", 0, 60, ("gpu",), "kernels", 10, what="a kernel compiles and runs"),
    Step("pf-canary-1", 0, 60, ("kernels", "mpi"), "nvshmem", 10, what="NVSHMEM at 1 rank"),
    Step("pf-canary-2", 0, 60, ("nvshmem",), "nvshmem-ranks", 10, 2, what="NVSHMEM at 2"),
    # first of tier 1: the PTX operations on the GPU against the CPU layer the kernels are
    # tested on in CI (tests/fakegpu/cudacpu), the same inputs (.whl/ptx_expected.npz)
    Step("ptx-probe", 1, 60, ("kernels",), "", 15, what="PTX operations vs the CPU layer"),
    Step("compile", 1, 90, ("gpu",), "cubins", 20, what="every .cu for this GPU"),
    Step("smoke-1proc", 1, 90, ("kernels",), "", 20, kind="pytest", what="device, IPC, MHA"),
    Step("smoke-2ranks", 1, 120, ("nvshmem-ranks",), "", 30, 2, "pytest", "2 ranks, 1 GPU"),
    Step(
        "coverage",
        1,
        30,
        ("cubins", "ran:smoke-1proc", "ran:smoke-2ranks"),
        "",
        5,
        what="every kernel family launched",
    ),
    Step("gpu-mpi-2", 2, 180, ("nvshmem-ranks",), "", 40, 2, "pytest", "tests/gpu at 2"),
    Step("gpu-attention", 2, 120, ("kernels",), "", 30, kind="pytest", what="attention"),
    Step("gpu-1proc", 2, 60, ("kernels",), "", 20, kind="pytest", what="device, IPC"),
    Step("bench-gpu-allreduce", 2, 90, ("kernels",), "", 30, kind="bench", what="vs roofline"),
    Step("bench-gpu-attention", 2, 90, ("kernels",), "", 30, kind="bench", what="vs SDPA"),
    Step("gpu-mpi-4", 2, 240, ("nvshmem-ranks",), "", 60, 4, "pytest", "tests/gpu at 4"),
    Step("gpu-mpi-1", 2, 120, ("nvshmem",), "", 40, 1, "pytest", "tests/gpu at 1"),
    Step("examples", 2, 90, ("nvshmem-ranks",), "", 30, 2, what="examples 01 02 04"),
    Step("bench-gpu-collectives", 2, 150, ("nvshmem",), "", 40, 2, "bench", "family at 1, 2"),
)
BY_NAME = {s.name: s for s in STEPS}


@dataclass
class Result:
    step: Step
    verdict: str  # passed | failed | timed out | skipped
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Clock:
    """The budget's arithmetic, in seconds since the run began (``now`` is injectable)."""

    budget_s: float
    now: Callable[[], float] = time.monotonic
    start: float = field(default=0.0)
    tier_start: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start = self.now()

    def elapsed(self) -> float:
        return self.now() - self.start

    def limit_for(self, step: Step) -> float:
        """Seconds this step may run now: its cap, its tier's window (counted from when the
        tier's first step started) and the budget less the reserve, the smallest."""
        t = self.elapsed()
        self.tier_start.setdefault(step.tier, t)
        window = TIER_WINDOW_S.get(step.tier)
        tier_left = self.tier_start[step.tier] + window - t if window else float("inf")
        return min(step.cap_s, tier_left, self.budget_s - RESERVE_S - t)


def decide(step: Step, clock: Clock, results: Sequence[Result]) -> tuple[float, str]:
    """``(limit, "")`` to run ``step`` now, or ``(0, reason)`` to skip it."""
    proved = {r.step.provides for r in results if r.verdict == "passed" and r.step.provides}
    ran = {r.step.name for r in results if r.verdict != "skipped"}
    for need in step.needs:
        if need.startswith("ran:"):
            if need[4:] not in ran:
                return 0, f"needs {need[4:]} to have run"
        elif need not in proved:
            who = [s.name for s in STEPS if s.provides == need]
            return 0, f"needs {need} ({', '.join(who)} did not pass)"
    limit = clock.limit_for(step)
    if limit < step.min_s:
        return 0, f"time budget: {max(limit, 0):.0f} s left for it, needs {step.min_s} s"
    return limit, ""


def selected_steps(names: Sequence[str], max_tier: int) -> list[Step]:
    """Tier 0 always; then the steps named, or every step up to ``max_tier``."""
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(
            f"gpu_run: unknown step(s) {unknown} (expected some of: "
            f"{', '.join(s.name for s in STEPS if s.tier > 0)})"
        )
    chosen = set(names)
    return [s for s in STEPS if s.tier == 0 or (s.name in chosen if names else s.tier <= max_tier)]


# -- running steps ----------------------------------------------------------------------------


@dataclass
class Run:
    out: Path
    logs: Path
    py: str
    clock: Clock
    console: TextIO
    smoke_ran: set[str] = field(default_factory=set)
    results: list[Result] = field(default_factory=list)
    header: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.console.write(line + "\n")
        self.console.flush()


def pytest_args(name: str, logs: Path, *paths: str, marks: str = "") -> list[str]:
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no"]
    args += [f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=thread", f"--maxfail={MAX_FAILURES}"]
    args += [f"--junitxml={logs / (name + '.xml')}", "-o", "junit_family=xunit2"]
    if marks:
        args += ["-m", marks]
    return [*args, *paths]


def launched(run: Run, name: str, ranks: int, limit: float, *args: str) -> list[str]:
    """``python -m launch`` of ``args`` at ``ranks`` ranks sharing the GPU, one log per rank."""
    return [
        run.py, "-m", "launch", "-n", str(ranks), "--allow-gpu-sharing",
        "--timeout", str(max(int(limit) - 5, 5)), "--log-dir", str(run.logs / f"{name}.ranks"),
        *args,
    ]  # fmt: skip


def command(run: Run, step: Step, limit: float) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of ``step``."""
    py, logs, name = run.py, run.logs, step.name
    trace = {"TESTS_KERNEL_TRACE": str(logs / "kernel-trace")}
    one_process = (
        "tests/gpu/test_device_gpu.py",
        "tests/gpu/test_gpu_ipc.py",
        "tests/gpu/test_kernels_gpu.py",
    )
    attention = "tests/gpu/test_attention_gpu.py"
    ranks_tests = "tests/gpu/test_nvshmem_ranks.py"
    if name == "setup":
        return [sys.executable, str(ROOT / "scripts" / "gpu_setup.py")], {}
    if name == "pf-versions":
        return [py, "scripts/gpu_preflight.py", "versions", "--json", str(logs / "env.json")], {}
    if name == "pf-mpi":
        code = (
            "from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.Get_size() == 2; "
            "print(c.Get_rank(), 'of 2 ok:', MPI.Get_library_version().splitlines()[0])"
        )
        return [str(Path(py).parent / "mpiexec"), "-n", "2", py, "-c", code], {}
    if name == "pf-kernel":
        return [py, "examples/03_device_context.py", "cuda:0"], {}
    if name.startswith("pf-canary-"):
        env = {"NVSHMEM_DEBUG": "INFO"} if step.ranks > 1 else {}
        return launched(run, name, step.ranks, limit, "scripts/gpu_preflight.py", "canary"), env
    if name == "ptx-probe":
        expected = ROOT / ".whl" / "ptx_expected.npz"  # (./dev gpu-wheels)
        return [py, "scripts/gpu_ptx_probe.py", "compare", str(expected)], {}
    if name == "compile":
        return [py, "scripts/gpu_preflight.py", "compile", str(logs / "kernel-families.json")], {}
    if name == "smoke-1proc":
        return [py, *pytest_args(name, logs, *one_process, attention, marks="smoke")], trace
    if name == "smoke-2ranks":
        args = pytest_args(name, logs, ranks_tests, marks="smoke")
        return launched(run, name, 2, limit, *args, "--only-mpi"), trace
    if name == "coverage":
        families = str(logs / "kernel-families.json")
        return [
            py,
            "scripts/gpu_preflight.py",
            "coverage",
            families,
            trace["TESTS_KERNEL_TRACE"],
        ], {}
    if name.startswith("gpu-mpi-"):
        marks = "not smoke" if step.ranks == 2 and "smoke-2ranks" in run.smoke_ran else ""
        args = pytest_args(name, logs, ranks_tests, marks=marks)
        return launched(run, name, step.ranks, limit, *args, "--only-mpi"), {}
    if name in ("gpu-1proc", "gpu-attention"):
        paths = one_process if name == "gpu-1proc" else (attention,)
        marks = "not smoke" if "smoke-1proc" in run.smoke_ran else ""
        return [py, *pytest_args(name, logs, *paths, marks=marks)], {}
    out = str(logs / f"{name}.jsonl")
    if name == "bench-gpu-allreduce":
        return [py, "benchmarks/gpu_allreduce.py", "--out", out], {}
    if name == "bench-gpu-attention":
        return [py, "benchmarks/gpu_attention.py", "--out", out], {}
    if name == "bench-gpu-collectives":
        # one rank (NVSHMEM's collectives run there: no LIMITED_MPG), then two sharing the GPU
        script = ["benchmarks/gpu_collectives.py", "--out", out]
        each = max(int(limit) // 2 - 5, 10)
        first = launched(run, f"{name}-1", 1, each + 5, *script)
        second = launched(run, f"{name}-2", 2, each + 5, *script)
        return ["bash", "-c", f"{_q(first)} && {_q(second)}"], {}
    if name == "examples":
        each = max(int(limit) // 3 - 5, 10)
        lines = [
            _q([py, "-m", "launch", "-n", "2", "--allow-gpu-sharing", "--timeout", str(each),
                f"examples/{ex}"])
            for ex in ("01_ring_exchange.py", "02_work_queue.py", "04_allreduce.py")
        ]  # fmt: skip
        return ["bash", "-c", " && ".join(lines)], {"SHMEM_BACKEND": "nvshmem"}
    raise AssertionError(f"gpu_run: no command for step {name}")


def _q(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the launcher, mpiexec, its proxies, ranks)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 4 and int(fields[3]) == sid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(stat.parent.name), signal.SIGKILL)


def execute(
    argv: list[str], env: dict[str, str], log: Path, limit: float, grace_s: float = 10.0
) -> tuple[int, bool]:
    """Run ``argv`` with its output in ``log``; SIGTERM its whole session at ``limit`` (the
    launcher then ends its job), and SIGKILL what is left of it ``grace_s`` later.
    ``(exit status, timed out)``."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **env},
            start_new_session=True,
        )  # fmt: skip
        try:
            return proc.wait(timeout=max(limit, 1)), False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
            kill_session(proc.pid)
            proc.wait()
            return 124, True


_TALLY = re.compile(r"\b\d+ (passed|failed|errors?|skipped)\b.* in [\d.]+s")


def last_line(log: Path) -> str:
    """The step's most telling line: pytest's tally, else the last line that says ok or
    names a problem, else the last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    keys = ("passed", "failed", "error", " ok", "PROBLEM", "MISSING", "WRONG", "no tests")
    for found in (
        next((line for line in reversed(lines) if _TALLY.search(line)), ""),
        next((line for line in reversed(lines) if any(k in line for k in keys)), ""),
        next((line for line in reversed(lines) if line), ""),
    ):
        if found:
            return found[:160]
    return ""


def run_step(run: Run, step: Step) -> Result:
    limit, reason = decide(step, run.clock, run.results)
    if reason:
        run.say(f"== {step.name}: skipped ({reason})")
        return Result(step, "skipped", 0.0, reason)
    argv, env = command(run, step, limit)
    run.say(f"== {step.name} (tier {step.tier}, limit {limit:.0f} s): {_q(argv)[:300]}")
    log = run.logs / f"{step.name}.log"
    t0 = time.monotonic()
    rc, timed_out = execute(argv, env, log, limit)
    seconds = time.monotonic() - t0
    detail = last_line(log)
    if step.kind == "pytest" and rc == 5:
        detail = "no tests collected: " + detail
    if step.name.startswith("smoke-"):
        run.smoke_ran.add(step.name)
    verdict = "passed" if rc == 0 else ("timed out" if timed_out else "failed")
    run.say(f"   {verdict} in {seconds:.0f} s (exit {rc})  {detail}")
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
        for line in tail:
            run.say(f"   | {line}")
    return Result(step, verdict, seconds, detail)


# -- evidence ---------------------------------------------------------------------------------


def write_summary(run: Run, skipped_for_time: list[str]) -> None:
    lines = [*run.header, f"{'tier':<5}{'step':<24}{'verdict':<11}{'seconds':>8}  detail"]
    for r in run.results:
        lines.append(
            f"{r.step.tier:<5}{r.step.name:<24}{r.verdict:<11}{r.seconds:>8.0f}  {r.detail}"
        )
    failed = [r.step.name for r in run.results if r.verdict in ("failed", "timed out")]
    lines.append(
        f"elapsed {run.clock.elapsed():.0f} s of a {run.clock.budget_s:.0f} s budget; "
        f"failed: {' '.join(failed) or 'none'}; "
        f"cut by the budget: {' '.join(skipped_for_time) or 'none'}"
    )
    (run.out / "summary.txt").write_text("\n".join(lines) + "\n")


def append_tests(run: Run, result: Result) -> None:
    xml = run.logs / f"{result.step.name}.xml"
    if result.step.kind != "pytest" or not xml.exists():
        return
    tsv = run.out / "tests.tsv"
    with tsv.open("a") as f:
        if f.tell() == 0:
            f.write("step\ttest\tranks\toutcome\tseconds\n")
        for test_id, (outcome, seconds) in ci_totals.cases(xml).items():
            f.write(
                f"{result.step.name}\t{test_id}\t{result.step.ranks}\t{outcome}\t{seconds:.2f}\n"
            )


def append_bench(run: Run, result: Result) -> None:
    src = run.logs / f"{result.step.name}.jsonl"
    if result.step.kind == "bench" and src.exists():
        with (run.out / "bench.jsonl").open("a") as f:
            f.write(src.read_text())


def write_env(run: Run) -> None:
    parts = [f"$ uname -a\n{_output(['uname', '-a'])}"]
    parts.append(f"$ nvidia-smi\n{_output(['nvidia-smi'])}")
    query = "name,driver_version,memory.total,compute_mode,compute_cap,clocks.max.sm"
    parts.append(f"$ nvidia-smi --query-gpu={query}\n" + _output(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv"]
    ))  # fmt: skip
    found = run.logs / "env.json"
    if found.exists():
        parts.append("$ scripts/gpu_preflight.py versions --json\n" + found.read_text())
    setup_log = run.logs / "setup.log"
    if setup_log.exists():
        parts.append("$ pip list (the run's venv)\n" + setup_log.read_text())
    (run.out / "env.txt").write_text("\n\n".join(parts) + "\n")


def _output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({argv[0]} did not run: {exc})"


def write_canary_log(run: Run) -> None:
    """NVSHMEM's own debug output of the 2-rank canary: every rank's log, one after another."""
    ranks = sorted((run.logs / "pf-canary-2.ranks").glob("*"))
    with (run.out / "nvshmem-canary.log").open("w") as f:
        if not ranks:
            f.write("(the 2-rank canary left no rank logs)\n")
        for path in ranks:
            if path.is_file():
                f.write(f"==> {path.name} <==\n{path.read_text(errors='replace')}\n")


def bundle(run: Run) -> None:
    with tarfile.open(run.out / "gpu-logs.tar.gz", "w:gz") as tar:
        tar.add(run.logs, arcname="logs")


def evidence(run: Run, result: Result | None) -> None:
    """Everything in $OUT, rewritten now (after every step)."""
    if result is not None:
        append_tests(run, result)
        append_bench(run, result)
        if result.step.name in ("setup", "pf-versions"):
            write_env(run)
        if result.step.name == "pf-canary-2":
            write_canary_log(run)
    cut = [r.step.name for r in run.results if r.detail.startswith("time budget")]
    write_summary(run, cut)
    bundle(run)


# -- main -------------------------------------------------------------------------------------


def git_head() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
        check=False,
    )  # fmt: skip
    return done.stdout.strip() or "?"


def environment(venv: Path) -> None:
    os.environ.setdefault("SHMEM_KERNEL_CACHE", "/tmp/shmem-kernel-cache")
    os.environ.update(SHMEM_REQUIRE_GPU="1", SHMEM_REQUIRE_NVRTC="1", PYTHONUNBUFFERED="1")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (f":{path}" if path else "")
    # one node, one GPU: no remote transport, no NVLS or NCCL (docs/gpu-validation.md)
    for key, value in (
        ("NVSHMEM_REMOTE_TRANSPORT", "none"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
        ("NVSHMEM_DISABLE_NCCL", "1"),
        ("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo"),
    ):
        os.environ.setdefault(key, value)
    os.environ["GPU_VENV"] = str(venv)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("steps", nargs="*", help="tier 1 and 2 steps to run (default: all)")
    ap.add_argument("--tier", type=int, default=2, choices=(0, 1, 2), help="last tier to run")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    args = ap.parse_args(argv)
    if args.steps == ["setup"]:
        return gpu_setup.setup()
    steps = selected_steps(args.steps, args.tier)
    if args.list:
        for s in steps:
            needs = ", ".join(s.needs) or "-"
            print(f"tier {s.tier}  {s.name:<22} cap {s.cap_s:>3} s  needs {needs:<40} {s.what}")
        return 0
    budget = float(os.environ.get("GPU_BUDGET_S", DEFAULT_BUDGET_S))
    out = Path(os.environ.get("OUT", ROOT / "logs" / "gpu")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in EVIDENCE:
        (out / name).unlink(missing_ok=True)
    logs = Path(os.environ.get("GPU_LOGS", "") or _fresh_logs()).resolve()
    logs.mkdir(parents=True, exist_ok=True)
    venv = Path(os.environ.get("GPU_VENV", "/tmp/shmem-gpu-venv"))
    environment(venv)
    with (out / "console.log").open("w") as console:
        run = Run(out, logs, str(venv / "bin" / "python"), Clock(budget), console)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        run.header = [
            f"GPU validation {stamp}, git {git_head()}, budget {budget:.0f} s, "
            f"steps: {' '.join(s.name for s in steps)}"
        ]
        run.say(run.header[0])
        evidence(run, None)
        for step in steps:
            result = run_step(run, step)
            run.results.append(result)
            evidence(run, result)
        bad = [r for r in run.results if r.verdict in ("failed", "timed out")]
        run.say(f"done in {run.clock.elapsed():.0f} s: {len(bad)} step(s) failed; {out}")
        evidence(run, None)
    return 1 if bad else 0


def _fresh_logs() -> str:
    import tempfile

    return str(Path(tempfile.mkdtemp(prefix="shmem-gpu.")) / "logs")


if __name__ == "__main__":
    sys.exit(main())
