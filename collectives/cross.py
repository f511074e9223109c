"""The all-reduce's phase between nodes, for large vectors: a reduce-scatter and an all-gather
over MPI among the ranks that exchange across nodes (``Channel.cross``).

Each member sends piece ``k`` of its partial to member ``k`` (one ``Ialltoallv`` straight
from the partial: no staging), reduces the pieces it received in member (= node) order into
its piece of the target, and the members all-gather their reduced pieces in place
(``Iallgatherv``). Each rank moves ``2 (n - 1) / n`` of the vector where the single all-gather
of every partial (the small-vector path) moves ``n - 1`` times it, and reduces ``1 / n`` of it
where that path reduces all of it; the operations per element are the same, in the same
order, so the result is bitwise that path's, on every rank.

The call's signature is all-gathered first (8 bytes a member,
:func:`collectives.signed.agree_first`): the data exchanges carry none, so sizes are known to
agree before any byte moves, and a mismatched call raises on every member instead of
truncating or hanging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from . import signed
from .ops import reduce_into
from .schedule import shard_bounds

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["CROSS_RS_MIN_NBYTES", "reduce_across", "reduce_scatter_across"]

# vectors from this size on take the reduce-scatter + all-gather between nodes (below it the
# single signed all-gather has one exchange instead of three; measured on the 2-core VM with
# MPI's network path forced, 2 nodes: both alike at 32 KiB)
CROSS_RS_MIN_NBYTES = 32 << 10


_TAG = 0x5C  # the pieces' messages on the channel's own communicator (calls are in order)


def _u8(a: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return a.reshape(-1).view(np.uint8)


def reduce_across(
    ch: Channel,
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
    bounds = shard_bounds(src.shape[0], cross.Get_size())
    a, b = bounds[cross.Get_rank()]
    reduce_scatter_across(ch, cross, src, target[a:b], op, acc, avg_count, what)
    # all-gather the reduced pieces, in place
    tsz = target.dtype.itemsize
    counts = [(q - p) * tsz for p, q in bounds]
    displs = [p * tsz for p, _ in bounds]
    req = cross.Iallgatherv(MPI.IN_PLACE, [_u8(target), (counts, displs), MPI.BYTE])
    ch.mpi_wait(req, what, keep=target)


def reduce_scatter_across(
    ch: Channel,
    comm: MPI.Intracomm,
    src: np.ndarray[Any, Any],
    target: np.ndarray[Any, Any],
    op: str,
    acc: np.dtype[Any],
    avg_count: int | None,
    what: str,
) -> None:
    """``target`` = my shard (``shard_bounds(len(src), members)[my rank]``) of the reduction
    of every member's ``src`` in member order (``reduce_into``'s rules): the call's signature
    all-gathered, then each member sends piece ``k`` of ``src`` to member ``k`` straight from
    ``src`` (``Ialltoallv``) and reduces what it received. ``target`` may overlap ``src``
    only at my own piece."""
    signed.agree_first(ch, comm, what, "member")
    n = comm.Get_size()
    me = comm.Get_rank()
    bounds = shard_bounds(src.shape[0], n)
    a, b = bounds[me]
    isz = src.dtype.itemsize
    rows = ch.cross_rows(n, (b - a) * isz)
    # point to point, with no copy of my own piece (MPI's all-to-all copies it: 3.5 ms at
    # 16 MiB between 2 nodes against 0.9 ms for the exchange itself)
    u8 = _u8(src)
    reqs = [comm.Irecv([rows[k], MPI.BYTE], source=k, tag=_TAG) for k in range(n) if k != me]
    reqs += [
        comm.Isend([u8[p * isz : q * isz], MPI.BYTE], dest=k, tag=_TAG)
        for k, (p, q) in enumerate(bounds)
        if k != me
    ]
    own = src[a:b]
    if np.may_share_memory(target, src):  # in place: reduce_into writes before it reads mine
        rows[me, : own.nbytes] = own.view(np.uint8)
        own = rows[me].view(src.dtype)
    ch.mpi_wait_all(reqs, what, keep=(src, rows))
    pieces = [own if k == me else rows[k].view(src.dtype) for k in range(n)]
    reduce_into(target, pieces, op, acc, avg_count=avg_count)
