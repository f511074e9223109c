"""The cached plan of a small node-local broadcast or all-gather (:class:`FamilyPlan`).

The general path of every collective of the family is :mod:`collectives.pipeline`; a small
call on one node of a shape seen before replays this plan instead (its own exchange of
flags, in C where the extension is built).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from shmem import SHMEMBuffer

from .channel import Channel, Flag
from .operand import Array, Operand
from .replay import ReplayPlan, cached_plan, spin_flag

__all__ = [
    "BROADCAST_PLAN_NBYTES",
    "FAMILY_PLAN_NBYTES",
    "STAGE_CHUNK",
    "FamilyPlan",
    "family_plan",
]

PROG = int(Flag.PROG)
# A broadcast's root stages its input in chunks of this many bytes after READY (in C, with
# the spin on: a core per rank), its readers copying each as it lands, instead of staging
# all of it before READY: the two copies overlap. 2 ranks, 1 MiB, numpy input: see the
# docs/benchmarks.md "ninth pass"
STAGE_CHUNK = 64 << 10


class FamilyPlan(ReplayPlan):
    """A cached small broadcast or all-gather on one node, replayed like the all-reduce's
    :class:`~collectives.allreduce_plans.TinyPlan` (in C where the extension is built): every
    rank publishes its input with the call's tag in ``SRC`` and raises ``READY``, waits for
    every node-local rank's ``READY`` (a broadcast's non-roots too, as on the pipeline's
    node-local route: every rank checks every other rank's call at once), copies the root's
    input (broadcast) or every input in rank order (all_gather), raises ``DONE`` and, for a
    zero-copy input, waits for the peers' ``DONE``. A broadcast beyond one
    :data:`STAGE_CHUNK`: its root's ``PROG`` counts the chunks of its input it has staged
    (all of them before ``READY`` here; in the C replay, with a core per rank, chunk by chunk
    after ``READY``), and a reader copies only what it counts. Made by the first such call
    (:func:`family_plan`); the Communicator replays it with no other work."""

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
        self.reads_mine = kind != "broadcast" or ch.rank == root
        chunk = STAGE_CHUNK if kind == "broadcast" and self.nbytes > STAGE_CHUNK else 0
        self.chunks = -(-self.nbytes // chunk) if chunk else 0
        self.make_fast(ch, mode, root=self.root_index, chunk=chunk)

    def hazard(self, ch: Channel, shm: SHMEMBuffer | None, dst: Array) -> bool:
        if self.algorithm != "broadcast":
            return True
        # a broadcast reads the root's input only: a non-root's x is no one's input, and the
        # root's x itself is its result as it stands
        return (
            self.reads_mine
            and shm is not None
            and (dst.ctypes.data != ch.world.heap.address(shm.offset) or dst.nbytes != self.nbytes)
        )

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
            if self.chunks and not self.reads_mine:  # the root's input, all of it
                self.await_root(ch)
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
        if (shm is not None and self.reads_mine) or aside is not None:  # no peer reads them
            self.await_done(ch, s)
        if aside is not None:
            np.copyto(dst, aside)

    def await_root(self, ch: Channel) -> None:
        """Wait until the root's ``PROG`` counts every chunk of its input (the C replay's
        root stages them after ``READY``)."""
        root = cast(int, self.extra)
        f = ch.peer_flags[root]
        if f[PROG] < self.chunks and not spin_flag(f, PROG, self.chunks):
            ch.wait_peers(PROG, self.chunks, self.where, peers=[root], check=False)
        elif self.fence_needed:  # acquire: the stage's loads after PROG's (wait_peers' own)
            ch.world.heap.fence()


# The bytes (an input's) up to which a node-local call runs from its cached plan: float32,
# 2-4 ranks, the plan (C replay) against the general path in one job, MPI / ours: broadcast
# at 128 KiB-1 MiB, numpy 0.14-0.93 -> 0.19-1.72, symmetric 0.34-1.64 -> 1.69-3.98;
# all_gather at 128-512 KiB numpy 0.57-0.94 -> 0.72-1.30, symmetric 0.81-2.85 -> 1.05-4.04,
# at 1 MiB numpy `out=` 0.64-1.02 -> 0.84-1.34, symmetric 0.98-1.25 -> 1.42-2.05 (one job of
# five had the plan slower there: 1.30-3.57 -> 0.99-1.74); at 2 and 4 MiB (2-4 ranks, four
# jobs, fresh or unchanged numpy input / symmetric) 0.55-1.05 -> 0.60-1.21 / 1.08-1.64 ->
# 1.21-1.96; at 8 MiB no better (0.83-0.98 -> 0.92-0.96 / 1.38-1.6 -> 1.34-1.79). The
# all-gather's (a broadcast has its own)
FAMILY_PLAN_NBYTES = 4 << 20
# A broadcast's: its plan stages a numpy input in chunks its readers follow, and replays a
# symmetric one with no Python. Plan against general path, 2 and 4 ranks, one job each, a
# fresh numpy input / a symmetric one, MPI / ours: 2 MiB 0.58-0.88 -> 0.78-0.98 /
# 1.71-3.53 -> 2.88-5.09, 4 MiB 0.51-0.78 -> 0.75-0.91 / 1.47-3.2 -> 2.05-4.0, 8 and 16 MiB
# 0.44-0.82 -> 0.41-0.86 / 0.65-2.04 -> 0.75-2.66 (the general path stages into the same
# scratch: the plan needs no more of it)
BROADCAST_PLAN_NBYTES = 16 << 20


def family_plan(ch: Channel, kind: str, xin: Operand, root: int = 0) -> FamilyPlan | None:
    """The cached plan of a node-local ``kind`` call of this shape (made on first use), or
    None where the call does not qualify (larger than :data:`FAMILY_PLAN_NBYTES`, a
    broadcast :data:`BROADCAST_PLAN_NBYTES`, debug checks on, several nodes: the general
    path)."""
    limit = BROADCAST_PLAN_NBYTES if kind == "broadcast" else FAMILY_PLAN_NBYTES
    too_large = xin.count * xin.dtype.itemsize > limit
    if too_large or ch.check_args or ch.num_nodes > 1:
        return None
    key = (kind, xin.count, xin.dtype, root)
    return cast(
        FamilyPlan,
        cached_plan(ch, key, lambda: FamilyPlan(ch, kind, xin.count, xin.dtype, root)),
    )
