"""Barrier: every rank of the communicator has arrived, as a call of the channel's own.

A barrier takes the channel's next sequence number and carries a call signature like every
collective (:data:`collectives.signature.BARRIER`): the node-local ranks raise ``READY`` and
wait for each other's (comparing signatures, as any call does), then, across nodes, the
signatures are all-gathered over MPI (within the deadline, reading the board while it lasts).
So a rank in a barrier against peers in a collective is a mismatch every rank reports,
instead of a wait that only the deadline ends.
"""

from __future__ import annotations

from shmem.signals import check_timeout

from . import signed
from .channel import Channel, Flag, source_tag
from .signature import BARRIER

__all__ = ["barrier", "meet"]


def barrier(ch: Channel, timeout: float | None) -> None:
    """Return once every rank of ``ch`` has called it (``timeout``: seconds, by default
    ``[signal] timeout_s``)."""
    meet(ch, BARRIER, "Communicator.barrier", timeout)


def meet(ch: Channel, sig: int, where: str, timeout: float | None = None) -> None:
    """Every rank of ``ch`` in a call of signature ``sig``: the barrier's steps, for a call
    whose first step is one (``where``: the call, for errors)."""
    limit = ch.timeout_s if timeout is None else check_timeout(where, timeout)
    s = ch.next_call()
    ch.signature = sig
    saved, ch.timeout_s = ch.timeout_s, limit
    try:
        ch.wait_previous(s, where)  # (the node-local peers' previous call was this one's)
        ch.my_flags[Flag.SRC] = source_tag(sig)  # the call's tag, no input
        ch.post(Flag.READY, s)
        ch.wait_peers(Flag.READY, s, where)
        if ch.num_nodes > 1:
            signed.agree_first(ch, ch.comm, where, "rank")
    finally:
        ch.timeout_s = saved
    ch.post(Flag.DONE, s)
