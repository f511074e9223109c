"""Shared steps of the collective family: the node-local exchange and the MPI fallback.

Every collective of the family has the same shape on one node: this rank makes its input
readable (zero-copy for a SHMEMBuffer, else staged into its scratch), raises ``READY``, reads
what it needs from peers through peer views, raises ``DONE``, and, when its input was the
caller's SHMEMBuffer, waits for every peer's ``DONE`` before returning. Across nodes they use
MPI (non-blocking, within the deadline): multi-node scale comes from MPI.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from shmem.errors import CollectiveMismatchError, PeerFailedError, ShmemError

from .channel import Channel, Flag
from .operand import Array, Operand

__all__ = ["exchange", "over_mpi"]


def exchange(
    ch: Channel,
    where: str,
    xin: Operand,
    dst: Array,
    read: Callable[[int, Array, Array], None],
    peers: list[int] | None = None,
) -> None:
    """One node-local round: publish my input, ``read(rank, input_of_rank, tmp_or_dst)`` for
    each rank in ``peers`` (default: every local rank, in rank order), then DONE.

    When ``dst`` overlaps my zero-copy input, reads go to a temporary copied into ``dst`` once
    every peer has finished reading my input.
    """
    s = ch.next_call()
    staged = xin.shmem is None
    ch.wait_previous(s, where)
    ch.publish(s, xin, xin.count * xin.dtype.itemsize)
    readers = ch.local_peers if peers is None else peers
    ch.wait_peers(Flag.READY, s, where, readers)
    aside = (not staged) and np.may_share_memory(dst, xin.array)
    target = np.empty_like(dst) if aside else dst
    for r in readers:
        read(r, ch.peer_input(r, xin.count, xin.dtype), target)
    ch.post(Flag.DONE, s)
    if not staged:  # the caller owns x again once every peer has read it
        ch.wait_peers(Flag.DONE, s, where)
        if aside:
            np.copyto(dst, target)


def over_mpi(ch: Channel, where: str, run: Callable[[], None]) -> None:
    """A family call across nodes (or too large for the scratch) through MPI: ``run`` the
    signed exchange (:mod:`collectives.signed`: every member's call signature is compared,
    waited for within the deadline), then raise ``DONE`` so node-local peers may reuse their
    scratch."""
    s = ch.next_call()
    try:
        ch.wait_previous(s, where)  # node-local peers are done with the previous call
    except (CollectiveMismatchError, PeerFailedError):
        ch.signature = -1  # take part as abandoned: the other members stop at once
        with contextlib.suppress(MPI.Exception, ShmemError):
            run()
        raise
    run()
    ch.post(Flag.DONE, s)
