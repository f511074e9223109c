"""The family's exchanges between nodes, and the all-reduce's phase between nodes for large
vectors: a reduce-scatter and an all-gather over MPI among the ranks that exchange across
nodes (``Channel.cross``).

Every exchange here is point to point (:func:`collectives.signed.signed_p2p`), straight from
the caller's arrays into the members' (no staging). For the all-reduce each member sends
piece ``k`` of its partial to member ``k``, reduces the pieces it received in member
(= node) order into its piece of the target, and the members all-gather their reduced
pieces in place. Each rank moves ``2 (n - 1) / n`` of the vector where the single
all-gather of every partial (the small-vector path) moves ``n - 1`` times it, and reduces
``1 / n`` of it where that path reduces all of it; the operations per element are the same,
in the same order, so the result is bitwise that path's, on every rank.

The call's signature travels to every member with the data (8 bytes, a tag of its own) and is
compared before any received byte is used: a mismatched call raises on every member instead
of truncating or hanging. The caller is a :class:`CrossHost` (the channel): its deadline,
board and failure handling wrap every wait.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from .ops import reduce_into
from .schedule import shard_bounds
from .signed import P2P_MAX_MEMBERS, P2PHost, signed_p2p, wait_all

__all__ = ["CROSS_RS_MIN_NBYTES", "P2P_MAX_MEMBERS", "reduce_across", "reduce_scatter_across"]

# vectors from this size on take the reduce-scatter + all-gather between nodes (below it the
# single signed all-gather has one exchange instead of three; measured on the 2-core VM with
# MPI's network path forced, 2 nodes: both alike at 32 KiB)
CROSS_RS_MIN_NBYTES = 32 << 10


# the point-to-point messages of each collective between nodes (calls are in order on a
# communicator, so a tag per collective is enough to keep them apart)
_TAGS = {"reduce_scatter": 0x5C1, "all_gather": 0x5C2, "broadcast": 0x5C3, "all_to_all": 0x5C4}
_GATHER_TAG = 0x5C5  # the all-reduce's reduced pieces, to every member
# the reduced pieces go to every member point to point up to this size a piece, beyond it
# through MPI's in-place Iallgatherv: at 2 simulated nodes on MPICH 128 KiB pieces took
# 21-24 us point to point against 35-57 us, 2 MiB pieces 236 us against 114 us
GATHER_P2P_MAX_PIECE = 256 << 10


class CrossHost(P2PHost, Protocol):
    """What the exchanges between nodes need of their caller (a
    :class:`~collectives.channel.Channel`): a signed exchange's host, and receive arrays
    reused across calls."""

    def cross_rows(self, members: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]: ...


def _u8(a: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return a.reshape(-1).view(np.uint8)


def reduce_across(
    ch: CrossHost,
    cross: MPI.Intracomm,
    src: np.ndarray[Any, Any],
    target: np.ndarray[Any, Any],
    op: str,
    acc: np.dtype[Any],
    avg_count: int | None,
    what: str,
) -> None:
    """``target = reduce(src of member 0, src of member 1, ...)`` in member order, on every
    member of ``cross`` (``reduce_into``'s rules: ``acc`` accumulation, one rounding into
    ``target``'s dtype, ``avg`` divided by ``avg_count``). ``src`` and ``target`` are flat and
    of one length; they may be the same array."""
    n, me = cross.Get_size(), cross.Get_rank()
    bounds = shard_bounds(src.shape[0], n)
    a, b = bounds[me]
    reduce_scatter_across(ch, cross, src, target[a:b], op, acc, avg_count, what)
    # all-gather the reduced pieces, in place (the signatures agreed in the reduce-scatter)
    if n <= P2P_MAX_MEMBERS and (b - a) * target.dtype.itemsize <= GATHER_P2P_MAX_PIECE:
        reqs = [
            cross.Irecv([target[p:q], MPI.BYTE], source=k, tag=_GATHER_TAG)
            for k, (p, q) in enumerate(bounds)
            if k != me and q > p
        ]
        if b > a:
            mine = target[a:b]
            reqs += [
                cross.Isend([mine, MPI.BYTE], dest=k, tag=_GATHER_TAG) for k in range(n) if k != me
            ]
        wait_all(ch, reqs, what, keep=target)
        return
    tsz = target.dtype.itemsize
    counts = [(q - p) * tsz for p, q in bounds]
    displs = [p * tsz for p, _ in bounds]
    req = cross.Iallgatherv(MPI.IN_PLACE, [_u8(target), (counts, displs), MPI.BYTE])
    ch.mpi_wait(req, what, keep=target)


def reduce_scatter_across(
    ch: CrossHost,
    comm: MPI.Intracomm,
    src: np.ndarray[Any, Any],
    target: np.ndarray[Any, Any],
    op: str,
    acc: np.dtype[Any],
    avg_count: int | None,
    what: str,
) -> None:
    """``target`` = my shard (``shard_bounds(len(src), members)[my rank]``) of the reduction
    of every member's ``src`` in member order (``reduce_into``'s rules): each member sends
    piece ``k`` of ``src`` to member ``k`` straight from ``src`` (point to point, with no copy
    of its own piece) while the call's signatures are all-gathered, and reduces what it
    received. ``target`` may overlap ``src`` only at my own piece."""
    n = comm.Get_size()
    me = comm.Get_rank()
    bounds = shard_bounds(src.shape[0], n)
    a, b = bounds[me]
    isz = src.dtype.itemsize
    rows = ch.cross_rows(n, (b - a) * isz)
    u8 = _u8(src)
    own = src[a:b]
    if np.may_share_memory(target, src):  # in place: reduce_into writes before it reads mine
        rows[me, : own.nbytes] = own.view(np.uint8)
        own = rows[me].view(src.dtype)
    signed_p2p(
        ch,
        comm,
        what,
        _TAGS["reduce_scatter"],
        sends=[(k, u8[p * isz : q * isz]) for k, (p, q) in enumerate(bounds) if k != me],
        recvs=[(k, rows[k]) for k in range(n) if k != me],
        keep=(src, rows),
    )
    pieces = [own if k == me else rows[k].view(src.dtype) for k in range(n)]
    reduce_into(target, pieces, op, acc, avg_count=avg_count)


def all_gather_across(
    ch: CrossHost,
    comm: MPI.Intracomm,
    send: np.ndarray[Any, Any],
    dst: np.ndarray[Any, Any],
    what: str,
) -> None:
    """``dst`` (members x ``send``, flat) = every member's ``send``, in member order: sent
    point to point straight from ``send`` into each member's ``dst`` (no staging)."""
    n, me = comm.Get_size(), comm.Get_rank()
    nbytes = send.nbytes
    out = _u8(dst)
    src = _u8(send)
    if np.may_share_memory(out, src):  # the input is part of the output: send a copy
        src = src.copy()
    signed_p2p(
        ch,
        comm,
        what,
        _TAGS["all_gather"],
        sends=[(k, src) for k in range(n) if k != me],
        recvs=[(k, out[k * nbytes : (k + 1) * nbytes]) for k in range(n) if k != me],
        keep=(src, dst),
    )
    out[me * nbytes : (me + 1) * nbytes] = src


def broadcast_across(
    ch: CrossHost,
    comm: MPI.Intracomm,
    src: np.ndarray[Any, Any],
    dst: np.ndarray[Any, Any],
    root: int,
    what: str,
) -> None:
    """``dst`` = the root's ``src`` on every member, point to point from the root, which
    copies its ``src`` into its own ``dst`` while the data travels (it sends from ``src``:
    a buffer MPI just sent from is slow to write, 6x for 4 MiB here)."""
    me = comm.Get_rank()
    out = _u8(dst)
    data = _u8(src) if me == root else out
    others = [k for k in range(comm.Get_size()) if k != root]

    def copy_mine() -> None:
        if me == root and not np.shares_memory(out, data):
            out[...] = data

    signed_p2p(
        ch,
        comm,
        what,
        _TAGS["broadcast"],
        sends=[(k, data) for k in others] if me == root else [],
        recvs=[] if me == root else [(root, out)],
        keep=(src, dst),
        meanwhile=copy_mine,
    )


def all_to_all_across(
    ch: CrossHost,
    comm: MPI.Intracomm,
    src: np.ndarray[Any, Any],
    dst: np.ndarray[Any, Any],
    what: str,
) -> None:
    """Chunk ``j`` of my ``src`` to member ``j``, chunk ``i`` of my ``dst`` from member ``i``
    (flat, ``members`` chunks each), point to point, my own chunk copied locally while the
    messages are in flight."""
    n, me = comm.Get_size(), comm.Get_rank()
    s_u8, d_u8 = _u8(src), _u8(dst)
    if np.may_share_memory(s_u8, d_u8):  # in place: the chunks sent must not be overwritten
        s_u8 = s_u8.copy()
    c = s_u8.nbytes // n

    def copy_mine() -> None:  # while the messages are in flight
        d_u8[me * c : (me + 1) * c] = s_u8[me * c : (me + 1) * c]

    signed_p2p(
        ch,
        comm,
        what,
        _TAGS["all_to_all"],
        sends=[(k, s_u8[k * c : (k + 1) * c]) for k in range(n) if k != me],
        recvs=[(k, d_u8[k * c : (k + 1) * c]) for k in range(n) if k != me],
        keep=(s_u8, dst),
        meanwhile=copy_mine,
    )
