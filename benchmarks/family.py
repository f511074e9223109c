"""Broadcast, all-gather and reduce-scatter against mpi4py's, interleaved in the same run.

    python -m launch -n 2 benchmarks/family.py --out results/family.jsonl

For every collective and size (float32, 8 B to 64 KiB by default: the sizes a cached plan
replays, and beyond with ``--max-bytes``), blocks of iterations of three contenders take
turns: ours with a symmetric input (a SHMEMBuffer: zero-copy), ours with a numpy input
(staged), and MPI's buffer call on numpy arrays (``Bcast``, ``Allgather``,
``Reduce_scatter_block``; our reduce-scatter's shards are ``shard_bounds``, equal here
since the counts divide). ``nbytes`` is each rank's input. Latency per call is the max over
ranks of a block's mean, reported as the median over blocks; ``ratio`` = MPI's time / ours
(above 1: faster than MPI). One JSON line per (collective, size, input).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import append_jsonl, git_sha, stats_us, timed_max_over_ranks
from mpi4py import MPI

import collectives
import shmem

COLLECTIVES = ("broadcast", "all_gather", "reduce_scatter")


def contenders(
    comm: Any, mpi: Any, world: Any, name: str, n: int
) -> tuple[Callable[[], object], Callable[[], object], Callable[[], object], Any]:
    """(ours with a symmetric input, ours with a numpy input, MPI's, the symmetric buffer)."""
    p = world.world_size
    rng = np.random.default_rng(world.rank)
    host = rng.standard_normal(n).astype(np.float32)
    sym = world.empty(n, "float32")
    sym.local()[...] = host
    if name == "broadcast":
        out = np.empty(n, np.float32)
        return (
            lambda: comm.broadcast(sym, 0, out),
            lambda: comm.broadcast(host, 0, out),
            lambda: mpi.Bcast(host, root=0),
            sym,
        )
    if name == "all_gather":
        out = np.empty(n * p, np.float32)
        return (
            lambda: comm.all_gather(sym, out=out),
            lambda: comm.all_gather(host, out=out),
            lambda: mpi.Allgather(host, out),
            sym,
        )
    out = np.empty(n // p, np.float32)
    return (
        lambda: comm.reduce_scatter(sym, out=out),
        lambda: comm.reduce_scatter(host, out=out),
        lambda: mpi.Reduce_scatter_block(host, out, op=MPI.SUM),
        sym,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="64KiB")
    ap.add_argument("--step", type=int, default=8, help="size multiplier between points")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--out", type=Path, default=Path("results/family.jsonl"))
    args = ap.parse_args()
    lo, hi = shmem.parse_size(args.min_bytes), shmem.parse_size(args.max_bytes)
    with (
        shmem.init(heap_nbytes=max(256 << 20, 8 * hi)) as world,
        collectives.Communicator(world) as comm,
    ):
        mpi, p = world.comm, world.world_size
        common = {"bench": "family", "git_sha": git_sha(), "world_size": p, "dtype": "float32"}
        records = []
        for name in args.collectives.split(","):
            sizes, nbytes = [], max(lo, 4)
            while nbytes < hi:
                sizes.append(nbytes)
                nbytes *= args.step
            sizes.append(hi)
            for nbytes in sizes:
                # whole elements, and (reduce-scatter) a count every rank's shard divides
                n = max(nbytes // 4 // p * p, p) if name == "reduce_scatter" else nbytes // 4
                ours_sym, ours_np, theirs, sym = contenders(comm, mpi, world, name, n)
                iters = int(max(3, min(2000, (32 << 20) / max(n * 4 * p, 1) / 4)))
                samples: dict[str, list[float]] = {"symmetric": [], "numpy": [], "mpi": []}
                fns = {"symmetric": ours_sym, "numpy": ours_np, "mpi": theirs}
                for fn in fns.values():  # warm up (plans, scratch growth, caches)
                    fn()
                order = list(fns)
                for block in range(args.blocks):
                    for key in order[block % 3 :] + order[: block % 3]:  # each leads in turn
                        samples[key].append(timed_max_over_ranks(fns[key], iters, mpi))
                mpi_t = float(np.median(samples["mpi"]))
                for kind in ("symmetric", "numpy"):
                    t = float(np.median(samples[kind]))
                    rec = {
                        **common,
                        "collective": name,
                        "nbytes": n * 4,
                        "input": kind,
                        "ours": stats_us(samples[kind]),
                        "mpi": stats_us(samples["mpi"]),
                        "ratio": mpi_t / t,
                    }
                    records.append(rec)
                    if world.rank == 0:
                        print(
                            f"{name:15} {n * 4:>9} {kind:9} {rec['ours']['median_us']:>9.2f} us"
                            f"  MPI {rec['mpi']['median_us']:>9.2f} us  x{rec['ratio']:.2f}",
                            flush=True,
                        )
                world.barrier()
                sym.close()
        if world.rank == 0:
            append_jsonl(args.out, records)
            print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
