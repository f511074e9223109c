"""Where the time of a small all-reduce between nodes goes, layer by layer (issue 44).

    SHMEM_HEAP_NODE_SPLIT=rank MPIR_CVAR_NOLOCAL=1 python -m launch -n 2 \\
        benchmarks/cross_breakdown.py --bytes 4KiB

Every rank its own (simulated) node, MPI through its network path. Each line adds one layer
to the one above and is timed on its own (calls in a row, the best of three runs), with
``MPI_Allreduce`` of the same size on the same communicator as the peer:

1. MPI's own part: the cached plan's messages alone (one round of persistent point-to-point
   messages of the plan's size, a bare ``Testall`` spin);
2. + the call signature travelling with the data and compared on arrival
   (:class:`collectives.signed.PeerGather` with a host that spins without a deadline);
3. + the deadline (the Communicator's own wait: inline tests, then the clock and the board);
4. + the plan: the copy into the send slot, the reduction in node order, the sequence number
   and ``DONE`` (the cached :class:`~collectives.allreduce_plans.NodesPlan`'s ``run``);
5. + the engine's fast path and the flight recorder: the user's ``all_reduce(x, out=y)``, and
   ``all_reduce(x)`` (a new array per call).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
import shmem
from collectives.signed import PeerGather


class _Bare:
    """A host for the signed exchange that waits by spinning: no deadline, no board."""

    def __init__(self, signature: int) -> None:
        self.signature = signature

    def mpi_wait(self, req: Any, what: str, keep: object = None) -> None:
        while not req.Test():
            pass

    def fail(self, mismatch: bool = False) -> None:
        pass


def _best_us(comm: MPI.Intracomm, f: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        for _ in range(calls // 100):
            f()
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="4KiB", help="bytes a rank (float32)")
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    nbytes = shmem.parse_size(args.bytes)
    n = nbytes // 4
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    with shmem.init() as world, collectives.Communicator(world) as comm:
        ch = comm.host_channel
        cross = ch.cross if ch is not None else None
        if ch is None or cross is None or len(ch.local_peers) != 1:
            raise SystemExit("cross_breakdown: needs nodes of one rank each (node_split=rank)")
        comm.all_reduce(x, out=y)  # makes the cached plan
        plan = ch.plans.get((n, x.dtype, "sum"))
        if plan is None:
            raise SystemExit(f"cross_breakdown: {args.bytes} has no cached one-round plan")
        me, size = cross.Get_rank(), cross.Get_size()
        rows = np.zeros((size, 1 << (nbytes + 15).bit_length()), np.uint8)
        send = [rows[me, : nbytes + 16], MPI.BYTE]
        reqs = [cross.Recv_init([rows[k], MPI.BYTE], k, 0x6200) for k in range(size) if k != me]
        reqs += [cross.Send_init(send, k, 0x6200) for k in range(size) if k != me]

        def bare_messages() -> None:
            MPI.Prequest.Startall(reqs)
            while not MPI.Request.Testall(reqs):
                pass

        gather = PeerGather(cross, nbytes, 12345)
        bare = _Bare(12345)
        saved = ch.signature
        calls = args.calls
        rows_out: list[tuple[str, float]] = [
            ("MPI_Allreduce", _best_us(cross, lambda: cross.Allreduce(x, y), calls)),
            ("1 MPI's own part (the messages alone)", _best_us(cross, bare_messages, calls)),
            (
                "2 + the signature (PeerGather)",
                _best_us(cross, lambda: gather.run(bare, "x"), calls),
            ),
        ]
        ch.signature = 12345
        rows_out.append(
            (
                "3 + the deadline (Channel.mpi_wait)",
                _best_us(cross, lambda: gather.run(ch, "x"), calls),
            )
        )
        ch.signature = saved
        gather.close()
        for req in reqs:
            req.Free()
        rows_out += [
            ("4 + the plan", _best_us(cross, lambda: plan.run(ch, x, None, y, False), calls)),
            ("5 all_reduce(x, out=y)", _best_us(cross, lambda: comm.all_reduce(x, out=y), calls)),
            ("5b all_reduce(x)", _best_us(cross, lambda: comm.all_reduce(x), calls)),
            ("MPI_Allreduce again", _best_us(cross, lambda: cross.Allreduce(x, y), calls)),
        ]
        if world.rank == 0:
            print(f"{args.bytes} a rank, {size} nodes, {MPI.Get_library_version().splitlines()[0]}")
            for name, us in rows_out:
                print(f"{name:44s} {us:8.2f} us")


if __name__ == "__main__":
    main()
