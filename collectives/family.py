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
from typing import cast

import numpy as np
from mpi4py import MPI

from shmem import SHMEMBuffer
from shmem.errors import CollectiveMismatchError, PeerFailedError, ShmemError

from . import signed
from .channel import Channel, Flag
from .operand import Array, Operand
from .replay import TINY_NBYTES, ReplayPlan, cached_plan

__all__ = ["FamilyPlan", "exchange", "family_plan", "over_mpi"]


def exchange(
    ch: Channel,
    where: str,
    xin: Operand,
    dst: Array,
    read: Callable[[int, Array, Array], None],
    peers: list[int] | None = None,
) -> None:
    """One node-local round: publish my input, wait for every local rank's, ``read(rank,
    input_of_rank, tmp_or_dst)`` for each rank in ``peers`` (default: every local rank, in
    rank order), then DONE.

    When ``dst`` overlaps my zero-copy input, reads go to a temporary copied into ``dst`` once
    every peer has finished reading my input.
    """
    s = ch.next_call()
    staged = xin.shmem is None
    ch.wait_previous(s, where)
    ch.publish(s, xin, xin.count * xin.dtype.itemsize)
    readers = ch.local_peers if peers is None else peers
    # every rank's READY (and call signature), not only the readers': a rank whose call
    # differs (a broadcast's root) is then found by every rank, in this call
    ch.wait_peers(Flag.READY, s, where)
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
    except (CollectiveMismatchError, PeerFailedError) as exc:
        ch.signature = signed.abandoned(exc)  # take part as abandoned: the others stop at once
        with contextlib.suppress(MPI.Exception, ShmemError):
            run()
        raise
    run()
    ch.post(Flag.DONE, s)


class FamilyPlan(ReplayPlan):
    """A cached small broadcast or all-gather on one node, replayed like the all-reduce's
    :class:`~collectives.allreduce_plans.TinyPlan` (in C where the extension is built): every
    rank publishes its input with the call's tag in ``SRC`` and raises ``READY``, waits for
    every node-local rank's ``READY`` (a broadcast's non-roots too, so every rank checks
    every other rank's call at once, where :func:`exchange` waits for the root only and
    compares the rest one call later), copies the root's input (broadcast) or every input
    in rank order (all_gather), raises ``DONE`` and, for a zero-copy input, waits for the
    peers' ``DONE``. Made by the first such call (:func:`family_plan`); the Communicator
    replays it with no other work."""

    def __init__(
        self, ch: Channel, kind: str, count: int, dtype: np.dtype[np.generic], root: int
    ) -> None:
        self.algorithm = kind
        self.where = f"Communicator.{kind}"
        super().__init__(ch, count, dtype, "", dtype)
        self.auto = True  # the family has one node-local algorithm
        self.extra = root
        self.out_count = count if kind == "broadcast" else count * ch.world_size
        self.root_index = self.order.index(root) if kind == "broadcast" else 0
        mode = "copy_one" if kind == "broadcast" else "concat"
        self.make_fast(ch, mode, root=self.root_index)

    def finish(
        self,
        ch: Channel,
        s: int,
        inputs: list[Array],
        shm: SHMEMBuffer | None,
        dst: Array,
        in_place: bool,
    ) -> None:
        aside: Array | None = None  # the result, when dst overlaps an input still being read
        if self.algorithm == "broadcast":
            src = inputs[self.root_index]
            if not np.may_share_memory(dst, src):
                np.copyto(dst, src)
            elif dst.ctypes.data != src.ctypes.data or dst.nbytes != src.nbytes:
                aside = src.copy()
            # else dst is the root's own input: the result is there already
        else:
            n = self.count
            if any(np.may_share_memory(dst, x) for x in inputs):
                aside = np.empty_like(dst)
            target = dst if aside is None else aside
            for r, x in enumerate(inputs):
                target[r * n : (r + 1) * n] = x
        if self.fence_needed:
            ch.world.heap.fence()  # release: my reads of peers' memory are done
        ch.my_flags[Flag.DONE] = s
        ch.stats.calls += 1
        if shm is not None or aside is not None:  # no peer reads the inputs any more
            self.await_done(ch, s)
        if aside is not None:
            np.copyto(dst, aside)


def family_plan(ch: Channel, kind: str, xin: Operand, root: int = 0) -> FamilyPlan | None:
    """The cached plan of a node-local ``kind`` call of this shape (made on first use), or
    None where the call does not qualify (larger than the cached all-reduce's limit, debug
    checks on, several nodes: the general path)."""
    if xin.count * xin.dtype.itemsize > TINY_NBYTES or ch.check_args or ch.num_nodes > 1:
        return None
    key = (kind, xin.count, xin.dtype, root)
    return cast(
        FamilyPlan,
        cached_plan(ch, key, lambda: FamilyPlan(ch, kind, xin.count, xin.dtype, root)),
    )
