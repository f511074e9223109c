"""Sequence-parallel attention, ``dynamic`` forward: work units run on any rank (taken from
per-rank queues by atomic fetch-and-add), and each partial ``(O, LSE)`` is merged at its home
in unit order, so the result is bitwise the same whichever rank computed a unit.
Package-internal."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _units
from ._sp_setup import (
    Setup,
    close_all,
    merge_partial,
    symmetric,
)
from ._sp_slots import Slots, plan_units, run_units, unit_groups
from ._units import OrderedFolds, RowReader, SequenceParallelStats, Unit, pieces, runs
from .kernel import attention_tile

__all__ = ["forward_dynamic"]


def forward_dynamic(
    st: Setup,
    q: Any,
    k: Any,
    v: Any,
    block_m: int,
    block_n: int,
    stats: SequenceParallelStats,
    slowdown: float,
) -> tuple[Any, Any]:
    """The dynamic forward: units run anywhere, partial (O, LSE) merged at home in unit order."""
    world, me = st.world, st.world.rank
    plan = plan_units(st, block_m)
    chunks, hg, d = plan.chunks, st.group, st.dim
    # a unit's slot: [rows, heads of its group, O | LSE]
    slots = Slots(plan, [(plan.by_q_home, lambda u: chunks[u.q].rows * hg * (d + 1))])
    bufs = symmetric(
        world,
        {
            "q": ((st.rows_max, st.heads, d), "float32"),
            "k": ((st.rows_max, st.kv_heads, d), "float32"),
            "v": ((st.rows_max, st.kv_heads, d), "float32"),
            **slots.buffers(),
        },
    )
    try:
        with _units.guarded(world, bufs["counters"]):  # a failure here stops the peers at once
            for name, a in (("q", q), ("k", k), ("v", v)):
                bufs[name].local()[: st.rows] = a
            _units.ready(world, bufs["counters"], "sequence_parallel_attention")
        reader = RowReader(capacity=9)
        out = np.zeros((st.rows, st.heads, d), np.float32)
        lse = np.full((st.rows, st.heads), -np.inf, np.float32)

        def fetch(u: Unit) -> tuple[Any, ...]:
            qc, kc = chunks[u.q], chunks[u.kv]
            heads = slice(u.head * hg, (u.head + 1) * hg)
            return (
                reader.rows(bufs["q"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["k"], kc.rank, kc.lo, kc.hi)[:, u.head],
                reader.rows(bufs["v"], kc.rank, kc.lo, kc.hi)[:, u.head],
                slots.view(bufs["part"], qc.rank, 0, u, (qc.rows, hg, d + 1)),
            )

        def compute(u: Unit, data: tuple[Any, ...]) -> Any:
            qd, kd, vd, dst = data
            return _forward_unit(
                st, qd, kd, vd, chunks[u.q].pos, chunks[u.kv].pos, block_m, block_n, dst
            )

        def deliver(u: Unit, packed: Any) -> None:
            slots.deliver(world, bufs, chunks[u.q].rank, 0, u, packed)

        def fold(u: Unit, part: Any, off: int) -> None:
            qc = chunks[u.q]
            blk = part[off : off + qc.rows * hg * (d + 1)].reshape(qc.rows, hg, d + 1)
            heads = slice(u.head * hg, (u.head + 1) * hg)
            merge_partial(
                out[qc.lo : qc.hi, heads], lse[qc.lo : qc.hi, heads], blk[..., :d], blk[..., d]
            )

        # fold order: (query chunk, KV head), then KV chunks in order
        groups = unit_groups(plan.by_q_home[me], lambda u: (u.q, u.head))
        folds = OrderedFolds(world, bufs["flags"], slots.folds(world, bufs, 0, groups, fold))
        run_units(
            st,
            plan,
            bufs["counters"],
            dynamic=True,
            fetch=fetch,
            compute=compute,
            deliver=deliver,
            folds=folds,
            slowdown=slowdown,
            stats=stats,
            what="sequence_parallel_attention",
        )
    finally:
        close_all(bufs)
    return out, lse


def _forward_unit(
    st: Setup,
    qd: Any,
    kd: Any,
    vd: Any,
    q_pos: Any,
    kv_pos: Any,
    block_m: int,
    block_n: int,
    dst: Any = None,
) -> np.ndarray[Any, Any]:
    """One unit into ``dst`` (or a new array): ``[rows, group heads, d + 1]`` float32, O then
    LSE in the last column."""
    rows, hg, d = qd.shape
    packed = np.empty((rows, hg, d + 1), np.float32) if dst is None else dst
    out, lse = packed[..., :d], packed[..., d]
    out[...] = 0
    lse[...] = -np.inf
    kv_runs = runs(kv_pos)
    for hh in range(hg):
        for lo in range(0, rows, block_m):
            hi = min(lo + block_m, rows)
            for qa, qb, qg, ra, g0, s0, s1 in pieces(
                q_pos, lo, hi, kv_pos, kv_runs, st.mask, st.docs
            ):
                o_part, l_part = attention_tile(
                    qd[qa:qb, hh],
                    kd,
                    vd,
                    q_offset=qg,
                    kv_start=s0,
                    kv_end=s1,
                    block_n=block_n,
                    scale=st.scale,
                    mask=st.mask,
                    k_offset=g0 - ra,
                )
                merge_partial(out[qa:qb, hh], lse[qa:qb, hh], o_part, l_part)
    return packed
