"""Broadcast: ``root``'s ``x`` on every rank, into ``out`` (by default ``x`` itself)."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer
from shmem.errors import CollectiveArgumentError

from . import signed
from .channel import Channel
from .cross import P2P_MAX_MEMBERS, broadcast_across
from .cross_plan import cross_plan
from .family import exchange, family_plan, over_mpi
from .operand import Array, Operand, prepare

__all__ = ["broadcast"]


def broadcast(
    ch: Channel, x: SHMEMBuffer | Array, root: int, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    where = "Communicator.broadcast"
    size = ch.world_size

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
        ch,
        where,
        x,
        out,
        lambda n: n,
        (int(root) if isinstance(root, int | np.integer) else root,),
        validate,
        default_out_is_x=True,
    )
    root = int(root)
    small = cross_plan(ch, "broadcast", xin, root)
    if small is not None:  # small, across nodes: one persistent signed all-gather
        small.run(ch, xin.array, xin.shmem, dst, False)
        return ret
    if ch.num_nodes > 1 and ch.world_size <= P2P_MAX_MEMBERS:
        # across nodes: point to point from the root, the signatures checked meanwhile
        # (collectives.cross)
        src = xin.array
        over_mpi(ch, where, lambda: broadcast_across(ch, ch.comm, src, dst, root, where))
        return ret
    if not ch.fits_scratch(xin):
        # across nodes, or too large for the scratch: MPI (non-blocking, within the deadline)
        if ch.rank == root and not np.shares_memory(dst, xin.array):
            np.copyto(dst, xin.array)
        buf = dst.view(np.uint8)  # the root's data is in dst now (it is x itself by default)
        over_mpi(ch, where, lambda: signed.bcast(ch, ch.comm, buf, root, where))
        return ret
    ch.stats.count("broadcast")
    plan = family_plan(ch, "broadcast", xin, root)
    if plan is not None:
        plan.run(ch, xin.array, xin.shmem, dst, False)
        return ret

    def read(r: int, src: Array, target: Array) -> None:
        if not np.shares_memory(target, src):
            np.copyto(target, src)

    exchange(ch, where, xin, dst, read, peers=[root])
    return ret
