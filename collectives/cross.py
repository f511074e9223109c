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

__all__ = ["CROSS_RS_MIN_NBYTES", "reduce_across"]

# vectors from this size on take the reduce-scatter + all-gather between nodes (below it the
# single signed all-gather has one exchange instead of three; measured on the 2-core VM with
# MPI's network path forced, 2 nodes: both alike at 32 KiB)
CROSS_RS_MIN_NBYTES = 32 << 10


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
    signed.agree_first(ch, cross, what, "member")
    n = cross.Get_size()
    me = cross.Get_rank()
    bounds = shard_bounds(src.shape[0], n)
    a, b = bounds[me]
    isz, tsz = src.dtype.itemsize, target.dtype.itemsize
    # reduce-scatter: piece k of my src to member k; piece `me` of every member's src here
    rows = ch.cross_rows(n, (b - a) * isz)
    send = ([(q - p) * isz for p, q in bounds], [p * isz for p, _ in bounds])
    recv = ([(b - a) * isz] * n, [k * (b - a) * isz for k in range(n)])
    s_u8, r_u8 = _u8(src), rows.reshape(-1)
    req = cross.Ialltoallv([s_u8, send, MPI.BYTE], [r_u8, recv, MPI.BYTE])
    ch.mpi_wait(req, what, keep=(src, rows))
    pieces = rows.view(src.dtype).reshape(n, b - a)
    reduce_into(target[a:b], list(pieces), op, acc, avg_count=avg_count)
    # all-gather the reduced pieces, in place
    counts = [(q - p) * tsz for p, q in bounds]
    displs = [p * tsz for p, _ in bounds]
    req = cross.Iallgatherv(MPI.IN_PLACE, [_u8(target), (counts, displs), MPI.BYTE])
    ch.mpi_wait(req, what, keep=target)
