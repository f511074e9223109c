"""The host engine: the channel's collectives on the host backend.

It owns one :class:`~collectives.channel.Channel` (flags, scratch and sequence numbers in the
symmetric heap); each collective lives in its own module (``allreduce``, ``broadcast``, ...)
and drives the channel. A small call of a shape seen before skips all of that: the fast path
here replays the channel's cached plan (:mod:`collectives.replay`) with no key to build and
no argument handling. A call that fails after exchanging flags leaves the peers mid-call, so
the engine then refuses later calls (:meth:`HostEngine._call`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from shmem import SHMEMBuffer, World, flight
from shmem.errors import ShmemStateError

from ..all_gather import all_gather as _all_gather
from ..all_to_all import all_to_all as _all_to_all
from ..allreduce import all_reduce as _all_reduce
from ..allreduce import choose as _choose
from ..allreduce_plans import NodesPlan, TinyPlan, own_view
from ..barrier import barrier as _barrier
from ..barrier import meet
from ..broadcast import broadcast as _broadcast
from ..channel import Channel
from ..operand import Array
from ..ops import ReduceOp
from ..reduce_scatter import reduce_scatter as _reduce_scatter
from ..replay import ReplayPlan
from ..schedule import Algorithm, AlgorithmTable
from ..signature import COLLECTIVES, describe_args
from ..stats import CommStats
from .base import (
    Input,
    Output,
    Result,
    check_live,
    explain,
    mismatched,
    refuse_device_buffers,
    single_node,
    widened_all_reduce,
)
from .family_replays import FamilyReplays, fits
from .team import team_collectives

__all__ = ["HostEngine"]

log = logging.getLogger(__name__)


class HostEngine:
    """The collectives of a World's ranks over one channel (collective to create)."""

    def __init__(
        self, world: World, stats: CommStats, table: AlgorithmTable, acc32: np.dtype[Any]
    ) -> None:
        self.world = world
        self.closed = False
        self.acc32 = acc32
        ch = self.ch = Channel(world, stats)
        ch.table = dataclasses.replace(table, crowded=ch.crowded)
        self.stream = ch.stream
        # collect and alltoalls: made now, while every rank is here (it duplicates an MPI
        # communicator: made lazily, a rank in collect against peers in another call
        # blocked in MPI with no deadline), and run in step with the channel's calls
        self.tc = team_collectives(world.team_world, acc32)
        self.tc.board = ch
        # the fast path's memory: the last plan replayed (no key to build or hash), the
        # last out array checked, and (out, zero-copy input, whether out overlaps it)
        self._last_plan: TinyPlan | NodesPlan | None = None
        self._last_out: Array | None = None
        self._alias: tuple[object, object, bool] | None = None
        self._sym_out: tuple[SHMEMBuffer, Array] | None = None  # a symmetric out, its view
        # the last replayed all-reduce's arguments and what the fast path made of them: the
        # same x, out and op again replay at once (x, out, op, plan, src, shm, flat, in_place)
        self._memo: tuple[Any, ...] | None = None
        self._armed: Any = None  # its C form (ReplayPlan.memo), where the C replay takes it
        self._armed_in_place = False  # its in_place (ReplayPlan.run's, the hazard checked)
        self._arm_due = False  # whether the memo's C form is yet to be made
        self.family = FamilyReplays(self)  # the same for the family collectives
        self._fused: tuple[object, ...] | None = None  # a fused all-reduce's arguments
        world.barrier()

    def _live(self, where: str) -> Channel:
        check_live(self.closed, self.world, where)
        return self.ch

    @contextlib.contextmanager
    def _call(
        self, ch: Channel, op: str, args: tuple[object, ...], record: bool = True
    ) -> Iterator[Channel]:
        """Run one collective, ``op`` of the method's arguments ``args`` (the input first),
        recorded in the flight recorder: if it raises after exchanging flags, peers may be
        mid-call, so the channel is no longer in step: it retracts its flags and warns the
        peers (``Channel.fail``), and the communicator refuses later calls. A mismatch is
        reported with every rank's own account of its call (:meth:`_explain`)."""
        if ch.broken:
            raise ShmemStateError(
                "Communicator: a previous call failed, so the ranks are out of step; close "
                "this communicator and make a new one"
            )
        seq = ch.seq
        try:
            if record:
                with flight.recording(ch.stream, op, args[0] if args else None):
                    yield ch
            else:  # (its caller records it)
                yield ch
        except BaseException as exc:
            # an error every rank raised at the same point of a finished call (``agreed``,
            # e.g. collect's out size, checked against the exchanged counts) leaves them in step
            if ch.seq != seq and not getattr(exc, "agreed", False):
                ch.fail(mismatched(exc))
            if mismatched(exc):
                raise self._explain(exc, op, args) from None
            raise

    def _explain(self, exc: BaseException, op: str, args: tuple[object, ...]) -> BaseException:
        """:func:`~collectives.engines.base.explain` on the channel: a collective described
        from its arguments ``args`` (a fused all-reduce's inner call as the outer one, with
        its ``out_dtype`` and ``scale``), any other call (:meth:`meet`) by ``args[0]``."""
        if self._fused is not None:
            op, args = "all_reduce", self._fused
        if op in COLLECTIVES:
            where, text = f"Communicator.{op}", describe_args(op, args)
        else:
            where, text = op, str(args[0])
        return explain(self.ch.reporter, self.ch.stream, self.ch.seq, exc, where, text)

    def meet(self, where: str, text: str, sig: int) -> None:
        """A call that every rank enters together, as its first step (sequence-parallel
        attention's): on the channel with signature ``sig``, so a rank in another call is a
        mismatch every rank reports with its own account (``text``: this rank's call)."""
        with self._call(self._live(where), where, (text,), record=False) as ch:
            meet(ch, sig, where)

    @property
    def scratch_capacity(self) -> int:
        return self.ch.scratch_capacity

    @property
    def scratch_nbytes(self) -> int:
        return self.ch.scratch_buf.nbytes

    @property
    def cross(self) -> object:
        if self.ch.cross is None:
            raise single_node()
        return self.ch.cross

    def choose(self, algorithm: Algorithm | str, nbytes: int, where: str) -> str:
        return _choose(self._live(where), algorithm, nbytes, where)

    # -- the collectives -----------------------------------------------------------------------

    def all_reduce(
        self,
        x: Any,
        op: ReduceOp | str,
        out: Any,
        algorithm: Algorithm | str,
        stream: object,
        out_dtype: Any,
        scale: float | None,
    ) -> Result:
        if out_dtype is not None or scale is not None:
            self._live("all_reduce")
            refuse_device_buffers(x, out)
            self._fused = (x, op, out, algorithm, stream, out_dtype, scale)
            try:
                return widened_all_reduce(
                    self.all_reduce, x, op, out, algorithm, out_dtype, scale, self.acc32
                )
            finally:
                self._fused = None
        armed = self._armed
        if armed is not None and algorithm == "auto":
            try:
                done = armed.replay(x, out, op)
            except BaseException as exc:
                self.ch.fail(mismatched(exc))
                raise
            if done is not None:
                if type(done) is tuple:  # the Python replay goes on from the C answer
                    return self._resume_memo(*done)  # type: ignore[no-any-return]
                return done  # type: ignore[no-any-return]
        ch = self.ch
        memo = self._memo
        if (
            memo is not None
            and x is memo[0]
            and out is memo[1]
            and op == memo[2]
            and algorithm == "auto"
        ):
            again = self._replay_memo(ch, memo, x, out)
            if again is not None:
                return again  # type: ignore[no-any-return]
        if (
            algorithm == "auto"
            and not self.closed
            and (out is None or type(out) is np.ndarray or type(out) is SHMEMBuffer)
        ):
            done = self._replay_cached(ch, x, op, out)
            if done is not None:
                return done  # type: ignore[no-any-return]
        self._live("all_reduce")
        refuse_device_buffers(x, out)
        with self._call(ch, "all_reduce", (x, op, out, algorithm)):
            return _all_reduce(ch, x, op, out, algorithm)

    def _resume_memo(self, code: int, s: int, res: Any) -> Any:
        """Call ``s`` of the C memo (``_armed``) from its answer ``code``: the Python
        replay goes on with the memo's arguments (result ``res``)."""
        x, out, _, plan, src, shm, target, _ = self._memo  # type: ignore[misc]
        in_place = self._armed_in_place
        flat = target if out is not None else (res if res.ndim == 1 else res.reshape(-1))
        if src is None:
            src = flat if shm is not None else x.reshape(-1)
        self._replay(self.ch, plan, src, shm, flat, out, in_place, resume=(s, code))
        return res

    def _replay_memo(self, ch: Channel, memo: tuple[Any, ...], x: Any, out: Any) -> Any:
        """The same x, out and op as the last replayed all-reduce (``memo``): replay it at
        once, every check that can change since still made; None where one fails."""
        plan, shm = memo[3], memo[5]
        if not self._memo_holds(ch, plan, x, shm, out):
            return None
        if out is None:  # a new array each call (x's shape)
            res = np.empty(memo[6], plan.dtype)
            flat = res if res.ndim == 1 else res.reshape(-1)
        else:
            res, flat = out, memo[6]
        src = memo[4]
        if src is None:  # a symmetric x into a new array, or a copy of a strided numpy x
            src = flat if shm is not None else x.reshape(-1)
        if self._arm_due:  # the same objects twice: worth the C form (a few us to make)
            self._arm_due = False
            self._arm(ch, plan, x, out, memo[2], shm, flat, memo[7])
        self._replay(ch, plan, src, shm, flat, out, memo[7])
        return res

    def _arm(
        self,
        ch: Channel,
        plan: Any,
        x: Any,
        out: Any,
        op: object,
        shm: SHMEMBuffer | None,
        flat: Array,
        in_place: bool,
    ) -> None:
        """Make the C form of the memo just remembered (``_armed``), or none."""
        self._armed = None
        if not isinstance(plan, ReplayPlan):  # (a plan across nodes: no C replay)
            return
        dst = flat if out is not None else None
        if in_place and dst is not None and not plan.hazard(ch, shm, dst):
            in_place = False  # (ReplayPlan.run's rule)
        self._armed = plan.memo(ch, x, out, op, shm, dst, in_place, x.shape)
        self._armed_in_place = in_place

    def _memo_holds(
        self, ch: Channel, plan: Any, x: Any, shm: SHMEMBuffer | None, out: Any
    ) -> bool:
        """Whether a remembered replay of the same objects (``plan``; ``shm``: a symmetric
        x) still holds: every check that can change between two calls."""
        return (
            not plan.closed
            and not ch.broken
            and plan.scratch is ch.scratch_buf
            and not self.world.finalized
            and (shm is None or not shm.closed)
            and (type(out) is not SHMEMBuffer or not out.closed)
            and (shm is not None or (x.size == plan.count and x.dtype is plan.dtype))
        )

    def _replay_cached(self, ch: Channel, x: Any, op: ReduceOp | str, out: Any) -> Any:
        """Replay the cached plan of a small all-reduce of this shape (only where the table
        picks its algorithm, so every rank runs the same protocol whatever kind of argument
        it passed), remembering the arguments (``_memo``); None where there is none or an
        argument needs the general path (which validates it)."""
        shm: SHMEMBuffer | None = None
        src: Array | None = None
        plan = self._last_plan  # the last shape replayed: no key to build or hash
        if type(x) is np.ndarray:
            src, count, dtype = x, x.size, x.dtype  # any layout: the plan copies it
        elif type(x) is SHMEMBuffer and not x.closed:
            shm = x
            if plan is not None and x is plan.shm:  # its shape and dtype are known
                count, dtype = plan.count, plan.dtype
            else:
                count, dtype = x.count, x.dtype
        if shm is not None or src is not None:
            if (
                plan is None
                or plan.closed  # dropped from the cache since (evicted, scratch grew)
                or plan.count != count
                or plan.dtype is not dtype
                or plan.op != op
            ):
                plan = ch.plans.get((count, dtype, op))
                self._last_plan = plan
            sym_flat = None if type(out) is not SHMEMBuffer else self._out_view(out, plan)
            if (
                plan is not None
                and plan.auto
                and plan.scratch is ch.scratch_buf
                and not ch.broken
                and (
                    out is None
                    or sym_flat is not None
                    or out is self._last_out
                    or (type(out) is np.ndarray and fits(out, dtype, count))
                )
            ):
                if self.world.finalized:
                    self._live("all_reduce")
                res: Any
                if out is None:
                    res = np.empty(x.shape, dtype)
                    flat = res if res.ndim == 1 else res.reshape(-1)
                elif sym_flat is not None:
                    res, flat = out, sym_flat
                else:
                    # checked once per out array (a later writeable=False on it would
                    # fail mid-call: the peers then stop with PeerFailedError)
                    res = self._last_out = cast(Array, out)
                    flat = res if res.ndim == 1 else res.reshape(-1)
                if src is None:
                    src = flat
                elif src.ndim != 1:
                    src = src.reshape(-1)
                in_place = shm is not None and out is not None and self._over(out, flat, shm)
                # (a copy of a non-contiguous x is made again each call)
                kept = src if (src is x or (shm is not None and out is not None)) else None
                # (for a new array each call: x's shape in place of the result's view)
                target = flat if out is not None else x.shape
                self._memo = (x, out, op, plan, kept, shm, target, in_place)
                self._armed, self._arm_due = None, True  # (made on the memo's first hit)
                self._replay(ch, plan, src, shm, flat, out, in_place)
                return res
        return None

    def reduce_scatter(self, x: Input, op: ReduceOp | str, out: Output, stream: object) -> Input:
        if type(op) is str:
            done = self.family.replay("reduce_scatter", x, out, op)
            if done is not None:
                return done  # type: ignore[no-any-return]
        with self._call(self._live("reduce_scatter"), "reduce_scatter", (x, op)) as ch:
            return _reduce_scatter(ch, x, op, out)

    def all_gather(self, x: Input, out: Output, stream: object) -> Input:
        done = self.family.replay("all_gather", x, out, 0)
        if done is not None:
            return done  # type: ignore[no-any-return]
        with self._call(self._live("all_gather"), "all_gather", (x,)) as ch:
            return _all_gather(ch, x, out)

    def broadcast(self, x: Input, root: int, out: Output, stream: object) -> Input:
        if type(root) is int:
            done = self.family.replay("broadcast", x, out, root)
            if done is not None:
                return done  # type: ignore[no-any-return]
        with self._call(self._live("broadcast"), "broadcast", (x, root)) as ch:
            return _broadcast(ch, x, root, out)

    def all_to_all(self, x: Input, out: Output, stream: object) -> Input:
        done = self.family.replay("all_to_all", x, out, 0)  # (small calls across nodes)
        if done is not None:
            return done  # type: ignore[no-any-return]
        with self._call(self._live("all_to_all"), "all_to_all", (x,)) as ch:
            return _all_to_all(ch, x, out)

    def collect(self, x: Input, out: Output) -> Input:
        with self._call(self._live("collect"), "collect", (x,)):
            return self.tc.collect(x, out)

    def alltoalls(
        self, x: Input, nelems: int, dst_stride: int, src_stride: int, out: Output
    ) -> Input:
        with self._call(self._live("alltoalls"), "alltoalls", (x, nelems, dst_stride, src_stride)):
            return self.tc.alltoalls(
                x, nelems, dst_stride=dst_stride, src_stride=src_stride, out=out
            )

    def all_to_allv(
        self, x: Input, send_counts: Sequence[int], recv_counts: Sequence[int], out: Output
    ) -> Input:
        with self._call(self._live("all_to_allv"), "all_to_allv", (x, send_counts, recv_counts)):
            return self.tc.all_to_allv(x, send_counts, recv_counts, out)

    def barrier(self, timeout: float | None) -> None:
        with self._call(self._live("barrier"), "barrier", ()) as ch:
            _barrier(ch, timeout)

    def close(self) -> None:
        if self.closed:
            return
        # the remembered plan and out view scratch and flags: drop them before those close
        # (a view kept across close() would keep its block held, shmem.quarantine)
        self._last_plan = None
        self._last_out = None
        self._alias = None
        self._sym_out = None
        self._memo = self._armed = None
        self.family.clear()
        if self.world.finalized:  # the heap is gone with the World: nothing left to free
            self.closed = True
            return
        self.ch.close()  # waits for the peers' last DONE first
        self.closed = True
        self.tc.close()

    # -- the fast path -------------------------------------------------------------------------

    def _replay(
        self,
        ch: Channel,
        plan: Any,
        src: Any,
        shm: SHMEMBuffer | None,
        flat: Array,
        out: object,
        in_place: bool | None,
        name: str | None = None,
        resume: tuple[int, int] | None = None,
    ) -> None:
        """Replay ``plan`` (input ``src`` or ``shm``, result into ``flat``, the flat view of
        ``out`` or of a new array; ``in_place``: whether ``out`` overlaps ``shm``, None to
        find out) and count it under ``name`` (default: the plan's algorithm)."""
        if in_place is None:
            in_place = shm is not None and out is not None and self._over(out, flat, shm)
        try:
            if resume is not None:  # a call of the C memo, from its answer
                s, code = resume
                plan.resume(ch, s, code, plan.fast.slot, src, shm, flat, in_place, True)
            elif plan.fast is not None:  # it records the call in the flight recorder itself
                plan.run(ch, src, shm, flat, in_place, True)
            else:  # recorded here: begin and end (a context manager cost ~1 us a call more)
                rec = flight.recorder()
                x = shm if shm is not None else src  # (the input, as the other paths record)
                n = rec.begin(ch.stream, plan.where.rpartition(".")[2], x.nbytes, plan.dtype)
                try:
                    plan.run(ch, src, shm, flat, in_place)
                except BaseException:
                    rec.end(n, True)
                    raise
                rec.end(n)
        except BaseException as exc:
            ch.fail(mismatched(exc))  # flags moved: peers must not complete this call
            if mismatched(exc):  # (a replay is a call with algorithm "auto", no options)
                op = plan.where.rpartition(".")[2]
                x = shm if shm is not None else src
                args = (x, plan.op, out, "auto") if op == "all_reduce" else (x, plan.extra)
                raise self._explain(exc, op, args) from None
            raise
        algos = ch.stats.algorithms
        if name is None:
            name = plan.algorithm
        if algos is not None:
            algos[name] += 1
        else:
            ch.stats.count(name)

    def _over(self, out: object, flat: Array, shm: SHMEMBuffer) -> bool:
        """Whether ``out`` (flat view ``flat``) overlaps my zero-copy input ``shm``, which
        peers read until their ``DONE``: a cached replay then combines aside and copies the
        result in after (checked once per pair of objects)."""
        alias = self._alias
        if alias is None or alias[0] is not out or alias[1] is not shm:
            alias = self._alias = (out, shm, bool(np.may_share_memory(flat, shm.local())))
        return alias[2]

    def _out_view(self, out: SHMEMBuffer, plan: Any) -> Array | None:
        """The flat local view of a symmetric ``out`` for ``plan``'s result, or None where
        it does not fit (closed, another dtype or count: the general path says why): the
        heap's own view, kept per buffer (:func:`~collectives.allreduce_plans.own_view`)."""
        if out.closed or plan is None or out.world is not self.world:
            return None
        self._sym_out = kept = own_view(self.ch, out, self._sym_out, out.dtype)
        flat = kept[1]
        if flat.dtype is not plan.dtype and flat.dtype != plan.dtype:
            return None
        return flat if flat.shape[0] == plan.out_count else None
