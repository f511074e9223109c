"""Single-process multi-head attention on the host: the tile kernel driven by a scheduler.

Workers are persistent "blocks" on a host :class:`~shmem.DeviceContext` (its thread pool is
the host's set of CTAs); each loops ``get_current_work_info`` / ``advance`` until no work is
left. BLAS is limited to one thread per worker while they run.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from shmem import CPU, Block, DeviceContext
from shmem.dtypes import as_dtype, dtype_name
from shmem.errors import AttentionArgumentError

from .kernel import attention_tile
from .scheduler import (
    MaskSpec,
    MHASchedule,
    MHATileSummary,
    QueuedTileScheduler,
    TileScheduler,
    TransientScheduler,
)

__all__ = ["attention", "normalise_window"]

INPUT_DTYPES = ("float32", "float16", "bfloat16")
_ctx_lock = threading.Lock()
_ctx: DeviceContext | None = None


def _context() -> DeviceContext:
    global _ctx
    with _ctx_lock:
        if _ctx is None or _ctx.closed:
            _ctx = DeviceContext(CPU())
        return _ctx


def normalise_window(window: Any, where: str) -> tuple[int | None, int | None]:
    """``None`` -> unbounded; ``w`` -> ``(w, w)``; ``(left, right)`` (None: unbounded)."""
    if window is None:
        return None, None
    if isinstance(window, int) and not isinstance(window, bool):
        window = (window, window)
    if (
        not isinstance(window, tuple)
        or len(window) != 2
        or any(
            w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 0)
            for w in window
        )
    ):
        raise AttentionArgumentError(
            f"{where}: invalid window (got {window!r}; expected None, an int >= 0, or "
            "(left, right) of ints >= 0 or None)"
        )
    return window[0], window[1]


def attention(
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    *,
    causal: bool = False,
    window: Any = None,
    valid_length: Any = None,
    scale: float | None = None,
    scheduler: str = "queued",
    schedule: str | None = None,
    workers: int | None = None,
    block_m: int = 128,
    block_n: int = 256,
    return_lse: bool = False,
) -> Any:
    """Multi-head attention: ``softmax(Q K^T * scale + mask) V`` per head.

    Parameters
    ----------
    q, k, v : ndarray
        Padded ``[batch, seq, heads, head_dim]`` or, with ``valid_length``, ragged
        ``[total_tokens, heads, head_dim]``. ``k``/``v`` may have fewer heads (GQA/MQA:
        ``num_kv_heads`` divides ``num_heads``). float32, float16 or bfloat16.
    causal : bool
        Key ``j`` is visible to query ``i`` only if ``j <= i`` (within each sequence: with
        ragged row offsets this is the document-causal mask).
    window : None, int or (left, right)
        Sliding window: keys ``i - left <= j <= i + right`` (None: unbounded side).
    valid_length : sequence of int, optional
        Row offsets of the ragged sequences (``batch + 1`` values, starting at 0).
    scale : float, optional
        Softmax scale (default ``1 / sqrt(head_dim)``).
    scheduler : {"queued", "static", "transient"}
    schedule : {"default", "prompt_rotate", "lpt"}, optional
        Default: ``lpt`` when the work is uneven (causal, window or ragged), else ``default``.
    workers : int, optional
        Worker threads (default: the host's cores).
    block_m, block_n : int
        Query rows per work item and keys per inner step.
    return_lse : bool
        Also return the log-sum-exp per (row, head), float32.

    Returns
    -------
    O (like ``q``, same dtype), or ``(O, LSE)``.
    """
    where = "attention"
    ragged = valid_length is not None
    q_, k_, v_ = _validate(q, k, v, ragged, where)
    left, right = normalise_window(window, where)
    mask = MaskSpec(causal=bool(causal), left=left, right=right)
    d = q_.shape[-1]
    sc = float(1.0 / math.sqrt(d) if scale is None else scale)
    if ragged:
        offsets = [int(x) for x in valid_length]
        if offsets[-1] != q_.shape[0] or k_.shape[0] != q_.shape[0]:
            raise AttentionArgumentError(
                f"{where}: valid_length does not match the tokens (got last offset "
                f"{offsets[-1]}, {q_.shape[0]} query and {k_.shape[0]} key rows)"
            )
        num_heads, num_kv = q_.shape[1], k_.shape[1]
        summary = MHATileSummary.create(
            num_heads=num_heads, block_m=block_m, block_n=block_n, row_offsets=offsets, mask=mask
        )
        # [heads, tokens, d], float32 and contiguous: tiles are contiguous slices
        qh = np.ascontiguousarray(np.moveaxis(q_, 1, 0), dtype=np.float32)[None]
        kh = np.ascontiguousarray(np.moveaxis(k_, 1, 0), dtype=np.float32)[None]
        vh = np.ascontiguousarray(np.moveaxis(v_, 1, 0), dtype=np.float32)[None]
    else:
        if k_.shape[:2] != q_.shape[:2]:
            raise AttentionArgumentError(
                f"{where}: q and k/v differ in batch or sequence (got {q_.shape[:2]} and "
                f"{k_.shape[:2]})"
            )
        num_heads, num_kv = q_.shape[2], k_.shape[2]
        summary = MHATileSummary.create(
            num_heads=num_heads,
            block_m=block_m,
            block_n=block_n,
            seq_len=q_.shape[1],
            batch_size=q_.shape[0],
            mask=mask,
        )
        qh = np.ascontiguousarray(np.moveaxis(q_, 2, 1), dtype=np.float32)  # [b, h, s, d]
        kh = np.ascontiguousarray(np.moveaxis(k_, 2, 1), dtype=np.float32)
        vh = np.ascontiguousarray(np.moveaxis(v_, 2, 1), dtype=np.float32)
    group = num_heads // num_kv
    out = np.zeros((*qh.shape[:-1], v_.shape[-1]), np.float32)
    lse = np.full(qh.shape[:-1], -np.inf, np.float32)
    n_workers = workers or CPU().attributes.cores or 1
    uneven = causal or left is not None or right is not None or ragged
    order = MHASchedule(schedule or ("lpt" if uneven else "default"))
    if scheduler == "queued":
        sched: Any = QueuedTileScheduler(n_workers, order)
        grid = n_workers
    elif scheduler == "static":
        sched = TileScheduler(n_workers, order)
        grid = n_workers
    elif scheduler == "transient":
        sched = TransientScheduler(num_heads, order)
        grid = summary.num_items
    else:
        raise AttentionArgumentError(
            f"{where}: unknown scheduler (got {scheduler!r}; expected 'queued', 'static' or "
            "'transient')"
        )

    def worker(block: Block) -> None:
        state = sched.initial_state(block.linear_idx, summary)
        while True:
            info = sched.get_current_work_info(summary, state)
            if info.is_valid:
                b, h, off = info.prompt_idx, info.head_idx, info.prompt_offset
                start = summary.start_of_seq(b) if ragged else 0
                bb = 0 if ragged else b
                n = summary.seq_len(b)
                r0, r1 = start + off, start + min(off + block_m, n)
                o, l_ = attention_tile(
                    qh[bb, h, r0:r1],
                    kh[bb, h // group, start : start + n],
                    vh[bb, h // group, start : start + n],
                    q_offset=off,
                    kv_start=info.kv_start,
                    kv_end=info.kv_end,
                    block_n=block_n,
                    scale=sc,
                    mask=mask,
                )
                out[bb, h, r0:r1] = o
                lse[bb, h, r0:r1] = l_
            if not sched.may_advance or sched.advance(summary, state) is None:
                return

    ctx = _context()
    with threadpool_limits(limits=1, user_api="blas"):
        ctx.enqueue_function(worker, grid_dim=grid)
        ctx.synchronize()
    if ragged:
        o_final = np.moveaxis(out[0], 0, 1)
        lse_final = np.moveaxis(lse[0], 0, 1)
    else:
        o_final = np.moveaxis(out, 1, 2)
        lse_final = np.moveaxis(lse, 1, 2)
    result = np.ascontiguousarray(o_final).astype(q.dtype, copy=False)
    if return_lse:
        return result, np.ascontiguousarray(lse_final)
    return result


def _validate(q: Any, k: Any, v: Any, ragged: bool, where: str) -> tuple[Any, Any, Any]:
    arrays = []
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not isinstance(a, np.ndarray):
            raise AttentionArgumentError(
                f"{where}: {name} must be a numpy array (got {type(a).__name__})"
            )
        rank = 3 if ragged else 4
        if a.ndim != rank:
            layout = "[tokens, heads, head_dim]" if ragged else "[batch, seq, heads, head_dim]"
            raise AttentionArgumentError(f"{where}: {name} has rank {a.ndim} (expected {layout})")
        if dtype_name(as_dtype(a.dtype, where)) not in INPUT_DTYPES:
            raise AttentionArgumentError(
                f"{where}: unsupported dtype for {name} (got {a.dtype}; expected one of "
                f"{list(INPUT_DTYPES)})"
            )
        arrays.append(a)
    q_, k_, v_ = arrays
    if k_.shape != (*v_.shape[:-1], k_.shape[-1]) or k_.shape[:-1] != v_.shape[:-1]:
        raise AttentionArgumentError(f"{where}: k and v shapes differ (got {k_.shape}, {v_.shape})")
    if q_.shape[-1] != k_.shape[-1]:
        raise AttentionArgumentError(
            f"{where}: head_dim of q and k differ (got {q_.shape[-1]} and {k_.shape[-1]})"
        )
    hq, hk = q_.shape[-2], k_.shape[-2]
    if hk < 1 or hq % hk:
        raise AttentionArgumentError(
            f"{where}: num_kv_heads must divide num_heads (got {hk} and {hq})"
        )
    return q_, k_, v_
