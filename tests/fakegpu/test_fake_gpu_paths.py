"""The nvshmem backend's Python paths, end to end, through the real nvshmem4py on a fake
libcuda and a stand-in NVSHMEM library (tests/fakegpu/README.md). Skipped without a C
compiler."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.fakegpu import build

pytestmark = pytest.mark.fakegpu

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakegpu"


def fake_build() -> Path:
    """The fake GPU's libraries (tests/fakegpu/build.py), built once into ``FAKEGPU_BUILD``
    (scripts/test.sh sets it) or logs/fakegpu; skips without a C and a C++ compiler."""
    if build.compilers() is None:
        pytest.skip("no C and C++ compiler to build the fake libcuda and the CPU layer")
    pytest.importorskip("cuda.core")
    return build.build(os.environ.get("FAKEGPU_BUILD") or ROOT / "logs" / "fakegpu")


def fake_env(tmp_path: Path) -> dict[str, str]:
    """The environment that runs a process on the fake GPU: its libraries, the recording
    NVRTC, and the compile tier's cubins when the run shares them (``TESTS_KERNEL_CACHE``,
    scripts/test.sh), else a cache of this test's own."""
    cache = os.environ.get("TESTS_KERNEL_CACHE") or str(tmp_path / "kernels")
    env = {
        **{k: v for k, v in os.environ.items() if k != "TESTS_KERNEL_CACHE"},
        **build.environment(fake_build(), cache),
        "PYTHONPATH": f"{FAKE}:{ROOT}",
        "SHMEM_BACKEND": "nvshmem",
    }
    env.pop("FAKE_LOG", None)
    env.pop("SHMEM_REQUIRE_GPU", None)
    return env


def run_on_the_fake(
    tmp_path: Path,
    script: str,
    *args: str,
    ranks: int = 1,
    gpus: int = 2,
    streams: str = "",
    children: bool = False,
    nodes: str = "",
) -> subprocess.CompletedProcess[str]:
    """``script`` (of tests/fakegpu, or a path from the repository root) with ``args``,
    ``ranks`` ranks under the launcher, on the fake driver built into ``tmp_path`` with
    ``gpus`` devices (1: the lent machine, where ranks share the GPU and NVSHMEM runs in
    LIMITED_MPG mode). ``streams="lazy"``: queued work runs only when something waits for it
    (fake_async.h), so a missing wait fails. ``children``: every Python process takes the
    fake (``FAKEGPU_DRIVER=1``), not only run_gpu_tests.py. ``nodes``: the NVSHMEM stand-in
    puts the ranks on that many simulated nodes (``rank``: each its own; K: K consecutive
    ranks a node), and the World's ``[heap] node_split`` says the same."""
    cmd = [sys.executable, "-m", "launch", "-n", str(ranks), "--timeout", "240"]
    cmd.append(script if "/" in script else str(FAKE / script))
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **fake_env(tmp_path),
            "FAKE_GPUS": str(gpus),
            "FAKE_ASYNC": streams,
            **({"FAKEGPU_DRIVER": "1"} if children else {}),
            **({"FAKE_NVSHMEM_NODE_SPLIT": nodes, "SHMEM_HEAP_NODE_SPLIT": nodes} if nodes else {}),
        },
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
    assert "OK   GPU engine calls in the flight recorder" in output, output[-4000:]
    assert "OK   family on the GPU stages" in output, output[-4000:]
    assert "OK   GPU attention backward" in output, output[-4000:]
    assert "OK   GPU attention unit: a query chunk" in output, output[-4000:]
    assert "OK   device fills of every element size" in output, output[-4000:]
    assert "OK   sequence_parallel_attention on the GPU" in output, output[-4000:]
    assert "OK   GPU sequence-parallel folds across segment pairs" in output, output[-4000:]
    assert int(summary[-1].split()[1]) >= 56, summary  # the OpenSHMEM refusals and locks
    for problem in ("MISMATCH", "[cudacpu]", "[fake] launch refused"):
        assert problem not in output, output[-4000:]
    # the real nvshmem4py's calls into the NVSHMEM library (the stand-in records them)
    calls = (
        "['nvshmemx_get_uniqueid', 'nvshmemx_set_attr_uniqueid_args', 'nvshmemx_hostlib_init_attr'"
    )
    assert f"nvshmem calls: {calls}" in output, output[-4000:]
    assert "'nvshmem_free', 'nvshmemx_hostlib_finalize']" in output, output[-4000:]


# tests/gpu tests the fake cannot host: torch built without CUDA here, and the ten
# sequence-parallel cases (two minutes of emulated kernels: run_gpu_tests.py runs them by hand)
_NOT_ON_THE_FAKE = "not torch and not sequence_parallel_equals_one_gpu and not shared_with_torch"


_ONE_PROCESS = [
    "tests/gpu/test_attention_gpu.py",
    "tests/gpu/test_device_gpu.py",
    "tests/gpu/test_gpu_ipc.py",  # two processes: the fake's IPC pools are memfds
    "tests/gpu/test_kernels_gpu.py",
]


@pytest.mark.parametrize(
    ("files", "mpi", "streams"),
    [
        # streams that run their work only when something waits for it: a missing synchronize
        # or cross-stream wait fails every time (fake_async.h), and a run that passes there
        # passes with streams that run at once (collectives-2 below; dry_run.sh)
        (_ONE_PROCESS, False, "lazy"),
        (["tests/gpu/test_nvshmem_ranks.py"], True, "lazy"),
    ],
    ids=["one-process-lazy-streams", "one-rank-lazy-streams"],
)
def test_the_gpu_tests_pass_on_the_fake_driver(
    tmp_path: Path, files: list[str], mpi: bool, streams: str
) -> None:
    """The GPU tier's own code (arguments, references, tolerances) at one rank on the fake
    driver, so a GPU run does not spend its time on a stale test; and the host code's
    waits for its streams."""
    mpi_only = ["--only-mpi"] if mpi else []
    args = ("-k", _NOT_ON_THE_FAKE, *files)
    run = run_on_the_fake(tmp_path, "run_gpu_tests.py", *mpi_only, *args, streams=streams)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert " passed" in output and not re.search(r"\d+ failed", output), output[-4000:]


# (every dtype: the kernels run from their own source, tests/fakegpu/cudacpu)
_SEVERAL_RANKS = "not torch"


@pytest.mark.parametrize(
    ("ranks", "gpus", "streams", "select", "at_least"),
    [
        (2, 2, "", f"not sequence_parallel_equals_one_gpu and {_SEVERAL_RANKS}", 150),
        # three ranks on one GPU: LIMITED_MPG, as on the lent machine; streams run their
        # work only when waited for (fake_async.h)
        (3, 1, "lazy", f"not sequence_parallel_equals_one_gpu and {_SEVERAL_RANKS}", 150),
        # four ranks, four GPUs: the all-reduce and reduce-scatter kernels (every float dtype
        # and op, both algorithms, up to 1000 elements: the 1M ones, the fused forms and the
        # other dtypes ran at 2 and 3), mismatches, a rank that never arrives
        (
            4,
            4,
            "",
            "all_reduce_equals_host_semantics and not 1048579 or mismatched or never_arrives",
            80,
        ),
        # four of the ten sequence-parallel cases: at two ranks ring causal, zigzag with
        # documents, dynamic; at three float32 dynamic with its own unit rows (5-20 seconds
        # each; the float16 ones take 20-50: every case by hand, tests/fakegpu/README.md)
        (
            2,
            1,
            "lazy",
            "init_reports_mode or sequence_parallel_equals_one_gpu and (kw0 or kw5 or kw7)",
            4,
        ),
        (
            3,
            1,
            "lazy",
            "init_reports_mode or sequence_parallel_equals_one_gpu and kw8",
            2,
        ),
    ],
    ids=[
        "collectives-2",
        "collectives-3-one-gpu-lazy-streams",
        "collectives-4",
        "sequence-parallel-2-one-gpu-lazy-streams",
        "sequence-parallel-3-one-gpu-lazy-streams",
    ],
)
def test_the_gpu_tests_pass_at_several_ranks_on_the_fake(
    tmp_path: Path, ranks: int, gpus: int, streams: str, select: str, at_least: int
) -> None:
    """tests/gpu/test_nvshmem_ranks.py with several processes: each rank's heap a file every
    rank maps (the nvshmem stand-in), the family's kernels run their cross-rank protocol
    The host side of every multi-rank GPU path: peer pointer tables,
    stages, call signatures, puts into peers' slots, the dynamic queue's atomics; and the
    kernels' own cross-rank protocol, run from their source between the processes."""
    run = run_on_the_fake(
        tmp_path,
        "run_gpu_tests.py",
        "--only-mpi",
        "-s",  # test_init_reports_mode_and_version prints the mode
        "-k",
        select,
        "tests/gpu/test_nvshmem_ranks.py",
        ranks=ranks,
        gpus=gpus,
        streams=streams,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert " passed" in output and not re.search(r"\d+ failed", output), output[-4000:]
    assert "[cudacpu]" not in output and "MISMATCH" not in output, output[-4000:]
    assert ("mode LIMITED_MPG" in output) == (gpus == 1), output[-4000:]
    passed = re.findall(r"(\d+) passed", output)
    assert passed and int(passed[-1]) >= at_least, output[-4000:]  # nothing skipped away


def test_the_gpu_runs_scripts_work_on_the_fake(tmp_path: Path) -> None:
    """What `./dev gpu` runs besides tests/gpu (the preflight canary, the example, the GPU
    benchmarks), on the fake at the ranks it uses there: a script bug must not cost a lent
    GPU's time. Timings here are the fake's, meaningless; the records' fields are checked."""
    out = tmp_path / "out"
    out.mkdir()

    def launched(ranks: int, script: str, *args: str) -> str:
        # every process takes the fake; one GPU, as on the lent machine (LIMITED_MPG at 2)
        run = run_on_the_fake(tmp_path, script, *args, ranks=ranks, gpus=1, children=True)
        output = run.stdout + run.stderr
        assert run.returncode == 0, (script, output[-4000:])
        return output

    assert "canary ok" in launched(2, "scripts/gpu_preflight.py", "canary")
    # the examples ./dev gpu runs on the nvshmem backend
    assert "ring exchange ok: 2 ranks" in launched(2, "examples/01_ring_exchange.py")
    assert "work queue ok: 200 tasks" in launched(2, "examples/02_work_queue.py")
    assert "'gpu_all_gather': 1" in launched(2, "examples/04_allreduce.py")
    launched(
        2, "benchmarks/gpu_collectives.py", "--sizes", "4096", "--repeat", "2",
        "--out", str(out / "collectives.jsonl"),
    )  # fmt: skip
    rows = [json.loads(line) for line in (out / "collectives.jsonl").read_text().splitlines()]
    assert {r["collective"] for r in rows} == {
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "all_to_all",
    }, rows
    assert all(r["ranks"] == 2 and r["ours_us"] > 0 and "copy_fraction" in r for r in rows)
    # NVSHMEM's collectives would exit the process in LIMITED_MPG: refused and recorded
    assert all("LIMITED_MPG" in r.get("nvshmem_error", "") for r in rows), rows
    # float64: the torch peer of the other dtypes needs torch on CUDA
    launched(
        1, "benchmarks/gpu_allreduce.py", "--sizes", "4096", "--repeat", "2", "--ranks", "2",
        "--dtypes", "float64", "--out", str(out / "allreduce.jsonl"),
    )  # fmt: skip
    rows = [json.loads(line) for line in (out / "allreduce.jsonl").read_text().splitlines()]
    assert rows and all("bandwidth_fraction" in r for r in rows), rows
    # the stand-in has no NVSHMEM collectives: reported in the record, the figures kept
    assert all("nvshmem_error" in r for r in rows), rows


def _dry_run(tmp_path: Path, name: str, *args: str, budget: int | None = None) -> Path:
    """tests/fakegpu/dry_run.sh (``./dev gpu`` on the fake driver) into ``tmp_path/name``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake libcuda")
    out = tmp_path / name
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_", "FAKE_"))}
    env.update(OUT=str(out), GPU_VENV=str(Path(sys.executable).parents[1]))
    if budget is not None:
        env["GPU_BUDGET_S"] = str(budget)
    # the compile tier's cubins where the run shares them (scripts/test.sh)
    env["SHMEM_KERNEL_CACHE"] = os.environ.get("TESTS_KERNEL_CACHE", str(tmp_path / "kernels"))
    run = subprocess.run(
        ["bash", str(FAKE / "dry_run.sh"), *args], capture_output=True, text=True,
        timeout=600, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    (out / "dry_run.rc").write_text(f"{run.returncode}\n{run.stdout[-6000:]}{run.stderr[-3000:]}")
    return out


def test_the_gpu_runs_tiers_on_the_fake(tmp_path: Path) -> None:
    """``./dev gpu --tier 1`` on the fake driver: tier 0 (preflight) and tier 1 (the smoke
    tests) pass, the smoke tests launch every kernel family of the runtime, and the evidence
    the device tool brings back (at most 8 files) is written. Then a budget too small for
    tier 1: its steps are cut, the summary says so, and nothing runs past the budget."""
    out = _dry_run(tmp_path, "tiers", "--tier", "1")
    said = (out / "dry_run.rc").read_text()
    assert said.startswith("0\n"), said
    summary = (out / "summary.txt").read_text()
    for step in ("setup", "pf-versions", "pf-mpi", "pf-kernel", "pf-canary-1", "pf-canary-2",
                 "ptx-probe", "compile", "smoke-1proc", "smoke-2ranks", "coverage"):  # fmt: skip
        assert re.search(rf"^\d\s+{step}\s+passed", summary, re.M), (step, summary)
    launched = re.search(r"(\d+) of (\d+) kernel families launched", summary)
    assert launched and launched[1] == launched[2] and int(launched[2]) >= 29, summary
    files = sorted(p.name for p in out.iterdir() if p.name != "dry_run.rc")
    evidence = {"summary.txt", "env.txt", "console.log", "tests.tsv", "nvshmem-canary.log"}
    assert len(files) <= 8 and {*evidence, "gpu-logs.tar.gz"} <= set(files), files
    tests = (out / "tests.tsv").read_text().splitlines()
    assert tests[0] == "step\ttest\tranks\toutcome\tseconds"
    assert any(t.startswith("smoke-2ranks\t") and "\t2\tpassed\t" in t for t in tests), tests
    assert "canary ok" in (out / "nvshmem-canary.log").read_text()
    env_txt = (out / "env.txt").read_text()
    assert "$ nvidia-smi" in env_txt and '"libraries"' in env_txt, env_txt[:2000]
    with tarfile.open(out / "gpu-logs.tar.gz") as tar:
        names = tar.getnames()
    assert "logs/smoke-2ranks.ranks" in names and "logs/kernel-families.json" in names, names

    cut = _dry_run(tmp_path, "cut", "--tier", "1", budget=25)
    said = (cut / "dry_run.rc").read_text()
    summary = (cut / "summary.txt").read_text()
    assert said.startswith("0\n"), said  # cut is not failed
    # what the budget cuts depends on how long the preflight took (a busy machine): every
    # tier-1 step is skipped, each for the time budget or for a step it needs, the ones cut
    # for time are listed, and nothing ran past the budget
    cut_for_time = re.findall(r"^\d\s+(\S+)\s+skipped\s+0\s+time budget", summary, re.M)
    assert "compile" in cut_for_time, summary
    for step in ("ptx-probe", "compile", "smoke-1proc", "smoke-2ranks", "coverage"):
        assert re.search(rf"^1\s+{step}\s+skipped\s+0\s+(time budget|needs )", summary, re.M), (
            summary
        )
    listed = re.search(r"cut by the budget: (.*)$", summary, re.M)
    assert listed and set(cut_for_time) == set(listed[1].split()), summary
    elapsed = re.search(r"^elapsed (\d+) s of a 25 s budget", summary, re.M)
    assert elapsed and int(elapsed[1]) <= 25, summary


@pytest.mark.parametrize("risk", ["big-heap", "other-gpu", "teardown"])
def test_the_nvshmem_backends_risks_are_handled_on_the_fake(tmp_path: Path, risk: str) -> None:
    """Issue 42's risks 3-5, each in its own process (run_nvshmem_risks.py): a heap over
    NVSHMEM's default symmetric size, another GPU current when the World calls NVSHMEM, and
    the teardown after an error at one PE. The stand-in refuses each as NVSHMEM would."""
    run = run_on_the_fake(tmp_path, "run_nvshmem_risks.py", risk, gpus=2)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert f"RISK {risk} ok" in output, output[-4000:]
    for problem in ("freed implicitly", "MISMATCH", "Exception ignored", "Traceback"):
        assert problem not in output, output[-4000:]


@pytest.mark.parametrize(
    ("ranks", "nodes", "gpus", "streams"),
    [
        (1, "rank", 2, ""),
        (2, "rank", 2, ""),
        (3, "rank", 1, "lazy"),  # one GPU a node, streams that run only when waited for
        (3, "2", 2, ""),  # nodes {0, 1} and {2}: mapped and network peers on one word
        (4, "2", 2, "lazy"),
        (4, "rank", 2, ""),
    ],
    ids=[
        "1-rank",
        "2-ranks-2-nodes",
        "3-ranks-3-nodes-lazy",
        "3-ranks-2-nodes",
        "4-ranks-2-nodes-lazy",
        "4-ranks-4-nodes",
    ],
)
def test_the_nvshmem_backend_across_nodes_on_the_fake(
    tmp_path: Path, ranks: int, nodes: str, gpus: int, streams: str
) -> None:
    """Issue 42's risks 1 and 2 (run_nvshmem_nodes.py): with peers on other nodes, data
    moves through NVSHMEM from and into memory it knows (the stage on the symmetric heap),
    and every signal is NVSHMEM's, so no addition is lost between network and GPU atomics.
    Both failed before the fix: the stand-in refused the put from plain device memory, and
    a wait saw 70 of 80 additions."""
    run = run_on_the_fake(
        tmp_path, "run_nvshmem_nodes.py", ranks=ranks, gpus=gpus, streams=streams, nodes=nodes
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert f"NODES ok on ranks {list(range(ranks))} of {ranks}" in output, output[-4000:]
    for problem in ("REFUSED", "MISMATCH", "[cudacpu]", "freed implicitly", "Traceback"):
        assert problem not in output, output[-4000:]


@pytest.mark.parametrize(
    ("mode", "ranks", "refused_in"),
    [
        ("foreign-source", 2, "fake nvshmem: REFUSED nvshmemx_putmem_on_stream: the source"),
        ("not-symmetric", 1, "fake nvshmem: REFUSED nvshmemx_putmem_on_stream: destination"),
        ("not-allocated", 1, "fake nvshmem: REFUSED nvshmem_free:"),
        ("after-finalize", 1, "REFUSED nvshmemx_barrier_all_on_stream: called after"),
        ("other-device", 1, "REFUSED nvshmemx_barrier_all_on_stream: called with device 1"),
        ("stream-none", 1, "REFUSED by nvshmem4py: NotImplementedError"),
        ("registered-source", 2, "ACCEPTED registered-source on rank 0"),  # (not refused)
    ],
)
def test_the_nvshmem_stand_in_refuses_what_nvshmem_refuses(
    tmp_path: Path, mode: str, ranks: int, refused_in: str
) -> None:
    """The stand-in library (or nvshmem4py above it) refuses each call NVSHMEM refuses, with
    the function and the reason, and the job ends (run_nvshmem_refusals.py)."""
    run = run_on_the_fake(
        tmp_path, "run_nvshmem_refusals.py", mode, ranks=ranks, gpus=2, nodes="rank"
    )
    output = run.stdout + run.stderr
    assert f"REACHED {mode}" in output, output[-4000:]
    assert refused_in in output, output[-4000:]
    assert "NOT REFUSED" not in output, output[-4000:]
    accepted = "by nvshmem4py" in refused_in or "ACCEPTED" in refused_in
    assert (run.returncode == 0) == accepted, output[-4000:]
