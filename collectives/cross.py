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

import contextlib
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from .ops import reduce_into
from .schedule import shard_bounds
from .signed import (
    P2P_MAX_MEMBERS,
    P2P_TRUNCATION_REPORTED,
    SIG_TAG,
    P2PHost,
    Persistent,
    compare,
    signed_block,
    signed_p2p,
    truncated,
    wait_all,
)

__all__ = [
    "CROSS_RS_MIN_NBYTES",
    "GATHER_P2P_MAX_NBYTES",
    "P2P_MAX_MEMBERS",
    "PeerReduce",
    "gathers_p2p",
    "peer_reduce_fits",
    "reduce_across",
    "reduce_scatter_across",
]

# vectors from this size on take the reduce-scatter + all-gather between nodes (below it the
# single signed all-gather has one exchange instead of three; measured on the 2-core VM with
# MPI's network path forced, 2 nodes: both alike at 32 KiB)
CROSS_RS_MIN_NBYTES = 32 << 10


# the point-to-point messages of each collective between nodes (calls are in order on a
# communicator, so a tag per collective is enough to keep them apart)
_TAGS = {"reduce_scatter": 0x5C1, "all_gather": 0x5C2, "broadcast": 0x5C3, "all_to_all": 0x5C4}
_GATHER_TAG = 0x5C5  # the all-reduce's reduced pieces, to every member
# the reduced pieces go to every member point to point for vectors up to this size, beyond
# it through MPI's in-place Iallgatherv. One job, MPICH, simulated nodes, x MPI_Allreduce,
# Iallgatherv / point to point: 2 nodes 4 MiB 1.22 / 1.43, 16 MiB 1.33 / 1.42; 3 nodes
# 1 MiB 1.58 / 1.85, 16 MiB 1.87 / 2.22; 4 nodes 1 MiB 0.94 / 0.99, 16 MiB 1.32 / 1.36;
# Open MPI (tcp) 2 nodes 4 MiB 0.96 / 1.04, 4 nodes 4 MiB 1.17 / 1.21. The rule reads the
# vector's size, the same on every member (a member's own piece may be one element longer),
# and PeerReduce's persistent messages are these, so members may take either.
GATHER_P2P_MAX_NBYTES = 16 << 20


def gathers_p2p(members: int, nbytes: int) -> bool:
    """Whether :func:`reduce_across` of a vector of ``nbytes`` across ``members`` all-gathers
    its reduced pieces point to point (else ``Iallgatherv``)."""
    return members <= P2P_MAX_MEMBERS and nbytes <= GATHER_P2P_MAX_NBYTES


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
    if gathers_p2p(n, target.nbytes):
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
    signed_p2p(
        ch,
        comm,
        what,
        _TAGS["reduce_scatter"],
        sends=[(k, u8[p * isz : q * isz]) for k, (p, q) in enumerate(bounds) if k != me],
        recvs=[(k, rows[k]) for k in range(n) if k != me],
        keep=(src, rows),
    )
    in_place = np.may_share_memory(target, src)
    _reduce_rows(rows, me, src[a:b], target, in_place, op, acc, avg_count)


def _reduce_rows(
    rows: np.ndarray[Any, np.dtype[np.uint8]],
    me: int,
    own: np.ndarray[Any, Any],
    target: np.ndarray[Any, Any],
    in_place: bool,
    op: str,
    acc: np.dtype[Any],
    avg_count: int | None,
) -> None:
    """``target`` = the reduction, in member order, of the received ``rows`` with my own
    piece ``own`` in row ``me``'s place (``reduce_into``'s rules). ``in_place``: ``target``
    is ``own``'s memory, which reduce_into writes before it reads: ``own`` is copied into
    row ``me`` first."""
    if in_place:
        rows[me, : own.nbytes] = own.view(np.uint8)
        own = rows[me].view(own.dtype)
    pieces = [own if k == me else rows[k].view(own.dtype) for k in range(rows.shape[0])]
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


def peer_reduce_fits(members: int, nbytes: int) -> bool:
    """Whether an all-reduce of ``nbytes`` across ``members`` takes :class:`PeerReduce`: where
    :func:`reduce_across` all-gathers point to point (a PeerReduce holds receive rows as large
    as the vector, each piece's, for the plan's life: up to ``GATHER_P2P_MAX_NBYTES``).
    Persistent against made per call, one job, 4 simulated nodes, x MPI_Allreduce: 4 MiB
    1.16-1.17 / 1.02, 16 MiB 1.50 / 1.42."""
    return members > 1 and gathers_p2p(members, nbytes)


def _at(addr: int, nbytes: int) -> list[Any]:
    """An MPI message of ``nbytes`` at ``addr``: no reference to the array kept (a persistent
    request outlives the call whose arrays it was made for)."""
    return [MPI.buffer.fromaddress(addr, nbytes), MPI.BYTE]


class PeerReduce:
    """:func:`reduce_across`'s exchanges for one pair of buffers (a source and a target at
    fixed addresses), made once as persistent requests (``Recv_init``/``Send_init``) and
    started per call: the same messages, signatures and reduction, so bitwise its result,
    without making a dozen requests a call (4 simulated nodes, 128 KiB / 256 KiB, mpi4py
    alone: 171 / 174 us made per call, 141 / 155 us persistent; MPI_Allreduce 136 / 161 us).

    The requests hold addresses, not the arrays: :meth:`run` is given the call's arrays,
    which must be at those addresses (:meth:`fits`), and keeps them alive only while a
    request is active. A call that does not complete leaves them busy (in ``host.pending``,
    with the arrays): the owner drops this exchange and never starts it again. For
    ``P2P_MAX_MEMBERS`` members at most (:func:`peer_reduce_fits`)."""

    def __init__(
        self,
        cross: MPI.Intracomm,
        signature: int,
        src: np.ndarray[Any, Any],
        target: np.ndarray[Any, Any],
        rows: np.ndarray[Any, np.dtype[np.uint8]] | None = None,
    ) -> None:
        n, me = cross.Get_size(), cross.Get_rank()
        isz = src.dtype.itemsize
        self.key = (MPI.buffer(src).address, MPI.buffer(target).address)
        sa, ta = self.key
        self.bounds = bounds = shard_bounds(src.shape[0], n)
        a, b = bounds[me]
        self.me, self.dtype = me, src.dtype
        shape = (n, (b - a) * isz)  # (``rows``: another exchange's of this shape, idle)
        self.rows = rows if rows is not None and rows.shape == shape else np.empty(shape, np.uint8)
        block = signed_block(0, signature)
        self.sigs = np.zeros((n, 8), np.uint8)
        self.sigs[me] = block
        self._expected = block.tobytes() * n
        others = [k for k in range(n) if k != me]
        rs_tag, ag_tag = _TAGS["reduce_scatter"], _GATHER_TAG
        sig_in = [cross.Recv_init([self.sigs[k], MPI.BYTE], k, SIG_TAG) for k in others]
        sig_out = [cross.Send_init([block, MPI.BYTE], k, SIG_TAG) for k in others]
        data_in = [cross.Recv_init([self.rows[k], MPI.BYTE], k, rs_tag) for k in others]
        data_out = [
            cross.Send_init(_at(sa + p * isz, (q - p) * isz), k, rs_tag)
            for k, (p, q) in enumerate(bounds)
            if k != me
        ]
        self._reqs = sig_in + sig_out + data_in + data_out  # (to free)
        self._sig = Persistent(sig_in + sig_out)
        self._scatter = Persistent(data_in + data_out)
        # every receive is posted before any send (signed_p2p's order); the data moves with
        # the signatures where a truncated message is a clean error (P2P_TRUNCATION_REPORTED)
        self._early = P2P_TRUNCATION_REPORTED
        first = sig_in + data_in + sig_out + data_out if self._early else sig_in + sig_out
        self._first = Persistent(first)
        gather = [
            cross.Recv_init(_at(ta + p * isz, (q - p) * isz), k, ag_tag)
            for k, (p, q) in enumerate(bounds)
            if k != me and q > p
        ]
        if b > a:
            gather += [cross.Send_init(_at(ta + a * isz, (b - a) * isz), k, ag_tag) for k in others]
        self._reqs += gather
        self._gather = Persistent(gather)
        self.in_place = sa == ta
        self._block = block  # (the signature's send buffer)
        self.busy = False  # started and not completed: never start it again

    def fits(self, src: np.ndarray[Any, Any], target: np.ndarray[Any, Any]) -> bool:
        """Whether this call's arrays are the ones this exchange was made for."""
        return (
            not self.busy
            and src.flags.c_contiguous
            and target.flags.c_contiguous
            and (MPI.buffer(src).address, MPI.buffer(target).address) == self.key
        )

    def run(
        self,
        host: CrossHost,
        src: np.ndarray[Any, Any],
        target: np.ndarray[Any, Any],
        op: str,
        acc: np.dtype[Any],
        avg_count: int | None,
        what: str,
    ) -> None:
        """:func:`reduce_across` of ``src`` into ``target`` (the arrays it was made for)."""
        if self.busy:  # (closed, or a call that never completed: its requests may be active)
            raise RuntimeError(f"{what}: internal error: a persistent exchange reused after close")
        me = self.me
        a, b = self.bounds[me]
        keep = (self, src, target)  # (what an active request writes or reads)
        self.busy = True
        try:
            self._first.start()
            host.mpi_wait(self._sig, what, keep)  # type: ignore[arg-type]
            if self.sigs.tobytes() != self._expected:
                compare(host, self.sigs.view(np.int64)[:, 0].copy(), what, "member")
            if not self._early:
                self._scatter.start()
            host.mpi_wait(self._scatter, what, keep)  # type: ignore[arg-type]
            own, mine = src[a:b], target[a:b]
            _reduce_rows(self.rows, me, own, mine, self.in_place, op, acc, avg_count)
            if self._gather.reqs:
                self._gather.start()
                host.mpi_wait(self._gather, what, keep)  # type: ignore[arg-type]
            self.busy = False
        except MPI.Exception as exc:
            truncated(host, what, exc)
        finally:
            if self.busy:  # never completed (or never started): MPI may still use the buffers
                host.pending.extend((r, keep) for r in self._reqs)

    def close(self) -> None:
        """Free the persistent requests (kept, with their buffers, while still busy)."""
        if not self.busy:
            for req in self._reqs:
                with contextlib.suppress(MPI.Exception):
                    req.Free()
        self._reqs = []
        self.busy = True  # (never started again)
