"""Plot benchmark JSON lines: our speed relative to the peer (MPI) against message size.

python benchmarks/plot.py results/allreduce.jsonl results/allreduce.png
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def plot_ratio(jsonl: Path, png: Path, bench: str = "allreduce") -> None:
    """One line per (dtype, input kind): busbw ratio to MPI against bytes, log-x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    meta: dict[str, Any] = {}
    for line in jsonl.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("bench") != bench:
            continue
        key = f"{rec['dtype']}, {rec['input']} input"
        series[key].append((rec["nbytes"], rec["ratio"]))
        meta = rec
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw ratio to MPI Allreduce (higher is better)")
    ax.set_title(
        f"{bench}: {meta.get('world_size', '?')} ranks, {meta.get('backend', '?')} "
        f"backend, {meta.get('git_sha', '')}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_across(out: Path) -> None:
    """One PNG per benchmark of ``benchmarks/across_nodes.py``'s results in ``out``: the ratio
    to MPI (above 1: faster) against bytes, a line per (what, MPI, layout)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_bench: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(out.glob("*-*-*.jsonl")):
        bench, mpi, layout = path.stem.rsplit("-", 2)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            what = " ".join(str(rec[k]) for k in ("collective", "dtype", "input") if k in rec)
            what = what or str(rec.get("bench", bench))
            if bench == "signal_latency":
                what = str(rec.get("bench", ""))
            if isinstance(rec.get("ratio"), int | float):
                key = f"{what}, {mpi} {layout}"
                by_bench[bench][key].append((max(int(rec.get("nbytes", 0)), 1), rec["ratio"]))
    for bench, series in by_bench.items():
        fig, ax = plt.subplots(figsize=(10, 6))
        for key, points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=key)
        ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("MPI's time / ours (higher is better)")
        ax.set_title(f"{bench} across nodes (MPI's network path forced)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(out / f"{bench}.png", dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    plot_ratio(Path(sys.argv[1]), Path(sys.argv[2]), *(sys.argv[3:4]))
