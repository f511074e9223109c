"""All-gather: every rank's ``x`` (the same count everywhere), concatenated in rank order."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer

from . import signed
from .channel import Channel
from .cross import P2P_MAX_MEMBERS, all_gather_across
from .cross_plan import cross_plan
from .family import exchange, family_plan, over_mpi
from .operand import Array, prepare

__all__ = ["all_gather"]


def all_gather(
    ch: Channel, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    where = "Communicator.all_gather"
    size = ch.world_size
    xin, ret, dst = prepare(ch, where, x, out, lambda n: n * size)
    m = xin.count
    small = cross_plan(ch, "all_gather", xin)
    if small is not None:  # small, across nodes: one persistent signed all-gather
        small.run(ch, xin.array, xin.shmem, dst, False)
        return ret
    if ch.num_nodes > 1 and ch.world_size <= P2P_MAX_MEMBERS:
        # across nodes: point to point, the signatures checked meanwhile (collectives.cross)
        src = xin.array
        over_mpi(ch, where, lambda: all_gather_across(ch, ch.comm, src, dst, where))
        return ret
    if not ch.fits_scratch(xin):
        # across nodes, or too large for the scratch: MPI (non-blocking, within the deadline)
        send = np.ascontiguousarray(xin.array).view(np.uint8)
        over_mpi(ch, where, lambda: signed.allgather(ch, ch.comm, send, dst.view(np.uint8), where))
        return ret
    ch.stats.count("all_gather")
    plan = family_plan(ch, "all_gather", xin)
    if plan is not None:
        plan.run(ch, xin.array, xin.shmem, dst, False)
        return ret

    def read(r: int, src: Array, target: Array) -> None:
        np.copyto(target[r * m : (r + 1) * m], src)

    exchange(ch, where, xin, dst, read)
    return ret
