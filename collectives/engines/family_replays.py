"""The host engine's fast path for the family collectives (broadcast, all-gather,
reduce-scatter, all-to-all): each kind's cached plan replayed from the last call's shape, and
the last call's arguments remembered (its memo, with the C form of it where the C replay takes
the plan: :meth:`collectives.replay.ReplayPlan.memo`), as the engine does for all-reduce."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shmem import SHMEMBuffer

from ..operand import Array
from ..replay import ReplayPlan
from .base import mismatched

if TYPE_CHECKING:
    from .host import HostEngine


class FamilyReplays:
    """Per kind: the last plan replayed, the memo of the last call and its C form."""

    def __init__(self, engine: HostEngine) -> None:
        self.engine = engine
        self.memo: dict[str, tuple[Any, ...]] = {}
        self.armed: dict[str, Any] = {}  # the memos' C forms
        self.in_place: dict[str, bool] = {}  # theirs (the hazard checked)
        self.last: dict[str, Any] = {}  # kind -> the last family plan replayed
        self.due: set[str] = set()  # the kinds whose memo's C form is yet to be made

    def clear(self) -> None:
        """Forget every plan and memo (the engine closes)."""
        self.memo.clear()
        self.armed.clear()
        self.in_place.clear()
        self.last.clear()
        self.due.clear()

    def replay(self, kind: str, x: object, out: object, extra: object) -> Any:
        """Replay the cached plan of a small broadcast, all-gather, reduce-scatter or
        all-to-all of this shape (node-local: :class:`collectives.family.FamilyPlan`, a
        sharded :class:`collectives.allreduce_plans.TinyPlan`; across nodes:
        :class:`collectives.cross_plan.CrossPlan`; ``extra``: the root or the op): the result,
        or None when there is none yet or an argument needs the general path (which
        validates it)."""
        eng = self.engine
        ch = eng.ch
        armed = self.armed.get(kind)
        if armed is not None:  # its C form (see all_reduce's)
            try:
                done = armed.replay(x, out, extra)
            except BaseException as exc:
                ch.fail(mismatched(exc))
                raise
            if done is not None:
                return self._resume(kind, *done) if type(done) is tuple else done
        if eng.closed or ch.broken:
            return None
        memo = self.memo.get(kind)
        if memo is not None and x is memo[0] and out is memo[1] and extra == memo[2]:
            # the same objects as this kind's last replay (see all_reduce's memo)
            plan, shm = memo[3], memo[5]
            if eng._memo_holds(ch, plan, x, shm, out):
                if kind in self.due:  # the same objects twice: worth the C form
                    self._arm(kind)
                if memo[6] is None:  # a new array each call
                    fresh = np.empty(memo[7], plan.dtype)
                    into = fresh.reshape(-1)
                    given = into if shm is not None else memo[4]
                    eng._replay(ch, plan, given, shm, into, out, None, kind)
                    return fresh
                eng._replay(ch, plan, memo[4], shm, memo[6], out, None, kind)
                return memo[8]
        shm = None
        flags: Any = None
        res: Any
        flat: Any
        if type(x) is np.ndarray:
            flags = x.flags
            if not flags.c_contiguous:
                return None
            count, dtype = x.size, x.dtype
        elif type(x) is SHMEMBuffer and not x.closed:
            shm, count, dtype = x, x.count, x.dtype
        else:
            return None
        plan = self.last.get(kind)  # the last shape replayed: no key to build
        if (
            plan is None
            or plan.closed  # dropped from the cache since (evicted, scratch grew)
            or plan.count != count
            or plan.dtype is not dtype
            or plan.extra != extra
        ):
            plan = ch.plans.get((kind, count, dtype, extra))
            if plan is None:
                return None
            self.last[kind] = plan
        if plan.scratch is not ch.scratch_buf:
            return None
        total = plan.out_count
        if out is None and kind == "broadcast":  # into x itself
            if shm is None:
                if not flags.writeable:
                    return None
                res, flat = x, x if x.ndim == 1 else x.reshape(-1)  # type: ignore[union-attr]
            else:
                res, flat = shm, shm.local().reshape(-1)
        elif out is None:
            shape = x.shape if total == count else (total,)
            res = np.empty(shape, dtype)
            flat = res.reshape(-1)
        elif type(out) is np.ndarray and fits(out, dtype, total):
            res, flat = out, out.reshape(-1)
        elif type(out) is SHMEMBuffer and (view := eng._out_view(out, plan)) is not None:
            res, flat = out, view
        else:
            return None
        if eng.world.finalized:
            eng._live(kind)
        src = flat if shm is not None else x if x.ndim == 1 else x.reshape(-1)  # type: ignore[union-attr]
        in_place = self._remember(kind, x, out, extra, plan, src, shm, flat, res)
        eng._replay(ch, plan, src, shm, flat, out, in_place, kind)
        return res

    def _remember(
        self,
        kind: str,
        x: Any,
        out: Any,
        extra: object,
        plan: Any,
        src: Any,
        shm: SHMEMBuffer | None,
        flat: Array,
        res: Any,
    ) -> bool:
        """Remember a family call replayed now (``memo``, its C form ``armed``): whether
        ``out`` is in place on ``shm``, the hazard checked."""
        eng = self.engine
        ch = eng.ch
        anew = out is None and res is not x and res is not shm  # a new array each call
        if anew:
            self.memo[kind] = (x, out, extra, plan, src, shm, None, res.shape, None)
        else:
            self.memo[kind] = (x, out, extra, plan, src, shm, flat, None, res)
        in_place = shm is not None and out is not None and eng._over(out, flat, shm)
        if in_place and isinstance(plan, ReplayPlan) and not plan.hazard(ch, shm, flat):
            in_place = False  # (ReplayPlan.run's rule)
        self.in_place[kind] = in_place
        self.armed[kind] = None
        self.due.add(kind)  # its C form: made on the memo's first hit
        return in_place

    def _arm(self, kind: str) -> None:
        """Make the C form of ``kind``'s memo (``armed``), where the C replay takes it."""
        self.due.discard(kind)
        x, out, extra, plan, _, shm, flat, shape, res = self.memo[kind]
        if isinstance(plan, ReplayPlan):  # (a plan across nodes: no C replay)
            self.armed[kind] = plan.memo(
                self.engine.ch, x, out, extra, shm, flat, self.in_place[kind], shape or (),
                res, kind,
            )  # fmt: skip

    def _resume(self, kind: str, code: int, s: int, res: Any) -> Any:
        """Call ``s`` of the C memo of ``kind`` from its answer ``code`` (see
        :meth:`HostEngine._resume_memo`)."""
        eng = self.engine
        _, out, _, plan, src, shm, flat, _, _ = self.memo[kind]
        if flat is None:  # a new array each call
            flat = res.reshape(-1)
            src = flat if shm is not None else src
        in_place = self.in_place[kind]
        eng._replay(eng.ch, plan, src, shm, flat, out, in_place, kind, resume=(s, code))
        return res


def fits(out: Array | None, dtype: np.dtype[np.generic], count: int) -> bool:
    """Whether ``out`` (None: a new array) takes a result of ``count`` ``dtype`` elements
    as it is (the fast paths' check: contiguous, writeable, that dtype and size)."""
    return out is None or (
        out.dtype == dtype and out.size == count and out.flags.c_contiguous and out.flags.writeable
    )
