"""Sequence-parallel attention, backward for every schedule: the same units, each producing
``dQ`` for its query chunk and ``dK``/``dV`` for its KV chunk (FlashAttention-2 backward, ``P``
recomputed from the forward's LSE), written to slots on the two home ranks and summed there in
a fixed order. Package-internal."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..communicator import Communicator
from . import _units
from ._sp_setup import (
    BackwardOperands,
    Setup,
    close_all,
    finish_stats,
    setup,
    symmetric,
)
from ._sp_slots import Slots, plan_units, run_units, unit_groups
from ._units import OrderedFolds, RowReader, SequenceParallelStats, Unit, pieces, runs
from .kernel import attention_tile_backward

__all__ = ["backward"]


def backward(
    comm: Communicator,
    dout: np.ndarray[Any, Any],
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    lse: np.ndarray[Any, Any],
    *,
    causal: bool = False,
    window: Any = None,
    valid_length: Any = None,
    scale: float | None = None,
    schedule: str = "dynamic",
    block_m: int = 128,
    block_n: int = 256,
    unit_rows: int | None = None,
    threads: int | None = None,
    stats: SequenceParallelStats | None = None,
    slowdown: float = 1.0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Gradients ``(dQ, dK, dV)`` of this rank's rows (collective).

    ``dout`` is dL/dO for this rank's rows; ``out`` and ``lse`` come from
    :func:`sequence_parallel_attention` with ``return_lse=True`` and the same arguments (any
    schedule: they are the same up to rounding). ``dK``/``dV`` have ``k``'s shape: with
    GQA they sum over each KV head's query heads. Every other argument is as for the forward,
    with the same sharding. Returns arrays of the dtypes of ``q``, ``k`` and ``v``.

    Long because the unit driver's steps (fetch, compute, deliver and the two folds) are
    closures over this call's buffers, plan and outputs, written beside the state they share,
    as in the forward schedules.
    """
    start = time.perf_counter()
    where = "sequence_parallel_attention_backward"
    st, _ = setup(
        comm,
        where,
        BackwardOperands(q=q, k=k, v=v, out=out, dout=dout, lse=lse),
        schedule=schedule,
        causal=causal,
        window=window,
        valid_length=valid_length,
        scale=scale,
        block_m=block_m,
        block_n=block_n,
        unit_rows=unit_rows,
        threads=threads,
        stats=stats,
    )
    mine = SequenceParallelStats(schedule=schedule)
    world, me = st.world, st.world.rank
    plan = plan_units(st, block_m)
    chunks, hg, d = plan.chunks, st.group, st.dim
    slots = Slots(  # kind 0: dQ at the query home; kind 1: dK | dV at the KV home
        plan,
        [
            (plan.by_q_home, lambda u: chunks[u.q].rows * hg * d),
            (plan.by_kv_home, lambda u: chunks[u.kv].rows * 2 * d),
        ],
    )
    bufs = symmetric(
        world,
        {
            "q": ((st.rows_max, st.heads, d), "float32"),
            "do": ((st.rows_max, st.heads, d), "float32"),
            "ld": ((st.rows_max, st.heads, 2), "float32"),  # LSE, D = rowsum(dO * O)
            "k": ((st.rows_max, st.kv_heads, d), "float32"),
            "v": ((st.rows_max, st.kv_heads, d), "float32"),
            **slots.buffers(),
        },
    )
    try:
        with _units.guarded(world, bufs["counters"]):  # a failure here stops the peers at once
            for name, a in (("q", q), ("do", dout), ("k", k), ("v", v)):
                bufs[name].local()[: st.rows] = a
            ld = bufs["ld"].local()
            ld[: st.rows, :, 0] = lse
            ld[: st.rows, :, 1] = np.einsum(
                "rhd,rhd->rh", dout.astype(np.float32), out.astype(np.float32)
            )
            _units.ready(world, bufs["counters"], where)
        reader = RowReader(capacity=15)
        dq_out = np.zeros((st.rows, st.heads, d), np.float32)
        dk_out = np.zeros((st.rows, st.kv_heads, d), np.float32)
        dv_out = np.zeros((st.rows, st.kv_heads, d), np.float32)

        def fetch(u: Unit) -> tuple[Any, ...]:
            qc, kc = chunks[u.q], chunks[u.kv]
            heads = slice(u.head * hg, (u.head + 1) * hg)
            return (
                reader.rows(bufs["q"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["do"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["ld"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["k"], kc.rank, kc.lo, kc.hi)[:, u.head],
                reader.rows(bufs["v"], kc.rank, kc.lo, kc.hi)[:, u.head],
                slots.view(bufs["part"], qc.rank, 0, u, (qc.rows, hg, d)),
                slots.view(bufs["part"], kc.rank, 1, u, (kc.rows, 2, d)),
            )

        def compute(u: Unit, data: tuple[Any, ...]) -> tuple[Any, Any]:
            qd, dod, ldd, kd, vd, dq_dst, dkv_dst = data
            return _backward_unit(
                st,
                qd,
                dod,
                ldd,
                kd,
                vd,
                chunks[u.q].pos,
                chunks[u.kv].pos,
                block_m,
                block_n,
                dq_dst,
                dkv_dst,
            )

        def deliver(u: Unit, result: tuple[Any, Any]) -> None:
            slots.deliver(world, bufs, chunks[u.q].rank, 0, u, result[0])
            slots.deliver(world, bufs, chunks[u.kv].rank, 1, u, result[1])

        def fold_dq(u: Unit, part: Any, off: int) -> None:
            qc = chunks[u.q]
            heads = slice(u.head * hg, (u.head + 1) * hg)
            dq_out[qc.lo : qc.hi, heads] += part[off : off + qc.rows * hg * d].reshape(
                qc.rows, hg, d
            )

        def fold_dkv(u: Unit, part: Any, off: int) -> None:
            kc = chunks[u.kv]
            blk = part[off : off + kc.rows * 2 * d].reshape(kc.rows, 2, d)
            dk_out[kc.lo : kc.hi, u.head] += blk[:, 0]
            dv_out[kc.lo : kc.hi, u.head] += blk[:, 1]

        # fixed orders: dQ by (query chunk, KV head) over KV chunks; dK/dV by (KV chunk,
        # KV head) over query chunks
        dq_groups = unit_groups(plan.by_q_home[me], lambda u: (u.q, u.head))
        dkv_groups = unit_groups(plan.by_kv_home[me], lambda u: (u.kv, u.head))
        folds = OrderedFolds(
            world,
            bufs["flags"],
            slots.folds(world, bufs, 0, dq_groups, fold_dq)
            + slots.folds(world, bufs, 1, dkv_groups, fold_dkv),
        )
        run_units(
            st,
            plan,
            bufs["counters"],
            dynamic=schedule == "dynamic",
            fetch=fetch,
            compute=compute,
            deliver=deliver,
            folds=folds,
            slowdown=slowdown,
            stats=mine,
            what=where,
        )
    finally:
        close_all(bufs)
    finish_stats(st, stats, mine, start)
    return (
        dq_out.astype(q.dtype, copy=False),
        dk_out.astype(k.dtype, copy=False),
        dv_out.astype(v.dtype, copy=False),
    )


def _backward_unit(
    st: Setup,
    qd: Any,
    dod: Any,
    ldd: Any,
    kd: Any,
    vd: Any,
    q_pos: Any,
    kv_pos: Any,
    block_m: int,
    block_n: int,
    dq: Any = None,
    dkv: Any = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One unit into ``dq`` and ``dkv`` (or new arrays): dQ ``[rows, group heads, d]`` and
    dK | dV ``[kv rows, 2, d]``, float32."""
    rows, hg, d = qd.shape
    dq = np.zeros((rows, hg, d), np.float32) if dq is None else dq
    dkv = np.zeros((kv_pos.size, 2, d), np.float32) if dkv is None else dkv
    dq[...] = 0
    dkv[...] = 0
    kv_runs = runs(kv_pos)
    for hh in range(hg):
        for lo in range(0, rows, block_m):
            hi = min(lo + block_m, rows)
            for qa, qb, qg, ra, g0, s0, s1 in pieces(
                q_pos, lo, hi, kv_pos, kv_runs, st.mask, st.docs
            ):
                dq_p, dk_p, dv_p = attention_tile_backward(
                    qd[qa:qb, hh],
                    kd,
                    vd,
                    dod[qa:qb, hh],
                    ldd[qa:qb, hh, 0],
                    ldd[qa:qb, hh, 1],
                    q_offset=qg,
                    kv_start=s0,
                    kv_end=s1,
                    block_n=block_n,
                    scale=st.scale,
                    mask=st.mask,
                    k_offset=g0 - ra,
                )
                dq[qa:qb, hh] += dq_p
                r0 = s0 - g0 + ra
                dkv[r0 : r0 + s1 - s0, 0] += dk_p
                dkv[r0 : r0 + s1 - s0, 1] += dv_p
    return dq, dkv
