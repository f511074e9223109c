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
    """One PNG per benchmark of ``benchmarks/across_nodes.py``'s results in ``out``: a panel
    per collective (or per kind of signal benchmark), the ratio to MPI (above 1: faster)
    against bytes, one colour per (MPI, layout); the float32 numpy-input line is drawn bold
    and labelled, the other dtypes and inputs thin in the same colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # bench -> panel -> (mpi layout) -> variant -> points
    Series = dict[str, list[tuple[int, float]]]
    data: dict[str, dict[str, dict[str, Series]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    )
    for path in sorted(out.glob("*-*-*.jsonl")):
        bench, mpi, layout = path.stem.rsplit("-", 2)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            nbytes = max(int(rec.get("nbytes", 0)), 1)
            where = f"{mpi} {layout}"
            if bench == "signal_latency":
                panel, variant = str(rec.get("bench", "")), "main"
                if isinstance(rec.get("ratio_same_memory"), int | float):
                    same = data[bench][f"{panel} (same memory)"][where]["main"]
                    same.append((nbytes, rec["ratio_same_memory"]))
            else:
                panel = str(rec.get("collective", bench))
                variant = " ".join(str(rec[k]) for k in ("dtype", "input") if k in rec)
            if isinstance(rec.get("ratio"), int | float):
                data[bench][panel][where][variant].append((nbytes, rec["ratio"]))
    for bench, panels in data.items():
        names = sorted(panels)
        cols = min(3, len(names))
        rows = (len(names) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
        for ax, name in zip(axes.flat, names, strict=False):
            for i, (where, variants) in enumerate(sorted(panels[name].items())):
                color = f"C{i}"
                for variant, points in sorted(variants.items()):
                    points.sort()
                    main = variant in ("main", "float32 numpy") or not variant.strip("- ")
                    ax.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        marker="." if main else None,
                        color=color,
                        linewidth=2 if main else 0.7,
                        alpha=1.0 if main else 0.45,
                        label=where if main else None,
                    )
            ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
            ax.set_xscale("log", base=2)
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("bytes")
            ax.set_ylabel("MPI / ours")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(names) :]:
            ax.set_visible(False)
        fig.suptitle(
            f"{bench} across simulated nodes, MPI's network path forced (above 1: faster "
            "than MPI; bold: float32 numpy input, thin: bfloat16 and symmetric inputs)",
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(out / f"{bench}.png", dpi=100)
        plt.close(fig)


def plot_torch(jsonl: Path, png: Path) -> None:
    """``benchmarks/torch_backend.py``'s records: gloo's time / ours against bytes, a line
    per collective and world size, and the DDP steps as bars (above 1: faster than gloo)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    bars: dict[str, float] = {}
    meta: dict[str, Any] = {}
    for line in jsonl.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("bench") != "torch_backend":
            continue
        meta = rec
        key = f"{rec['collective']}, {rec['world_size']} ranks"
        if rec["collective"].startswith(("ddp_step", "attention")) or rec["nbytes"] == 0:
            bars[key] = rec["ratio"]
        else:
            lines[key].append((max(rec["nbytes"], 1), rec["ratio"]))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=(2, 1))
    for key, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank (float32)")
    ax.set_ylabel("gloo time / symheap time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    names = sorted(bars)
    bx.barh(range(len(names)), [bars[k] for k in names], color="C2")
    bx.set_yticks(range(len(names)), names, fontsize=7)
    bx.axvline(1.0, color="grey", linewidth=1, linestyle="--")
    bx.set_xlabel("gloo time / symheap time")
    fig.suptitle(
        f"torch.distributed: symheap against gloo (torch {meta.get('torch', '?')}, "
        f"{meta.get('git_sha', '')}; above 1: faster than gloo)",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    plot_ratio(Path(sys.argv[1]), Path(sys.argv[2]), *(sys.argv[3:4]))
