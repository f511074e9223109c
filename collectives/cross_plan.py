"""The small broadcast, all-gather, reduce-scatter and all-to-all across nodes, from a cached
plan: one signed exchange of every member's whole input, its call signature travelling with
it (:func:`collectives.signed.persistent_gather`: one round of persistent point-to-point
messages up to :data:`~collectives.signed.P2P_MAX_MEMBERS` members, a persistent MPI
all-gather behind a signature all-gather beyond), started per call.

Each member keeps what the collective gives it: the root's row (broadcast), every row
(all-gather), its chunk of every row (all-to-all) or its shard of every row reduced in member
order (reduce-scatter: the operations of :func:`collectives.cross.reduce_scatter_across`, in
its order, so bitwise its result). One exchange where the point-to-point path has a round of
signatures and a round of data, and a persistent collective skips MPI's per-call schedule: the
calls where MPI's own latency is the whole cost (4 KiB between 2 simulated nodes: about 21 us
through the point-to-point path, MPI's ``Bcast`` 1.9 us).

The first call of a shape goes through the general path and makes the plan there (beyond
8 members MPI's ``Allgather_init`` is collective: every member makes it in the same call);
later calls of the shape replay it, from the Communicator's fast path where it has one. A
member in another call of the same size class meets the others in the same exchange and every
member raises :class:`~shmem.errors.CollectiveMismatchError` (the signatures); one in a call
of another size is found on the board (``Channel.check_board``), as on the general path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from shmem import SHMEMBuffer

from .channel import Flag
from .ops import reduce_into
from .replay import cached_plan
from .schedule import shard_bounds
from .signed import SMALL_BLOCK, abandoned, persistent_gather

if TYPE_CHECKING:
    from .channel import Channel
    from .operand import Operand

__all__ = ["CrossPlan", "cross_plan"]


class CrossPlan:
    """The cached plan of one small call across nodes (``kind``, ``count`` elements of
    ``dtype`` per member, ``extra``: a broadcast's root, a reduce-scatter's op, else 0).
    Made collectively (see the module); :meth:`run` replays it."""

    algorithm = "cross"
    fast = None  # no C replay: the host engine records its calls in the flight recorder

    def __init__(
        self,
        ch: Channel,
        kind: str,
        count: int,
        dtype: np.dtype[Any],
        extra: object,
        acc: np.dtype[Any] | None = None,
    ) -> None:
        n, me = ch.world_size, ch.rank
        self.kind, self.count, self.dtype, self.extra, self.acc = kind, count, dtype, extra, acc
        self.where = f"Communicator.{kind}"
        self.signature = ch.signature  # the call that made the plan: the same every replay
        self.scratch = ch.scratch_buf  # (the Communicator replays plans of the live scratch)
        self.auto = True
        self.closed = False  # dropped from the cache (collectives.replay.cached_plan)
        nbytes = count * dtype.itemsize
        self.gather = persistent_gather(ch.comm, nbytes, self.signature)
        self.send = self.gather.data_out.view(dtype)  # my input goes here, then run()
        rows = [self.gather.data[k].view(dtype) for k in range(n)]  # valid for the plan's life
        self.rows = rows
        self.out_count = count * n if kind == "all_gather" else count
        self.pieces: list[np.ndarray[Any, Any]] = []
        if kind == "all_to_all":
            c = count // n
            self.pieces = [row[me * c : (me + 1) * c] for row in rows]
        elif kind == "reduce_scatter":
            a, b = shard_bounds(count, n)[me]
            self.pieces = [row[a:b] for row in rows]
            self.out_count = b - a
        self.members = n

    def close(self) -> None:
        """Free the persistent request (drop_plan); a reference kept elsewhere is then
        looked up again, never replayed."""
        self.auto = False
        self.closed = True
        self.gather.close()

    def run(
        self,
        ch: Channel,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
    ) -> None:
        """One call: ``x`` (flat, ``count`` elements), or the SHMEMBuffer ``shm`` where
        given, in; the result into ``dst`` (flat). The input is copied out before ``dst`` is
        written, so they may overlap (``in_place`` needs nothing more here)."""
        where = self.where
        ch.signature = self.signature

        def abandon(exc: BaseException) -> None:  # the others stop at once
            self.gather.abandon(ch, where, abandoned(exc))

        s = ch.begin(where, abandon)  # node-local peers are done with the previous call
        # (the Communicator's fast path hands a zero-copy input as ``shm`` alone)
        np.copyto(self.send, x if shm is None else shm.local().reshape(-1))
        self.gather.run(ch, where)  # a member in another call: every member raises
        kind = self.kind
        if kind == "broadcast":
            np.copyto(dst, self.rows[cast(int, self.extra)])
        elif kind == "all_gather":
            np.copyto(dst.reshape(self.members, self.count), self.gather.data.view(self.dtype))
        elif kind == "all_to_all":
            for chunk, piece in zip(dst.reshape(self.members, -1), self.pieces, strict=True):
                np.copyto(chunk, piece)
        else:
            acc = cast("np.dtype[Any]", self.acc)
            reduce_into(dst, self.pieces, str(self.extra), acc, avg_count=self.members)
        ch.post(Flag.DONE, s)


def cross_plan(
    ch: Channel, kind: str, xin: Operand, extra: object = 0, acc: np.dtype[Any] | None = None
) -> CrossPlan | None:
    """The cached plan of this small ``kind`` call across nodes (made on first use), or None
    where the call does not qualify: one node, debug checks on (the general path agrees the
    arguments first), or every member's input and signature more than
    :data:`collectives.signed.SMALL_BLOCK` in all."""
    count, dtype = xin.count, xin.dtype
    if ch.num_nodes == 1 or ch.check_args:
        return None
    if ch.world_size * (count * dtype.itemsize + 8) > SMALL_BLOCK:
        return None
    key = (kind, count, dtype, extra)
    plan: CrossPlan = cached_plan(
        ch, key, lambda: CrossPlan(ch, kind, count, dtype, extra, acc), acc
    )
    return plan
