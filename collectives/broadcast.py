"""Broadcast: ``root``'s ``x`` on every rank, into ``out`` (by default ``x`` itself)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from shmem.errors import CollectiveArgumentError

from .communicator import DONE, Communicator, Operand
from .family import exchange, prepare

__all__ = ["broadcast"]


def broadcast(comm: Communicator, x: Any, root: int, out: Any) -> Any:
    where = "Communicator.broadcast"
    size = comm.world_size

    def validate(xin: Operand) -> None:
        if (
            isinstance(root, bool)
            or not isinstance(root, int | np.integer)
            or not (0 <= root < size)
        ):
            raise CollectiveArgumentError(
                f"{where}: invalid root (got {root!r}; expected 0 <= root < {size})"
            )

    xin, ret, dst = prepare(
        comm,
        where,
        x,
        out,
        lambda n: n,
        (int(root) if isinstance(root, int | np.integer) else root,),
        validate,
        default_out_is_x=True,
    )
    root = int(root)
    if comm.num_nodes > 1 or xin.count * xin.dtype.itemsize > comm.scratch_capacity:
        # across nodes, or too large for the scratch: MPI (non-blocking, within the deadline)
        s = comm._next_call()
        if comm.rank == root and not np.shares_memory(dst, xin.array):
            np.copyto(dst, xin.array)
        buf = dst  # the root's data is in dst now (it is x itself by default)
        comm.mpi_wait(
            comm.world.comm.Ibcast([buf.view(np.uint8), MPI.BYTE], root=root), where, keep=buf
        )
        comm._post(DONE, s)  # node-local peers wait for it before reusing scratch
        return ret
    comm.stats.count("broadcast")

    def read(r: int, src: np.ndarray[Any, Any], target: np.ndarray[Any, Any]) -> None:
        if not np.shares_memory(target, src):
            np.copyto(target, src)

    exchange(comm, where, xin, dst, read, peers=[root])
    return ret
