"""All-gather: every rank's ``x`` (the same count everywhere), concatenated in rank order."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .communicator import DONE, Communicator
from .family import exchange, prepare

__all__ = ["all_gather"]


def all_gather(comm: Communicator, x: Any, out: Any) -> Any:
    where = "Communicator.all_gather"
    size = comm.world_size
    xin, ret, dst = prepare(comm, where, x, out, lambda n: n * size)
    m = xin.count
    if comm.num_nodes > 1 or xin.count * xin.dtype.itemsize > comm.scratch_capacity:
        # across nodes, or too large for the scratch: MPI (non-blocking, within the deadline)
        s = comm._next_call()
        send = np.ascontiguousarray(xin.array)
        comm.mpi_wait(
            comm.world.comm.Iallgather(
                [send.view(np.uint8), MPI.BYTE], [dst.view(np.uint8), MPI.BYTE]
            ),
            where,
            keep=(send, dst),
        )
        comm._post(DONE, s)  # node-local peers wait for it before reusing scratch
        return ret
    comm.stats.count("all_gather")

    def read(r: int, src: np.ndarray[Any, Any], target: np.ndarray[Any, Any]) -> None:
        np.copyto(target[r * m : (r + 1) * m], src)

    exchange(comm, where, xin, dst, read)
    return ret
