"""Sequence-parallel attention, ``ring`` and ``zigzag`` forward: at step ``s`` a rank uses
the K/V rows of rank ``(r - s) mod P`` (double-buffered gets when remote) and folds the partial
result into its running one by log-sum-exp. Package-internal."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from . import _units
from ._sp_setup import Setup, close_all, merge_partial, symmetric
from ._units import COUNTERS, SequenceParallelStats, pieces, runs
from .kernel import attention_tile

__all__ = ["forward_ring"]


def forward_ring(
    st: Setup,
    q: Any,
    k: Any,
    v: Any,
    block_m: int,
    block_n: int,
    stats: SequenceParallelStats,
    slowdown: float,
) -> tuple[Any, Any]:
    world = st.world
    bufs = symmetric(
        world,
        {
            "k": ((st.rows_max, st.kv_heads, st.dim), "float32"),
            "v": ((st.rows_max, st.kv_heads, st.dim), "float32"),
            "counters": ((COUNTERS,), "int64"),
        },
    )
    k_sym, v_sym, counters = bufs["k"], bufs["v"], bufs["counters"]
    try:
        with _units.guarded(world, counters):
            out, lse = _ring_steps(
                st, q, k, v, k_sym, v_sym, counters, block_m, block_n, stats, slowdown
            )
    finally:
        close_all(bufs)
    return out, lse


def _ring_steps(
    st: Setup,
    q: Any,
    k: Any,
    v: Any,
    k_sym: Any,
    v_sym: Any,
    counters: Any,
    block_m: int,
    block_n: int,
    stats: SequenceParallelStats,
    slowdown: float,
) -> tuple[Any, Any]:
    world = st.world
    rank, size = world.rank, world.world_size
    what = "sequence_parallel_attention"
    k_sym.local()[: st.rows] = k
    v_sym.local()[: st.rows] = v
    _units.ready(world, counters, what)
    q32 = np.ascontiguousarray(q, dtype=np.float32)
    out = np.zeros((st.rows, st.heads, st.dim), np.float32)
    lse = np.full((st.rows, st.heads), -np.inf, np.float32)
    slots = [np.empty((st.rows_max, st.kv_heads, st.dim), np.float32) for _ in range(2)]
    with (
        ThreadPoolExecutor(1) as fetcher,
        ThreadPoolExecutor(st.threads) as pool,
        threadpool_limits(limits=1, user_api="blas"),
    ):
        pending = _fetch(fetcher, k_sym, v_sym, rank, st.rows, slots[0])
        for step in range(size):
            _units.check_peers(counters, rank, what)
            src = (rank - step) % size
            kv_k, kv_v = pending.result()
            if step + 1 < size:  # prefetch the next block while this one computes
                nxt = (rank - step - 1) % size
                pending = _fetch(fetcher, k_sym, v_sym, nxt, st.counts[nxt], slots[(step + 1) % 2])
            t0 = time.perf_counter()
            _accumulate(pool, st, q32, kv_k, kv_v, st.positions[src], block_m, block_n, out, lse)
            spent = time.perf_counter() - t0
            if slowdown > 1.0:
                time.sleep(spent * (slowdown - 1.0))
                spent = time.perf_counter() - t0
            stats.busy_s += spent
            stats.units_computed += 1
            _units.beat(counters)
    stats.units = stats.units_computed
    stats.threads = st.threads
    _units.finish(world, counters, what)  # every peer is done reading my K/V
    return out, lse


def _fetch(
    fetcher: ThreadPoolExecutor,
    k_sym: Any,
    v_sym: Any,
    src: int,
    rows: int,
    slot: np.ndarray[Any, Any],
) -> Future[tuple[Any, Any]]:
    """K/V rows of ``src``: a peer view when reachable, else gets into local memory."""
    kp, vp = k_sym.peer(src), v_sym.peer(src)
    if kp is not None and vp is not None:
        done: Future[tuple[Any, Any]] = Future()
        done.set_result((kp[:rows], vp[:rows]))
        return done

    def get() -> tuple[Any, Any]:
        kk = k_sym.get(src, slot[:rows])
        vv = v_sym.get(src, np.empty_like(slot[:rows]))
        return kk, vv

    return fetcher.submit(get)


def _accumulate(
    pool: ThreadPoolExecutor,
    st: Setup,
    q: Any,
    k: Any,
    v: Any,
    kv_pos: Any,
    block_m: int,
    block_n: int,
    out: Any,
    lse: Any,
) -> None:
    """Attention of every local query row over one K/V block, merged into (out, lse)."""
    q_pos = st.positions[st.world.rank]
    if kv_pos.size == 0 or q_pos.size == 0:
        return
    kv_runs = runs(kv_pos)
    tasks = [
        (h, lo, min(lo + block_m, q_pos.size))
        for h in range(st.heads)
        for lo in range(0, q_pos.size, block_m)
    ]

    def one(task: tuple[int, int, int]) -> None:
        h, lo, hi = task
        kh = h // st.group
        for qa, qb, qg, ra, g0, s0, s1 in pieces(q_pos, lo, hi, kv_pos, kv_runs, st.mask, st.docs):
            o_part, l_part = attention_tile(
                q[qa:qb, h],
                k[:, kh],
                v[:, kh],
                q_offset=qg,
                kv_start=s0,
                kv_end=s1,
                block_n=block_n,
                scale=st.scale,
                mask=st.mask,
                k_offset=g0 - ra,
            )
            merge_partial(out[qa:qb, h], lse[qa:qb, h], o_part, l_part)

    list(pool.map(one, tasks))
