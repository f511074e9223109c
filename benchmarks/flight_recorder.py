"""What the flight recorder costs on the small all-reduce fast path: on against off, same run.

Run through the launcher (2 or more ranks)::

    python -m launch -n 2 benchmarks/flight_recorder.py --out results/flight_recorder.jsonl

For each size (default 32 B and 1 KiB of float32: the cached calls the C replay runs; and 0:
``World.barrier``, recorded by the C writer of calls made from Python), the same
Communicator's ``all_reduce`` is timed in blocks with the recorder on and off
(``shmem.flight.recorder().enabled``, switched on every rank between blocks), the modes
taking turns block by block and each leading in turn, after a warm-up; ``MPI.Allreduce`` of
the same array (``MPI.Barrier``) runs in the same blocks as the peer a user would otherwise
call. Each block
is the slowest rank's time per call over ``--iters`` back-to-back calls.

Each result is one JSON line (git sha, world size, node split, size, median/p10/p90 of each
mode in microseconds, ``overhead``: the median over blocks of on / the off block next to it,
minus 1 (with its p10 and p90; the target is at most 0.02), and ``ratio_mpi``: MPI's median /
ours with the recorder on).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from harness import append_jsonl, git_sha, stats_us, timed_max_over_ranks
from mpi4py import MPI

import collectives
import shmem
from shmem import flight


def measure(
    world: shmem.World, comm: collectives.Communicator, nbytes: int, blocks: int, iters: int
) -> dict[str, Any]:
    """All-reduces of ``nbytes`` (0: ``World.barrier``, recorded from Python)."""
    x = np.ones(max(nbytes, 4) // 4, np.float32)
    out = np.empty_like(x)
    mpi = world.comm
    rec = flight.recorder()

    def ours() -> None:
        if nbytes:
            comm.all_reduce(x, out=out)
        else:
            world.barrier()

    def theirs() -> None:
        if nbytes:
            mpi.Allreduce(x, out, op=MPI.SUM)
        else:
            mpi.Barrier()

    modes = {"on": (ours, True), "off": (ours, False), "mpi": (theirs, True)}
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for fn, on in modes.values():  # warm-up: the plan is made, caches are filled
        rec.enabled = on
        for _ in range(iters):
            fn()
    order = list(modes)
    for block in range(blocks):
        for mode in order[block % len(order) :] + order[: block % len(order)]:
            fn, on = modes[mode]
            rec.enabled = on
            samples[mode].append(timed_max_over_ranks(fn, iters, mpi))
    rec.enabled = True
    got = {m: stats_us(s) for m, s in samples.items()}
    on_us = got["on"]["median_us"]
    # paired: each block's on against the off block next to it (the machine drifts by more
    # than the recorder costs between distant blocks)
    paired = np.array(samples["on"]) / np.array(samples["off"])
    return {
        "bench": "flight_recorder",
        "op": "all_reduce" if nbytes else "barrier",
        "git_sha": git_sha(),
        "world_size": world.world_size,
        "node_split": world.config.heap.node_split,
        "nbytes": nbytes,
        "iters": iters,
        "blocks": blocks,
        "records": rec.capacity,
        **{f"{m}_{k}": v for m, s in got.items() for k, v in s.items()},
        "overhead": float(np.median(paired)) - 1.0,
        "overhead_p10": float(np.percentile(paired, 10)) - 1.0,
        "overhead_p90": float(np.percentile(paired, 90)) - 1.0,
        "ratio_mpi": got["mpi"]["median_us"] / on_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[32, 1024, 0], help="bytes (0: a barrier)"
    )
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="append JSON lines here")
    args = parser.parse_args()
    with shmem.init(heap_nbytes="64MiB") as world:
        comm = collectives.Communicator(world)
        rows = [measure(world, comm, n, args.blocks, args.iters) for n in args.sizes]
        comm.close()
        if world.rank == 0:
            for r in rows:
                what = f"all_reduce {r['nbytes']} B" if r["nbytes"] else "World.barrier"
                print(
                    f"flight recorder, {r['world_size']} ranks, {what}: on "
                    f"{r['on_median_us']:.3f} us, off {r['off_median_us']:.3f} us, overhead "
                    f"{100 * r['overhead']:+.2f}% (paired blocks, p10 "
                    f"{100 * r['overhead_p10']:+.1f}%, p90 {100 * r['overhead_p90']:+.1f}%; "
                    f"target <= +2%); MPI {r['mpi_median_us']:.3f} us ({r['ratio_mpi']:.2f}x "
                    "ours)"
                )
            if args.out is not None:
                append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
