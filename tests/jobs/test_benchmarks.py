"""Every host benchmark runs end to end at small sizes and writes the records it documents.

No timing is asserted (the figures are the benchmarks' own business, against their peer in the
same run): these catch a benchmark that no longer runs, hangs (ranks that disagree on how many
blocks to time), or drops a field its readers and docs/benchmarks.md rely on.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def run(args: list[str], out: Path, env: dict[str, str] | None = None, ranks: int = 2) -> list[Any]:
    """Run one benchmark (through the launcher when ``ranks``) and return its JSON records."""
    launcher = ["-m", "launch", "-n", str(ranks), "--timeout", "60"] if ranks else []
    proc = subprocess.run(
        [sys.executable, *launcher, *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=BENCH,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.parametrize("split", ["node", "rank"])
def test_signal_latency(tmp_path: Path, split: str) -> None:
    records = run(
        ["signal_latency.py", "--iters", "2", "--blocks", "3", "--max-bytes", "4KiB"],
        tmp_path / "out.jsonl",
        {"SHMEM_HEAP_NODE_SPLIT": split},
    )
    assert [r["bench"] for r in records] == ["signal_pingpong", "signal_stream"] + ["put"] * 4
    assert [r["nbytes"] for r in records[2:]] == [8, 64, 512, 4096]
    for rec in records:
        assert rec["node_split"] == split
        assert positive(rec["ratio"]) and positive(rec["ours"]["median_us"]), rec
    for rec in records[2:]:
        assert positive(rec["ours_GBps"]) and positive(rec["mpi_GBps"]), rec
        # the same-memory control runs exactly where rank 1 is reached by RMA
        if split == "rank":
            assert positive(rec["ratio_same_memory"]) and positive(rec["mpi_heap"]["p90_us"])
        else:
            assert "ratio_same_memory" not in rec and "mpi_heap" not in rec


def test_allreduce(tmp_path: Path) -> None:
    records = run(
        ["allreduce.py", "--max-bytes", "64", "--blocks", "1", "--dtypes", "float32"],
        tmp_path / "out.jsonl",
    )
    assert {(r["nbytes"], r["input"]) for r in records} == {
        (n, i) for n in (8, 32, 64) for i in ("symmetric", "numpy")
    }
    assert all(r["bench"] == "allreduce" and positive(r["ratio"]) for r in records), records


def test_family(tmp_path: Path) -> None:
    records = run(
        ["family.py", "--max-bytes", "64", "--blocks", "1", "--dtypes", "float32,bfloat16"],
        tmp_path / "out.jsonl",
    )
    assert {r["collective"] for r in records} == {
        "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier",
    }  # fmt: skip
    assert {r["dtype"] for r in records} == {"float32", "bfloat16", "-"}
    assert all(positive(r["ratio"]) for r in records), records


def test_family_fresh(tmp_path: Path) -> None:
    """``--fresh``: every input rewritten before each call; the rewrite's own time and the
    ratio without it in each record."""
    records = run(
        [
            *("family.py", "--fresh", "--min-bytes", "4KiB", "--max-bytes", "4KiB"),
            *("--blocks", "1", "--collectives", "broadcast,all_gather"),
        ],
        tmp_path / "out.jsonl",
    )
    assert {(r["collective"], r["input"]) for r in records} == {
        (c, i) for c in ("broadcast", "all_gather") for i in ("symmetric", "numpy")
    }
    for r in records:
        assert positive(r["fresh_us"]) and r["fresh_us"] < r["mpi"]["median_us"], r
        assert positive(r["net_ratio"]) and positive(r["ratio"]), r


def test_flight_recorder(tmp_path: Path) -> None:
    records = run(["flight_recorder.py", "--blocks", "2", "--iters", "20"], tmp_path / "out.jsonl")
    assert [(r["op"], r["nbytes"]) for r in records] == [
        ("all_reduce", 32),
        ("all_reduce", 1024),
        ("barrier", 0),
    ]
    for r in records:
        assert r["records"] == 64 and math.isfinite(r["overhead"]), r
        assert positive(r["on_median_us"]) and positive(r["off_median_us"]), r
        assert positive(r["ratio_mpi"]) and r["overhead_p10"] <= r["overhead_p90"], r


def test_sequence_parallel(tmp_path: Path) -> None:
    records = run(
        [
            *("sequence_parallel.py", "--seq", "512", "--repeat", "1", "--heap", "64MiB"),
            *("--heads", "2", "--kv-heads", "1", "--head-dim", "16"),
        ],
        tmp_path / "out.jsonl",
    )
    cases = {(r["case"], r["schedule"]) for r in records}
    for case in ("causal", "non-causal", "ragged"):
        assert {(case, s) for s in ("ring", "zigzag", "dynamic")} <= cases, cases
    assert all(positive(r["t_parallel_s"]) for r in records), records


def test_attention_and_ipc(tmp_path: Path) -> None:
    attention = run(
        [
            *("attention.py", "--seq", "256", "--heads", "1", "--head-dim", "16"),
            *("--repeat", "1", "--block-m", "64", "--block-n", "64"),
        ],
        tmp_path / "attention.jsonl",
        ranks=0,
    )
    assert {r["causal"] for r in attention} == {False, True}
    assert all(positive(r["seconds"]) for r in attention), attention
    ipc = run(["ipc.py", "--iters", "5", "--mib", "1"], tmp_path / "ipc.jsonl", ranks=0)
    assert [r["bench"] for r in ipc] == ["ipc_export_import", "ipc_read"], ipc
    assert positive(ipc[0]["median_us"]) and positive(ipc[1]["ratio"]), ipc


def test_torch_backend(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    png = tmp_path / "torch.png"
    records = run(
        ["torch_backend.py", "--max-bytes", "16KiB", "--step", "4", "--blocks", "1",
         "--ddp", "transformer", "--ddp-steps", "1", "--attention", "256", "--png", str(png)],
        tmp_path / "out.jsonl",
    )  # fmt: skip
    got = {(r["collective"], r["nbytes"]) for r in records}
    assert {("all_reduce", 4096), ("all_reduce", 16384), ("barrier", 0)} <= got, got
    names = {r["collective"] for r in records}
    assert names == {
        "all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
        "all_to_all_single", "barrier", "ddp_step_transformer", "attention_fwd_bwd",
    }  # fmt: skip
    attention = next(r for r in records if r["collective"] == "attention_fwd_bwd")
    assert attention["tokens"] == 256 and positive(attention["parallel_efficiency"])
    assert positive(attention["tokens_per_s"]) and positive(attention["sdpa_tokens_per_s"])
    assert all(positive(r["ratio"]) and r["peer"] == "gloo" for r in records), records
    assert all(
        isinstance(r["overhead_us"], float) for r in records if r["collective"] == "all_reduce"
    )
    assert png.stat().st_size > 10_000


def test_across_nodes_runs_summarises_and_plots(tmp_path: Path) -> None:
    """benchmarks/across_nodes.py on MPICH, 2 simulated nodes, the smallest sizes: a JSON
    file per benchmark, a summary line per (benchmark, kind) with the put's same-memory row,
    and a PNG per benchmark with a panel per collective."""
    pytest.importorskip("matplotlib")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("needs the project's MPICH virtualenv (.venv)")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "across_nodes.py"), "--out", str(tmp_path),
         "--mpi", "mpich", "--layouts", "2x1", "--max-bytes", "4KiB", "--blocks", "1",
         "--timeout", "120"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for bench in ("allreduce", "family", "signal_latency"):
        assert (tmp_path / f"{bench}-mpich-2x1.jsonl").stat().st_size > 0
        assert (tmp_path / f"{bench}.png").stat().st_size > 0
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    kinds = {" ".join(line.split()[:2]) for line in lines}
    for want in ("signal_latency put", "signal_latency signal_pingpong", "family barrier"):
        assert want in kinds, lines
    assert any("same-memory" in line for line in lines), lines
    assert any(line.startswith("family") and "broadcast" in line for line in lines), lines


QUICK_RATIOS = {
    *(
        f"allreduce.{form}.{size}"
        for form in ("numpy_out", "sym_new", "sym_out", "in_place")
        for size in ("8B", "4KiB", "1MiB", "16MiB")
    ),
    "barrier",
    "pingpong",
    *(f"cross.{kind}.{size}" for kind in ("numpy", "sym") for size in ("4KiB", "256KiB", "4MiB")),
}


def test_quick_bench_measures_every_ratio_and_compares_with_a_baseline(tmp_path: Path) -> None:
    """benchmarks/quick.py (``./dev bench``) at one block: every headline ratio, positive;
    --compare exits 0 against a band every ratio clears and 1, naming the ratio, against a
    band one cannot reach."""
    out, base = tmp_path / "quick.json", tmp_path / "baseline.json"

    def quick(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(BENCH / "quick.py"), "--blocks", "1", "--out", str(out),
             "--baseline-file", str(base), "--timeout", "120", *extra],
            capture_output=True, text=True, timeout=400, cwd=ROOT, check=False,
        )  # fmt: skip

    proc = quick()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ratios = json.loads(out.read_text())
    torch_ratios = {"torch.all_reduce.8KiB", "torch.all_reduce.16MiB"}
    assert set(ratios) - torch_ratios == QUICK_RATIOS, sorted(ratios)
    assert all(positive(v) for v in ratios.values()), ratios
    band = {"median": 0.0, "lo": 0.0, "hi": 0.0, "runs": 5}
    base.write_text(json.dumps({"ratios": {k: band for k in ratios}}))
    proc = quick("--compare")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "every ratio within its band" in proc.stdout
    far = {**band, "median": 1e9, "lo": 1e9, "hi": 1e9}
    base.write_text(json.dumps({"ratios": {**{k: band for k in ratios}, "barrier": far}}))
    proc = quick("--compare")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "BELOW BAND barrier:" in proc.stdout and "1 below" in proc.stdout, proc.stdout
