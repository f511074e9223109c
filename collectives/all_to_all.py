"""All-to-all: chunk ``j`` of rank ``i``'s ``x`` becomes chunk ``i`` of rank ``j``'s output
(``count`` must be a multiple of the world size)."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer
from shmem.errors import CollectiveArgumentError

from . import signed
from .channel import Channel
from .cross import P2P_MAX_MEMBERS, all_to_all_across
from .cross_plan import cross_plan
from .family import exchange, over_mpi
from .operand import Array, Operand, prepare

__all__ = ["all_to_all"]


def all_to_all(
    ch: Channel, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    where = "Communicator.all_to_all"
    size, rank = ch.world_size, ch.rank

    def validate(xin: Operand) -> None:
        if xin.count % size:
            raise CollectiveArgumentError(
                f"{where}: invalid count (got {xin.count}; expected a multiple of the world "
                f"size {size})"
            )

    xin, ret, dst = prepare(ch, where, x, out, lambda n: n, (), validate)
    m = xin.count // size
    small = cross_plan(ch, "all_to_all", xin)
    if small is not None:  # small, across nodes: one persistent signed all-gather
        small.run(ch, xin.array, xin.shmem, dst, False)
        return ret
    if ch.num_nodes > 1 and size <= P2P_MAX_MEMBERS:
        # across nodes: point to point, the signatures checked meanwhile (collectives.cross)
        src = xin.array
        over_mpi(ch, where, lambda: all_to_all_across(ch, ch.comm, src, dst, where))
        return ret
    if not ch.fits_scratch(xin):
        # across nodes, or too large for the scratch: MPI (non-blocking, within the deadline)
        send = np.array(xin.array, copy=True).view(np.uint8)  # in place: MPI needs two buffers
        over_mpi(ch, where, lambda: signed.alltoall(ch, ch.comm, send, dst.view(np.uint8), where))
        return ret
    ch.stats.count("all_to_all")

    def read(r: int, src: Array, target: Array) -> None:
        np.copyto(target[r * m : (r + 1) * m], src[rank * m : (rank + 1) * m])

    exchange(ch, where, xin, dst, read)  # a staged x is read from scratch: in place is safe
    return ret
