"""Sequence-parallel attention over symmetric memory: forward, ``ring`` and ``zigzag``.

Each rank holds a shard of one sequence (its query, key and value rows) and computes attention
for its own queries over the whole sequence. The rows a rank holds are a list of *segments*
of the global sequence: one contiguous segment for ``ring``, two for ``zigzag`` (the standard
2P-chunk causal balancing: rank ``r`` holds chunks ``r`` and ``2P - 1 - r``).

K/V live in symmetric buffers. At step ``s`` a rank uses the K/V rows of rank
``(r - s) mod P``: a zero-copy peer view where that rank is load/store reachable, else a
one-sided get into one of two local slots, fetched in the background while the previous step
computes. No rank ever holds the whole sequence. Partial results merge by log-sum-exp in step
order: ``lse = logaddexp(lse_a, lse_b)``, ``O = O_a e^(lse_a - lse) + O_b e^(lse_b - lse)``.

Not yet here (issue 8 continues): the ``dynamic`` cross-rank scheduler, the backward pass,
and per-rank instrumentation.
"""

from __future__ import annotations

import itertools
import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from shmem import CPU
from shmem.errors import ShmemError

from ..communicator import Communicator
from ..schedule import shard_bounds
from .attention import normalise_window
from .kernel import attention_tile
from .scheduler import MaskSpec

__all__ = ["sequence_parallel_attention", "zigzag_shard", "zigzag_unshard"]

SCHEDULES = ("ring", "zigzag")


class SequenceParallelError(ShmemError, ValueError):
    pass


def zigzag_shard(x: np.ndarray[Any, Any], rank: int, world_size: int) -> np.ndarray[Any, Any]:
    """This rank's rows of ``x`` (sequence on axis 0) under zigzag sharding: chunks ``rank``
    and ``2P - 1 - rank`` of ``2P`` near-equal chunks, concatenated."""
    bounds = shard_bounds(x.shape[0], 2 * world_size)
    a0, a1 = bounds[rank]
    b0, b1 = bounds[2 * world_size - 1 - rank]
    return np.concatenate([x[a0:a1], x[b0:b1]], axis=0)


def zigzag_unshard(parts: list[np.ndarray[Any, Any]], total: int) -> np.ndarray[Any, Any]:
    """Reassemble the full sequence from every rank's zigzag shard (in rank order)."""
    p = len(parts)
    bounds = shard_bounds(total, 2 * p)
    out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
    for r, part in enumerate(parts):
        a0, a1 = bounds[r]
        b0, b1 = bounds[2 * p - 1 - r]
        out[a0:a1] = part[: a1 - a0]
        out[b0:b1] = part[a1 - a0 :]
    return out


def _segments(
    schedule: str, total: int, rank: int, size: int, counts: list[int]
) -> list[list[tuple[int, int]]]:
    """For every rank, its segments ``(global_start, length)`` in local row order."""
    if schedule == "ring":
        starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        return [[(int(starts[r]), counts[r])] for r in range(size)]
    bounds = shard_bounds(total, 2 * size)
    out = []
    for r in range(size):
        a0, a1 = bounds[r]
        b0, b1 = bounds[2 * size - 1 - r]
        out.append([(a0, a1 - a0), (b0, b1 - b0)])
    return out


def _docs(valid_length: Any, total: int) -> np.ndarray[Any, Any] | None:
    if valid_length is None:
        return None
    offs = np.asarray([int(v) for v in valid_length], dtype=np.int64)
    if (
        offs.ndim != 1
        or offs.size < 2
        or offs[0] != 0
        or offs[-1] != total
        or (np.diff(offs) < 0).any()
    ):
        raise SequenceParallelError(
            f"sequence_parallel_attention: invalid valid_length (expected row offsets from 0 to "
            f"the total length {total}, non-decreasing)"
        )
    return offs


def sequence_parallel_attention(
    comm: Communicator,
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    *,
    causal: bool = False,
    window: Any = None,
    valid_length: Any = None,
    scale: float | None = None,
    schedule: str = "ring",
    block_m: int = 128,
    block_n: int = 256,
    return_lse: bool = False,
) -> Any:
    """Attention of this rank's queries over the whole sharded sequence (collective).

    Parameters
    ----------
    comm : collectives.Communicator
    q, k, v : ndarray
        This rank's rows ``[rows, heads, head_dim]`` (``k``/``v`` may have fewer heads:
        GQA). ``ring``: rank ``r`` holds the ``r``-th contiguous shard (any lengths, in rank
        order). ``zigzag``: rank ``r`` holds :func:`zigzag_shard` of the sequence.
    causal, window : as for :func:`collectives.mha.attention`, on global positions.
    valid_length : sequence of int, optional
        Global row offsets of the documents packed in the sequence: attention stays within a
        document (document-causal with ``causal=True``).
    schedule : {"ring", "zigzag"}

    Returns
    -------
    O for this rank's rows (dtype of ``q``), or ``(O, LSE)`` with LSE ``[rows, heads]``.
    """
    where = "sequence_parallel_attention"
    if schedule not in SCHEDULES:
        raise SequenceParallelError(
            f"{where}: unknown schedule (got {schedule!r}; expected one of {list(SCHEDULES)}; "
            "'dynamic' is not implemented yet)"
        )
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not isinstance(a, np.ndarray) or a.ndim != 3:
            raise SequenceParallelError(f"{where}: {name} must be [rows, heads, head_dim]")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise SequenceParallelError(
            f"{where}: shapes do not match (got q {q.shape}, k {k.shape}, v {v.shape})"
        )
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    if q.shape[1] % kv_heads:
        raise SequenceParallelError(f"{where}: num_kv_heads must divide num_heads")
    world = comm.world
    rank, size = world.rank, world.world_size
    counts = [int(c) for c in world.comm.allgather(q.shape[0])]
    total = sum(counts)
    segs = _segments(schedule, total, rank, size, counts)
    if schedule == "zigzag" and [sum(n for _, n in sg) for sg in segs] != counts:
        raise SequenceParallelError(
            f"{where}: zigzag shards have the wrong lengths (got {counts}; shard the caller's "
            "tokens with zigzag_shard)"
        )
    left, right = normalise_window(window, where)
    mask = MaskSpec(causal=bool(causal), left=left, right=right)
    docs = _docs(valid_length, total)
    sc = float(1.0 / math.sqrt(dim) if scale is None else scale)
    group = heads // kv_heads
    # K/V in symmetric memory, [max rows, kv_heads, dim] float32 (collective)
    rows_max = max(*counts, 1)
    k_sym = world.empty((rows_max, kv_heads, dim), "float32")
    v_sym = world.empty((rows_max, kv_heads, dim), "float32")
    try:
        k_sym.local()[: q.shape[0]] = k
        v_sym.local()[: q.shape[0]] = v
        world.barrier()
        q32 = np.ascontiguousarray(q, dtype=np.float32)
        out = np.zeros((q.shape[0], heads, dim), np.float32)
        lse = np.full((q.shape[0], heads), -np.inf, np.float32)
        my_rows = _positions(segs[rank])
        workers = CPU().attributes.cores or 1
        slots = [np.empty((rows_max, kv_heads, dim), np.float32) for _ in range(2)]
        with (
            ThreadPoolExecutor(1) as fetcher,
            ThreadPoolExecutor(workers) as pool,
            threadpool_limits(limits=1, user_api="blas"),
        ):
            pending = _fetch(fetcher, world, k_sym, v_sym, rank, counts[rank], slots[0])
            for step in range(size):
                src = (rank - step) % size
                kv_k, kv_v = pending.result()
                if step + 1 < size:  # prefetch the next block while this one computes
                    nxt = (rank - step - 1) % size
                    pending = _fetch(
                        fetcher, world, k_sym, v_sym, nxt, counts[nxt], slots[(step + 1) % 2]
                    )
                kv_pos = _positions(segs[src])
                _accumulate(
                    pool,
                    q32,
                    kv_k,
                    kv_v,
                    my_rows,
                    kv_pos,
                    mask,
                    docs,
                    sc,
                    group,
                    block_m,
                    block_n,
                    out,
                    lse,
                )
        world.barrier()  # every peer is done reading my K/V
    finally:
        k_sym.close()
        v_sym.close()
    result = out.astype(q.dtype, copy=False)
    return (result, lse) if return_lse else result


def _positions(segments: list[tuple[int, int]]) -> np.ndarray[Any, Any]:
    return (
        np.concatenate([np.arange(s, s + n) for s, n in segments])
        if segments
        else np.zeros(0, np.int64)
    )


def _fetch(
    fetcher: ThreadPoolExecutor,
    world: Any,
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
    q: Any,
    k: Any,
    v: Any,
    q_pos: Any,
    kv_pos: Any,
    mask: MaskSpec,
    docs: Any,
    scale: float,
    group: int,
    block_m: int,
    block_n: int,
    out: Any,
    lse: Any,
) -> None:
    """Attention of every local query row over one K/V block, merged into (out, lse)."""
    if kv_pos.size == 0 or q_pos.size == 0:
        return
    # the block's rows are runs of consecutive global positions (one per segment)
    runs = _runs(kv_pos)
    heads = q.shape[1]
    tasks = []
    for h in range(heads):
        for lo in range(0, q_pos.size, block_m):
            tasks.append((h, lo, min(lo + block_m, q_pos.size)))

    def one(task: tuple[int, int, int]) -> None:
        h, lo, hi = task
        for qa, qb in _runs_between(q_pos, lo, hi, docs):
            q_global = int(q_pos[qa])
            rows = qb - qa
            doc_lo, doc_hi = 0, 1 << 62
            if docs is not None:  # runs never cross a document boundary
                d = int(np.searchsorted(docs, q_global, side="right") - 1)
                doc_lo, doc_hi = int(docs[d]), int(docs[d + 1])
            k0, k1 = mask.kv_range(q_global, q_global + rows, 1 << 62)
            for ra, rb in runs:
                g0 = int(kv_pos[ra])
                g1 = g0 + (rb - ra)
                s0, s1 = max(k0, g0, doc_lo), min(k1, g1, doc_hi)
                if s1 <= s0:
                    continue
                o_part, l_part = attention_tile(
                    q[qa:qb, h],
                    k[ra:rb, h // group],
                    v[ra:rb, h // group],
                    q_offset=q_global,
                    kv_start=s0,
                    kv_end=s1,
                    block_n=block_n,
                    scale=scale,
                    mask=mask,
                    k_offset=g0,
                )
                _merge(out[qa:qb, h], lse[qa:qb, h], o_part, l_part)

    list(pool.map(one, tasks))


def _runs(pos: Any) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` local index ranges of consecutive global positions."""
    if pos.size == 0:
        return []
    breaks = np.nonzero(np.diff(pos) != 1)[0] + 1
    edges = [0, *breaks.tolist(), int(pos.size)]
    return list(itertools.pairwise(edges))


def _runs_between(pos: Any, lo: int, hi: int, docs: Any = None) -> list[tuple[int, int]]:
    """Runs of consecutive positions in ``pos[lo:hi]``, also cut at document boundaries."""
    out = []
    for run_a, run_b in _runs(pos[lo:hi]):
        start, stop = run_a + lo, run_b + lo
        if docs is not None:
            g0, g1 = int(pos[start]), int(pos[stop - 1]) + 1
            for cut in (int(c) for c in docs if g0 < c < g1):
                mid = start + (cut - int(pos[start]))
                out.append((start, mid))
                start = mid
        out.append((start, stop))
    return out


def _merge(out: Any, lse: Any, o_part: Any, l_part: Any) -> None:
    """Fold a partial (O, LSE) into the running one, rows where the partial saw keys."""
    new = np.logaddexp(lse, l_part)
    seen = np.isfinite(new)
    w_old = np.where(seen, np.exp(np.where(seen, lse - new, 0)), 0).astype(np.float32)
    w_new = np.where(seen, np.exp(np.where(seen, l_part - new, 0)), 0).astype(np.float32)
    out[...] = out * w_old[:, None] + o_part * w_new[:, None]
    lse[...] = new
