"""The collective family and the barrier against mpi4py's, interleaved in the same run.

    python -m launch -n 2 benchmarks/family.py --out results/family.jsonl

For every collective (broadcast, all-gather, reduce-scatter, all-to-all), size (8 B to 64 KiB
by default: the sizes a cached plan replays, and beyond with ``--max-bytes``) and dtype
(float32 by default, bfloat16 with ``--dtypes``), blocks of iterations of three contenders
take turns: ours with a symmetric input (a SHMEMBuffer: zero-copy), ours with a numpy input
(staged), and MPI's buffer call on numpy arrays (``Bcast``, ``Allgather``,
``Reduce_scatter_block``, ``Alltoall``; our reduce-scatter's shards are ``shard_bounds``,
equal here since the counts divide). MPI has no bfloat16: its data movement takes the bytes,
and its bfloat16 reduce-scatter is what a user would write (upcast to float32, reduce, round
back). ``barrier`` is ``World.barrier`` (OpenSHMEM's ``barrier_all``) against ``MPI_Barrier``,
one row. ``nbytes`` is each rank's input. Latency per call is the max over ranks of a
block's mean, reported as the median over blocks; ``ratio`` = MPI's time / ours (above 1:
faster than MPI). One JSON line per (collective, dtype, size, input).

By default every contender's input is the same data every call, which stays in the caches
(and, written long ago, is clean there: a copy out of another core's cache costs far less
than one of data that core has just written). ``--fresh`` rewrites each contender's input
before each of its calls, as a real workload's (a gradient, new weights) is new every call:
the rewrite (one copy of the input, the same for every contender) is in every time, and
``fresh_us``, its own time, is in each record; ``net_ratio`` is the ratio without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from harness import append_jsonl, git_sha, interleaved, size_steps, stats_us
from mpi4py import MPI

import collectives
import shmem

COLLECTIVES = ("broadcast", "all_gather", "reduce_scatter", "all_to_all")
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

Contenders = tuple[Callable[[], object], Callable[[], object], Callable[[], object], Any]


def _raw(a: np.ndarray[Any, Any]) -> list[Any]:
    """A buffer argument MPI moves as bytes (it has no bfloat16)."""
    return [a.view(np.uint8), MPI.BYTE]


def contenders(
    comm: Any, mpi: Any, world: Any, name: str, n: int, dt: np.dtype[Any], fresh: bool = False
) -> Contenders:
    """(ours with a symmetric input, ours with a numpy input, MPI's, the symmetric buffer);
    ``fresh``: each rewrites its input before each call."""
    ours_sym, ours_np, theirs, sym, host = _contenders(comm, mpi, world, name, n, dt)
    if not fresh:
        return ours_sym, ours_np, theirs, sym
    new = np.random.default_rng(world.rank + 1000).standard_normal(n).astype(dt)

    def after_rewrite(fn: Callable[[], object], dst: np.ndarray[Any, Any]) -> Callable[[], object]:
        def call() -> object:
            np.copyto(dst, new)
            return fn()

        return call

    return (
        after_rewrite(ours_sym, sym.local().reshape(-1)),
        after_rewrite(ours_np, host),
        after_rewrite(theirs, host),
        sym,
    )


def _contenders(
    comm: Any, mpi: Any, world: Any, name: str, n: int, dt: np.dtype[Any]
) -> tuple[Callable[[], object], Callable[[], object], Callable[[], object], Any, Any]:
    """:func:`contenders`, and the numpy input."""
    p = world.world_size
    rng = np.random.default_rng(world.rank)
    host = rng.standard_normal(n).astype(dt)
    sym = world.empty(n, dt)
    sym.local()[...] = host
    if name == "broadcast":
        out = np.empty(n, dt)
        return (
            lambda: comm.broadcast(sym, 0, out),
            lambda: comm.broadcast(host, 0, out),
            lambda: mpi.Bcast(_raw(host), root=0),
            sym,
            host,
        )
    if name == "all_gather":
        out = np.empty(n * p, dt)
        return (
            lambda: comm.all_gather(sym, out=out),
            lambda: comm.all_gather(host, out=out),
            lambda: mpi.Allgather(_raw(host), _raw(out)),
            sym,
            host,
        )
    if name == "all_to_all":
        out = np.empty(n, dt)
        return (
            lambda: comm.all_to_all(sym, out=out),
            lambda: comm.all_to_all(host, out=out),
            lambda: mpi.Alltoall(_raw(host), _raw(out)),
            sym,
            host,
        )
    out = np.empty(n // p, dt)
    if dt == np.dtype(np.float32):
        theirs: Callable[[], object] = lambda: mpi.Reduce_scatter_block(host, out, op=MPI.SUM)  # noqa: E731
    else:  # what a user would do without bfloat16 in MPI
        wide_out = np.empty(n // p, np.float32)

        def theirs() -> None:
            mpi.Reduce_scatter_block(host.astype(np.float32), wide_out, op=MPI.SUM)
            out[...] = wide_out.astype(dt)

    return (
        lambda: comm.reduce_scatter(sym, out=out),
        lambda: comm.reduce_scatter(host, out=out),
        theirs,
        sym,
        host,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="64KiB")
    ap.add_argument("--step", type=int, default=8, help="size multiplier between points")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--collectives", default=",".join((*COLLECTIVES, "barrier")))
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--fresh", action="store_true", help="rewrite every input before each call")
    ap.add_argument("--out", type=Path, default=Path("results/family.jsonl"))
    args = ap.parse_args()
    lo, hi = shmem.parse_size(args.min_bytes), shmem.parse_size(args.max_bytes)
    with (
        shmem.init(heap_nbytes=max(256 << 20, 8 * hi)) as world,
        collectives.Communicator(world) as comm,
    ):
        mpi, p = world.comm, world.world_size
        common = {
            "bench": "family",
            "git_sha": git_sha(),
            "world_size": p,
            "num_nodes": world.num_nodes,
            "node_split": world.config.heap.node_split,
            "mpi": MPI.get_vendor()[0],
        }
        records = []
        names = args.collectives.split(",")
        for name in (n for n in names if n != "barrier"):
            for dname in args.dtypes.split(","):
                dt = DTYPES[dname]
                for nbytes in size_steps(max(lo, 4), hi, args.step):
                    # whole elements, and (reduce-scatter, all-to-all) a count that divides
                    per = dt.itemsize
                    even = name in ("reduce_scatter", "all_to_all")
                    n = max(nbytes // per // p * p, p) if even else max(nbytes // per, 1)
                    ours_sym, ours_np, theirs, sym = contenders(
                        comm, mpi, world, name, n, dt, args.fresh
                    )
                    iters = int(max(3, min(2000, (32 << 20) / max(n * per * p, 1) / 4)))
                    fns = {"symmetric": ours_sym, "numpy": ours_np, "mpi": theirs}
                    if args.fresh:  # the rewrite alone: what every contender's time holds
                        src, dst = np.ones(n, dt), np.empty(n, dt)
                        fns["fresh"] = lambda: np.copyto(dst, src)  # noqa: B023 - called here
                    samples = interleaved(fns, args.blocks, iters, mpi)
                    mpi_t = float(np.median(samples["mpi"]))
                    fresh_t = float(np.median(samples["fresh"])) if args.fresh else 0.0
                    for kind in ("symmetric", "numpy"):
                        t = float(np.median(samples[kind]))
                        rec = {
                            **common,
                            "collective": name,
                            "dtype": dname,
                            "nbytes": n * per,
                            "input": kind,
                            "ours": stats_us(samples[kind]),
                            "mpi": stats_us(samples["mpi"]),
                            "ratio": mpi_t / t,
                        }
                        if args.fresh:
                            rec["fresh_us"] = fresh_t * 1e6
                            rec["net_ratio"] = (mpi_t - fresh_t) / max(t - fresh_t, 1e-9)
                        records.append(rec)
                        if world.rank == 0:
                            print(
                                f"{name:15} {dname:9} {n * per:>9} {kind:9} "
                                f"{rec['ours']['median_us']:>9.2f} us  MPI "
                                f"{rec['mpi']['median_us']:>9.2f} us  x{rec['ratio']:.2f}"
                                + (f"  net x{rec['net_ratio']:.2f}" if args.fresh else ""),
                                flush=True,
                            )
                    world.barrier()
                    sym.close()
        if "barrier" in names:
            samples = interleaved(
                {"ours": world.barrier, "mpi": mpi.Barrier}, args.blocks, 500, mpi
            )
            mpi_t, ours_t = (float(np.median(samples[k])) for k in ("mpi", "ours"))
            rec = {
                **common,
                "collective": "barrier",
                "dtype": "-",
                "nbytes": 0,
                "input": "-",
                "ours": stats_us(samples["ours"]),
                "mpi": stats_us(samples["mpi"]),
                "ratio": mpi_t / ours_t,
            }
            records.append(rec)
            if world.rank == 0:
                print(
                    f"{'barrier':15} {'-':9} {0:>9} {'-':9} {ours_t * 1e6:>9.2f} us  MPI "
                    f"{mpi_t * 1e6:>9.2f} us  x{rec['ratio']:.2f}",
                    flush=True,
                )
        if world.rank == 0:
            append_jsonl(args.out, records)
            print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
