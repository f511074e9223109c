"""Sequence-parallel attention: the unit plan of a call, where unit results go on their home
ranks (:class:`Slots`), and the one way to drive the units (:func:`run_units`).
Package-internal."""

from __future__ import annotations

import itertools
import math
from functools import partial
from typing import Any

from threadpoolctl import threadpool_limits

from . import _units
from ._sp_setup import Setup
from ._units import COUNTERS, SequenceParallelStats, Unit, UnitPlan

__all__ = ["Slots", "plan_units", "run_units", "unit_groups"]


def plan_units(st: Setup, block_m: int) -> UnitPlan:
    return UnitPlan(
        st.positions,
        st.chunk_rows,
        st.kv_heads,
        st.mask,
        st.docs,
        block_m,
        st.order,
        st.kv_chunk_rows,
    )


class Slots:
    """Where unit results go on their home ranks: a flat float32 ``part`` buffer of slots
    and one int64 flag per slot (symmetric), laid out identically on every rank."""

    def __init__(self, plan: UnitPlan, kinds: list[tuple[list[list[Unit]], Any]]) -> None:
        # kinds: (units per home, floats per unit) for each kind of slot, in layout order
        size = plan.size
        self.offset: list[dict[tuple[int, int], int]] = [{} for _ in range(size)]
        self.flag: list[dict[tuple[int, int], int]] = [{} for _ in range(size)]
        floats = [0] * size
        flags = [0] * size
        for kind, (homes, width) in enumerate(kinds):
            for r, units in enumerate(homes):
                for u in units:
                    self.offset[r][kind, u.id] = floats[r]
                    self.flag[r][kind, u.id] = flags[r]
                    floats[r] += width(u)
                    flags[r] += 1
        self.floats = max(1, *floats)
        self.flags = max(1, *flags)
        self._views: dict[int, Any] = {}

    def buffers(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {
            "part": ((self.floats,), "float32"),
            "flags": ((self.flags,), "int64"),
            "counters": ((COUNTERS,), "int64"),
        }

    def view(self, part: Any, home: int, kind: int, u: Unit, shape: tuple[int, ...]) -> Any:
        """The slot as an array in ``home``'s memory, or None when not reachable."""
        if home not in self._views:
            self._views[home] = part.peer(home)
        flat = self._views[home]
        if flat is None:
            return None
        off = self.offset[home][kind, u.id]
        return flat[off : off + math.prod(shape)].reshape(shape)

    def deliver(
        self, world: Any, bufs: dict[str, Any], home: int, kind: int, u: Unit, data: Any
    ) -> None:
        """Put ``data`` in the slot unless it was computed there, then raise its flag."""
        if self._views.get(home) is None:
            bufs["part"].put(home, data, offset=self.offset[home][kind, u.id] * 4)
        _units.publish(world, bufs["flags"], home, self.flag[home][kind, u.id])

    def folds(
        self, world: Any, bufs: dict[str, Any], kind: int, groups: list[list[Unit]], fold: Any
    ) -> list[list[tuple[int, Any]]]:
        """``fold(u, slot)`` for each group's units, in order, keyed by their flags."""
        me, part = world.rank, bufs["part"].local()
        return [
            [
                (self.flag[me][kind, u.id], partial(fold, u, part, self.offset[me][kind, u.id]))
                for u in group
            ]
            for group in groups
        ]


def unit_groups(units: list[Unit], key: Any) -> list[list[Unit]]:
    """Consecutive runs of ``units`` with equal ``key`` (units are in canonical order)."""
    return [list(g) for _, g in itertools.groupby(units, key)]


def run_units(
    st: Setup,
    plan: UnitPlan,
    counters: Any,
    *,
    dynamic: bool,
    fetch: Any,
    compute: Any,
    deliver: Any,
    folds: Any,
    slowdown: float,
    stats: SequenceParallelStats,
    what: str,
) -> None:
    """Drive the units of ``plan`` (``_units.drive``) with one BLAS thread per compute thread,
    a failure stopping the peers at once (``_units.guarded``)."""
    with _units.guarded(st.world, counters), threadpool_limits(limits=1, user_api="blas"):
        _units.drive(
            st.world,
            plan,
            counters,
            dynamic=dynamic,
            fetch=fetch,
            compute=compute,
            deliver=deliver,
            folds=folds,
            threads=st.threads,
            slowdown=slowdown,
            stats=stats,
            what=what,
        )
