"""One host collective call, one pipeline: agree -> plan -> move -> finish (package-internal).

Every collective of the family (``all_gather``, ``broadcast``, ``all_to_all``,
``reduce_scatter``) is a :class:`Call` (its module says what it validates, what its
signature names, and what each route does with the data), run by :func:`run`:

1. **agree**: the arguments validated alike on every rank and the call's signature set
   (:func:`collectives.operand.prepare`; compared across ranks in debug mode);
2. **plan**: the route (:meth:`Call.route`: point to point between nodes, one signed MPI
   exchange, the node-local exchange, or another collective) and, for a small call, the
   shape's cached plan (:meth:`Call.plan`), made on first use and replayed, from the
   engine's fast path where it has one;
3. **move**: the data, by the route, with the guarantees applied once around it
   (:meth:`collectives.channel.Channel.begin`: the call's sequence number, the previous
   call finished on the node and its signature compared, and on a failure there this rank
   takes part in the exchange between nodes as abandoned, so those ranks stop at once;
   every wait inside the move is within the deadline);
4. **finish**: ``DONE`` raised, and for a zero-copy input every peer's ``DONE`` awaited and a
   result that overlapped it copied into place.

A cached plan runs the same four steps in its own replay (:mod:`collectives.replay`).
"""

from __future__ import annotations

import contextlib
from typing import ClassVar, Protocol

import numpy as np
from mpi4py import MPI

from shmem import SHMEMBuffer
from shmem.errors import ShmemError

from . import signed
from .channel import Channel, Flag
from .cross import P2P_MAX_MEMBERS
from .operand import Array, Operand, prepare

__all__ = [
    "ACROSS",
    "DELEGATED",
    "ON_NODE",
    "OVER_MPI",
    "Call",
    "General",
    "Move",
    "Plan",
    "Replay",
    "perform",
]

ACROSS = "across"
"""Between nodes, point to point (:mod:`collectives.cross`), the signatures alongside."""
OVER_MPI = "over_mpi"
"""One signed MPI exchange (:mod:`collectives.signed`): many members, or beyond the scratch."""
ON_NODE = "on_node"
"""The node-local exchange: inputs published, read through peer views."""
DELEGATED = "delegated"
"""Run as another collective (a reduce-scatter as the all-reduce, then its shard)."""


class Plan(Protocol):
    """What a cached plan offers the pipeline (:mod:`collectives.replay`,
    :mod:`collectives.cross_plan`): one replayed call."""

    def run(
        self, ch: Channel, x: Array, shm: SHMEMBuffer | None, dst: Array, in_place: bool
    ) -> None: ...


class Move(Protocol):
    """What the plan step gives: the way this call's data moves, and its finish."""

    def move(self, ch: Channel, xin: Operand, dst: Array) -> None: ...


class Call:
    """One collective's part of the pipeline (a subclass per collective, in its module):
    what it validates, what its signature names beyond count and dtype (``extra``), how
    long its output is, and what each route does with the data."""

    kind: ClassVar[str] = ""
    default_out_is_x: ClassVar[bool] = False  # out=None writes into x (broadcast)

    def __init__(self, ch: Channel, extra: tuple[object, ...] = ()) -> None:
        self.size, self.rank = ch.world_size, ch.rank
        self.where = f"Communicator.{self.kind}"
        self.extra = extra
        self.readers: list[int] | None = None  # the ranks the node-local route reads (all)
        # the elements [a, b) of my input no peer reads on the node-local route (my shard of a
        # reduce-scatter): a numpy input's are not staged, combine reads them where they are
        self.unread = (0, 0)

    def out_count(self, n: int) -> int:
        """The output's element count for an input of ``n``."""
        return n

    def validate(self, xin: Operand) -> None:
        """Raise ``CollectiveArgumentError`` on an argument no route can take."""

    def plan(self, ch: Channel, xin: Operand) -> Move:
        """The plan step: the route, and on it a small call's cached plan (replayed) or
        the general move."""
        route = self.route(ch, xin)
        if route == ON_NODE:
            ch.stats.count(self.kind)
        cached = self.cached(ch, xin, route)
        return General(self, route) if cached is None else Replay(cached)

    def route(self, ch: Channel, xin: Operand) -> str:
        """The family's rule: between nodes point to point up to :data:`P2P_MAX_MEMBERS`
        members, one signed MPI exchange beyond them or beyond the scratch, else on the
        node."""
        if ch.num_nodes > 1 and self.size <= P2P_MAX_MEMBERS:
            return ACROSS
        return ON_NODE if ch.fits_scratch(xin) else OVER_MPI

    def cached(self, ch: Channel, xin: Operand, route: str) -> Plan | None:
        """The cached plan of this small call on ``route`` (made on first use), or None."""
        return None

    def across(self, ch: Channel, xin: Operand, dst: Array) -> None:
        """Move the data between nodes, point to point."""
        raise NotImplementedError

    def over_mpi(self, ch: Channel, xin: Operand, dst: Array) -> None:
        """Move the data in one signed MPI exchange."""
        raise NotImplementedError

    def kept(self, xin: Operand, dst: Array) -> bool:
        """Whether ``dst``, overlapping my input, is its result as it stands (a broadcast's
        root in place): nothing to keep aside."""
        return False

    def combine(self, ranks: list[int], inputs: list[Array], target: Array) -> None:
        """The node-local route's result from the inputs of ``ranks`` (the readers)."""
        raise NotImplementedError

    def delegate(self, ch: Channel, xin: Operand, dst: Array) -> None:
        """The ``DELEGATED`` route: run as another collective."""
        raise NotImplementedError


def perform(
    ch: Channel, call: Call, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    """One call of ``call``'s collective: agree, plan, move, finish (see the module)."""
    xin, ret, dst = prepare(
        ch, call.where, x, out, call.out_count, call.extra, call.validate, call.default_out_is_x
    )
    move: Move = call.plan(ch, xin)  # a cached plan, replayed, or the route's general move
    move.move(ch, xin, dst)  # the guarantees applied once around it, then the finish
    return ret


class Replay:
    """A cached plan's move: replayed (it applies the guarantees itself)."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def move(self, ch: Channel, xin: Operand, dst: Array) -> None:
        in_place = xin.shmem is not None and bool(np.may_share_memory(dst, xin.array))
        self.plan.run(ch, xin.array, xin.shmem, dst, in_place)


class General:
    """A general route's move: ``ACROSS``, ``OVER_MPI`` or ``ON_NODE`` within the guarantees
    (:meth:`~collectives.channel.Channel.begin`) and with its finish; ``DELEGATED`` as the
    other collective, which applies them itself."""

    __slots__ = ("call", "route")

    def __init__(self, call: Call, route: str) -> None:
        self.call, self.route = call, route

    def move(self, ch: Channel, xin: Operand, dst: Array) -> None:
        call, route = self.call, self.route
        if route == ON_NODE:
            _on_node(ch, ch.begin(call.where), call, xin, dst)
            return
        if route == DELEGATED:
            call.delegate(ch, xin, dst)
            return
        between = call.across if route == ACROSS else call.over_mpi

        def abandon(exc: BaseException) -> None:  # ranks of other nodes wait in the exchange:
            ch.signature = signed.abandoned(exc)  # meet them as abandoned, they stop at once
            with contextlib.suppress(MPI.Exception, ShmemError):
                between(ch, xin, dst)

        s = ch.begin(call.where, abandon)
        between(ch, xin, dst)
        ch.post(Flag.DONE, s)  # node-local peers may reuse their scratch


def _on_node(ch: Channel, s: int, call: Call, xin: Operand, dst: Array) -> None:
    """The node-local exchange of call ``s``: publish my input (only where a peer reads it:
    a broadcast's non-roots stage nothing, a reduce-scatter's numpy input all but my shard,
    which combine reads from my array: ``Call.unread``), wait for every local rank's ``READY`` (and
    signature: a rank in another call, such as a broadcast's other root, is found by every
    rank in this call, not only by the readers), combine the readers' inputs, raise ``DONE``;
    for a zero-copy input that peers read, wait for their ``DONE`` (they have read it), the
    result kept aside meanwhile where it overlaps that input."""
    where = call.where
    staged = xin.shmem is None
    readers = ch.local_peers if call.readers is None else call.readers
    read = ch.rank in readers  # whether peers read my input
    a, b = call.unread if staged else (0, 0)  # (a numpy input's stay where they are,
    if b > a and np.may_share_memory(dst, xin.array):  # unless the result overwrites them)
        a = b = 0
    nbytes = xin.count * xin.dtype.itemsize
    ch.publish(s, xin, nbytes, 0, None if read else 0, unread=(a, b), timed=call.readers is None)
    ch.wait_peers(Flag.READY, s, where)
    aside = (
        read
        and not staged
        and bool(np.may_share_memory(dst, xin.array))
        and not call.kept(xin, dst)
    )
    target: Array = np.empty_like(dst) if aside else dst
    inputs: list[Array] = [
        xin.array if r == ch.rank and b > a else ch.peer_input(r, xin.count, xin.dtype)
        for r in readers
    ]
    call.combine(readers, inputs, target)
    ch.post(Flag.DONE, s)
    if read and not staged:  # the caller owns x again once every peer has read it
        ch.wait_peers(Flag.DONE, s, where)
        if aside:
            np.copyto(dst, target)
