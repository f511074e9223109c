"""All-to-all: chunk ``j`` of rank ``i``'s ``x`` becomes chunk ``i`` of rank ``j``'s output
(``count`` must be a multiple of the world size)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from shmem.errors import CollectiveArgumentError

from .communicator import DONE, Communicator, Operand
from .family import exchange, prepare

__all__ = ["all_to_all"]


def all_to_all(comm: Communicator, x: Any, out: Any) -> Any:
    where = "Communicator.all_to_all"
    size, rank = comm.world_size, comm.rank

    def validate(xin: Operand) -> None:
        if xin.count % size:
            raise CollectiveArgumentError(
                f"{where}: invalid count (got {xin.count}; expected a multiple of the world "
                f"size {size})"
            )

    xin, ret, dst = prepare(comm, where, x, out, lambda n: n, (), validate)
    m = xin.count // size
    if comm.num_nodes > 1 or xin.count * xin.dtype.itemsize > comm.scratch_capacity:
        # across nodes, or too large for the scratch: MPI (non-blocking, within the deadline)
        s = comm._next_call()
        send = np.array(xin.array, copy=True)  # in place is allowed: MPI needs two buffers
        comm.mpi_wait(
            comm.world.comm.Ialltoall(
                [send.view(np.uint8), MPI.BYTE], [dst.view(np.uint8), MPI.BYTE]
            ),
            where,
            keep=(send, dst),
        )
        comm._post(DONE, s)  # node-local peers wait for it before reusing scratch
        return ret
    comm.stats.count("all_to_all")

    def read(r: int, src: np.ndarray[Any, Any], target: np.ndarray[Any, Any]) -> None:
        np.copyto(target[r * m : (r + 1) * m], src[rank * m : (rank + 1) * m])

    exchange(comm, where, xin, dst, read)  # a staged x is read from scratch: in place is safe
    return ret
