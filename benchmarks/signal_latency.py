"""Signal ping-pong and put bandwidth on the symmetric heap, against MPI in the same run.

Run through the launcher (2 or more ranks; ranks 0 and 1 take part, the others wait)::

    python -m launch -n 2 benchmarks/signal_latency.py --out results/signal_latency.jsonl
    SHMEM_HEAP_NODE_SPLIT=rank python -m launch -n 2 benchmarks/signal_latency.py  # RMA path

Measurements, interleaved block by block so both sides see the same machine state:

* ``signal_pingpong``: round-trip time of ``world.signal`` + ``wait_until`` between ranks 0
  and 1, against ``comm.Send``/``comm.Recv`` of 8 bytes (mpi4py buffer API).
  Figure: microseconds per round trip (median, p10, p90 over blocks).
* ``signal_stream``: one way, rank 0 signals rank 1 ``iters`` times while rank 1 waits for
  the last, against as many 8-byte ``Send``s to ``Recv``s: where one-sided operations need
  the target's MPI progress (Open MPI's osc/rdma over TCP), a waiter that sleeps stalls them.
  Figure: microseconds per signal.
* ``put``: ``SHMEMBuffer.put`` of ``nbytes`` from rank 0 into rank 1's copy, against
  ``MPI.Win.Put`` + ``Win.Flush`` on a window from ``MPI.Win.Allocate`` (each first in every
  other block; each timed block starts with one untimed put). Where rank 1 is reached by RMA
  (``node_split = "rank"``, or another node) a control pass follows, interleaved the same
  way: MPI's own ``Put`` + ``Flush`` into the heap's window at the buffer's bytes
  (``mpi_heap``), the same memory as ours, so ``ratio_same_memory`` is our code's cost
  alone and the rest of ``ratio`` is where the bytes lie (at 16 MiB, source and destination
  fill the L3 and two memories differ by several per cent from run to run).
  Figure: bandwidth = nbytes / time per put, in GB/s (10**9 bytes/s).

Each result is one JSON line (git sha, backend, world size, node split, sizes, median/p10/p90
of ours and of MPI's, and the ratio MPI time / our time: above 1 means faster than MPI).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import append_jsonl, git_sha, stats_us
from mpi4py import MPI

import shmem


def pingpong(world: shmem.World, comm: Any, iters: int, blocks: int) -> dict[str, Any]:
    rank = world.rank
    ours: list[float] = []
    theirs: list[float] = []
    msg = np.zeros(1, np.int64)
    seq = 0
    for _ in range(blocks):
        # ours: signal + wait_until round trips
        world.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            seq += 1
            if rank == 0:
                world.signal(1, 0, seq)
                world.wait_until(1, "ge", seq)
            elif rank == 1:
                world.wait_until(0, "ge", seq)
                world.signal(0, 1, seq)
        ours.append((time.perf_counter() - t0) / iters)
        # MPI: 8-byte Send/Recv round trips
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                comm.Send(msg, dest=1, tag=1)
                comm.Recv(msg, source=1, tag=2)
            elif rank == 1:
                comm.Recv(msg, source=0, tag=1)
                comm.Send(msg, dest=0, tag=2)
        theirs.append((time.perf_counter() - t0) / iters)
    return {"ours": stats_us(ours), "mpi": stats_us(theirs)}


def stream(world: shmem.World, comm: Any, iters: int, blocks: int) -> dict[str, Any]:
    """One way: rank 0 signals rank 1 ``iters`` times (increasing values), rank 1 waits for
    the last; against ``iters`` 8-byte ``Send``s to ``Recv``s. Rank 1's wait must keep up
    MPI's progress where rank 0's one-sided operations need it (time per signal)."""
    rank = world.rank
    ours: list[float] = []
    theirs: list[float] = []
    msg = np.zeros(1, np.int64)
    seq = 0
    for _ in range(blocks):
        world.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            for _ in range(iters):
                seq += 1
                world.signal(1, 2, seq)
            world.heap.complete_signals()
        elif rank == 1:
            seq += iters
            world.wait_until(2, "ge", seq)
        world.barrier()  # (rank 0's time includes the last signal's arrival)
        ours.append((time.perf_counter() - t0) / iters)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                comm.Send(msg, dest=1, tag=3)
            elif rank == 1:
                comm.Recv(msg, source=0, tag=3)
        comm.Barrier()
        theirs.append((time.perf_counter() - t0) / iters)
    return {"ours": stats_us(ours), "mpi": stats_us(theirs)}


def put_bandwidth(
    world: shmem.World, comm: Any, nbytes: int, iters: int, blocks: int
) -> dict[str, Any]:
    rank = world.rank
    buf = world.empty(nbytes, "uint8")
    win = MPI.Win.Allocate(nbytes, 1, comm=comm)
    win.Lock_all(MPI.MODE_NOCHECK)
    src = np.full(nbytes, 7, dtype=np.uint8)

    def mpi_put(w: Any, disp: int) -> Any:
        def put() -> None:
            w.Put(src, 1, disp)
            w.Flush(1)

        return put

    cases: dict[str, Any] = {"ours": lambda: buf.put(1, src), "mpi": mpi_put(win, 0)}
    # the control: MPI's own Put + Flush into the heap's window at this buffer's bytes (where
    # rank 1 is reached by RMA), the same memory as ours: what is left between it and "mpi"
    # is where the bytes lie (a fresh small window against the heap), not our code
    # (rank 0 decides: only it puts, and every rank must run the same blocks)
    target = world.heap.rma_target(1, buf.offset) if rank == 0 else None
    if comm.bcast(target is not None, root=0):
        cases["mpi_heap"] = mpi_put(*target) if target is not None else lambda: None

    def interleaved(first: str, second: str) -> tuple[list[float], list[float]]:
        """Seconds per put of two cases, block by block, each first in every other block
        (so the first after a barrier is the one that ended the block before)."""
        times: dict[str, list[float]] = {first: [], second: []}
        for block in range(blocks):
            for name in (first, second) if block % 2 == 0 else (second, first):
                comm.Barrier()  # the target rank waits here, making MPI progress
                if rank == 0:
                    # one untimed put first: the other case's puts evicted this destination
                    # (at 16 MiB, source and destination fill this machine's 32 MiB L3), and
                    # a cold first put would make the samples two-humped, their median
                    # falling between the humps
                    put = cases[name]
                    put()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        put()
                    times[name].append((time.perf_counter() - t0) / iters)
        return times[first], times[second]

    samples = dict(zip(("ours", "mpi"), interleaved("ours", "mpi"), strict=True))
    if "mpi_heap" in cases:  # a pass of its own: its own pairs, nothing between them
        again, on_heap = interleaved("ours", "mpi_heap")
        samples.update(ours_vs_heap=again, mpi_heap=on_heap)
    comm.Barrier()
    if rank == 1:
        assert (buf.local() == 7).all(), "the puts landed"
    win.Unlock_all()
    win.Free()
    buf.close()
    return {name: stats_us(t) for name, t in samples.items()} if rank == 0 else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=200, help="round trips / puts per block")
    ap.add_argument("--blocks", type=int, default=25, help="timed blocks per measurement")
    ap.add_argument("--max-bytes", default="16MiB", help="largest put")
    ap.add_argument("--out", type=Path, help="append JSON lines here")
    args = ap.parse_args()
    max_bytes = shmem.parse_size(args.max_bytes)
    with shmem.init(heap_nbytes=max(64 << 20, 2 * max_bytes)) as world:
        if world.world_size < 2:
            raise SystemExit("signal_latency: needs at least 2 ranks (got 1)")
        comm = world.comm
        common = {
            "git_sha": git_sha(),
            "backend": world.backend,
            "world_size": world.world_size,
            "node_split": world.config.heap.node_split,
            "host": MPI.Get_processor_name(),
        }
        records: list[dict[str, Any]] = []
        pp = pingpong(world, comm, args.iters, args.blocks)
        if world.rank == 0:
            records.append(
                {
                    "bench": "signal_pingpong",
                    "nbytes": 8,
                    **common,
                    "ours": pp["ours"],
                    "mpi": pp["mpi"],
                    "ratio": pp["mpi"]["median_us"] / pp["ours"]["median_us"],
                }
            )
        st = stream(world, comm, args.iters, args.blocks)
        if world.rank == 0:
            records.append(
                {
                    "bench": "signal_stream",
                    "nbytes": 8,
                    **common,
                    "ours": st["ours"],
                    "mpi": st["mpi"],
                    "ratio": st["mpi"]["median_us"] / st["ours"]["median_us"],
                }
            )
        nbytes = 8
        while nbytes <= max_bytes:
            iters = max(2, min(args.iters, (256 << 20) // nbytes))  # >= 16 of the largest
            res = put_bandwidth(world, comm, nbytes, iters, args.blocks)
            if world.rank == 0:
                gbs = {k: nbytes / (res[k]["median_us"] * 1e-6) / 1e9 for k in ("ours", "mpi")}
                records.append(
                    {
                        "bench": "put",
                        "nbytes": nbytes,
                        **common,
                        "ours": res["ours"],
                        "mpi": res["mpi"],
                        "ours_GBps": gbs["ours"],
                        "mpi_GBps": gbs["mpi"],
                        "ratio": res["mpi"]["median_us"] / res["ours"]["median_us"],
                    }
                )
                if "mpi_heap" in res:  # MPI's Put into our heap's window: the same memory
                    records[-1]["mpi_heap"] = res["mpi_heap"]
                    records[-1]["ratio_same_memory"] = (
                        res["mpi_heap"]["median_us"] / res["ours_vs_heap"]["median_us"]
                    )
            nbytes *= 8
        if world.rank == 0:
            print(
                f"{'bench':16} {'bytes':>9} {'ours us':>10} {'MPI us':>10} {'MPI/ours':>9}"
                f" {'MPI-on-heap/ours':>17}"
            )
            for rec in records:
                same = rec.get("ratio_same_memory")
                print(
                    f"{rec['bench']:16} {rec['nbytes']:>9} {rec['ours']['median_us']:>10.2f} "
                    f"{rec['mpi']['median_us']:>10.2f} {rec['ratio']:>9.2f}"
                    + (f" {same:>17.2f}" if same is not None else "")
                )
            if args.out:
                append_jsonl(args.out, records)


if __name__ == "__main__":
    main()
