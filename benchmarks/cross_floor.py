"""A large all-reduce between nodes against its floor: the same messages with nothing of ours.

    SHMEM_HEAP_NODE_SPLIT=rank MPIR_CVAR_NOLOCAL=1 python -m launch -n 2 \\
        benchmarks/cross_floor.py --sizes 256KiB,4MiB

Every rank its own (simulated) node, MPI through its network path (Open MPI:
``OMPI_MCA_btl=tcp,self``). For each size (float32, every rank's input), blocks of calls take
turns: ``MPI_Allreduce``; ours with a numpy input and a numpy ``out=``; ours with a symmetric
input; the **floor**, our algorithm in bare mpi4py (each rank sends piece ``k`` of its input
to rank ``k`` point to point, reduces the pieces it received, and sends its reduced piece to
every rank point to point; each exchange polled with ``Testall`` and ``sched_yield``, as our
waits poll): no signature, deadline, board, flight recorder or Python of ours; and MPI's
own ``Reduce_scatter_block`` + ``Allgather``. Each line gives MPI's time and every
contender's ratio (MPI's time / its own, above 1 faster than MPI), the median over blocks,
and the CPU time a call costs each rank (``time.process_time``): with more ranks than cores
the wall time follows the ranks' CPU time, so that column says where ours goes beyond the
floor. Where ours meets the floor, what is left is MPI's own transport.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
import shmem


def _floor(
    c: MPI.Intracomm, x: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
) -> Callable[[], None]:
    """The floor's call: reduce-scatter and all-gather point to point, nothing else."""
    p, me = c.Get_size(), c.Get_rank()
    bounds = [(k * len(x) // p, (k + 1) * len(x) // p) for k in range(p)]
    rows = [np.empty(b - a, x.dtype) for a, b in bounds]
    a, b = bounds[me]
    mine = out[a:b]

    def wait(reqs: list[MPI.Request]) -> None:
        while not MPI.Request.Testall(reqs):
            os.sched_yield()

    def call() -> None:
        others = [k for k in range(p) if k != me]
        reqs = [c.Irecv(rows[k], source=k, tag=7) for k in others]
        reqs += [c.Isend(x[bounds[k][0] : bounds[k][1]], dest=k, tag=7) for k in others]
        wait(reqs)
        np.copyto(mine, x[a:b])
        for k in others:  # (member order is ours; the sum's order does not matter here)
            np.add(mine, rows[k], out=mine)
        reqs = [c.Irecv(out[bounds[k][0] : bounds[k][1]], source=k, tag=8) for k in others]
        reqs += [c.Isend(mine, dest=k, tag=8) for k in others]
        wait(reqs)

    return call


def _time(
    c: MPI.Intracomm, fns: dict[str, Callable[[], object]], blocks: int, calls: int
) -> dict[str, tuple[float, float]]:
    """Per contender: the median over blocks of the slowest rank's wall time a call, and of
    this rank's CPU time a call (microseconds); contenders take turns block by block."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(2):
            f()
    for _ in range(blocks):
        for k, f in fns.items():
            c.Barrier()
            t, p = time.perf_counter(), time.process_time()
            for _ in range(calls):
                f()
            cpu[k].append((time.process_time() - p) / calls * 1e6)
            wall[k].append(c.allreduce((time.perf_counter() - t) / calls * 1e6, op=MPI.MAX))
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in fns}


def _contenders(
    world: Any, comm: Any, n: int
) -> tuple[dict[str, Callable[[], object]], shmem.SHMEMBuffer]:
    """The calls of one size (and the symmetric input, which the caller closes)."""
    c = world.comm
    p = c.Get_size()
    x = np.random.default_rng(world.rank).standard_normal(n).astype(np.float32)
    out, theirs, piece = np.empty_like(x), np.empty_like(x), np.empty(n // p, x.dtype)
    sym = world.empty(n, np.float32)
    sym.local()[:] = x

    def rs_ag() -> None:
        c.Reduce_scatter_block(x[: len(piece) * p], piece)
        c.Allgather(piece, theirs[: len(piece) * p])

    fns: dict[str, Callable[[], object]] = {
        "mpi": lambda: c.Allreduce(x, theirs),
        "ours_numpy": lambda: comm.all_reduce(x, out=out),
        "ours_symmetric": lambda: comm.all_reduce(sym, out=out),
        "floor": _floor(c, x, out),
        "mpi_rs_ag": rs_ag,
    }
    return fns, sym


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256KiB,4MiB", help="bytes a rank, comma-separated")
    ap.add_argument("--blocks", type=int, default=7)
    args = ap.parse_args()
    with shmem.init() as world, collectives.Communicator(world) as comm:
        if world.num_nodes != world.world_size:
            raise SystemExit("cross_floor: needs nodes of one rank each (node_split=rank)")
        for size in args.sizes.split(","):
            n = shmem.parse_size(size) // 4
            fns, sym = _contenders(world, comm, n)
            got = _time(world.comm, fns, args.blocks, 10 if n <= (1 << 18) else 3)
            mpi_us = got["mpi"][0]
            line: dict[str, object] = {"bytes": n * 4, "ranks": world.world_size}
            line["mpi_us"] = round(mpi_us, 1)
            line |= {k: round(mpi_us / wall, 2) for k, (wall, _) in got.items() if k != "mpi"}
            line |= {f"cpu_us.{k}": round(cpu, 1) for k, (_, cpu) in got.items()}
            if world.rank == 0:
                print(json.dumps(line), flush=True)
            world.barrier()
            sym.close()


if __name__ == "__main__":
    main()
