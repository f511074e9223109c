"""Single-process multi-head attention: the tile kernel driven by a scheduler.

On the host, workers are persistent "blocks" on a host :class:`~shmem.DeviceContext` (its
thread pool is the host's set of CTAs); each loops ``get_current_work_info`` / ``advance``
until no work is left. BLAS is limited to one thread per worker while they run. GPU inputs
(torch or cupy tensors, GPU Buffers) run the CUDA kernels of :mod:`collectives.mha.gpu`,
stepping through the same scheduler's work order.
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

from ..interop import is_gpu_array
from .gpu import attention_backward_gpu, attention_gpu
from .kernel import attention_tile, attention_tile_backward
from .scheduler import (
    MaskSpec,
    MHASchedule,
    MHATileSummary,
    QueuedTileScheduler,
    TileScheduler,
    TransientScheduler,
)

__all__ = ["attention", "attention_backward", "normalise_window"]

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


def _heads_major(
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    offsets: Any,
    block_m: int,
    block_n: int,
    mask: MaskSpec,
) -> tuple[MHATileSummary, tuple[np.ndarray[Any, Any], ...]]:
    """The tile summary, and q, k, v as float32 ``[batch, heads, tokens, d]`` (ragged: one
    batch of all tokens) in contiguous memory, so that tiles are contiguous slices."""
    if offsets is not None:
        summary = MHATileSummary.create(
            num_heads=q.shape[1], block_m=block_m, block_n=block_n, row_offsets=offsets, mask=mask
        )
        axis = 1
    else:
        summary = MHATileSummary.create(
            num_heads=q.shape[2],
            block_m=block_m,
            block_n=block_n,
            seq_len=q.shape[1],
            batch_size=q.shape[0],
            mask=mask,
        )
        axis = 2
    arrays = tuple(
        np.ascontiguousarray(np.moveaxis(a, axis, axis - 1), dtype=np.float32) for a in (q, k, v)
    )
    return summary, tuple(a[None] for a in arrays) if offsets is not None else arrays


def _host_scheduler(
    where: str,
    scheduler: str,
    n_workers: int,
    num_heads: int,
    order: MHASchedule,
    summary: MHATileSummary,
) -> tuple[Any, int]:
    """The host scheduler named ``scheduler`` and the number of workers it runs on."""
    if scheduler == "queued":
        return QueuedTileScheduler(n_workers, order), n_workers
    if scheduler == "static":
        return TileScheduler(n_workers, order), n_workers
    if scheduler == "transient":
        return TransientScheduler(num_heads, order), summary.num_items
    raise AttentionArgumentError(
        f"{where}: unknown scheduler (got {scheduler!r}; expected 'queued', 'static' or "
        "'transient')"
    )


def attention(
    q: Any,
    k: Any,
    v: Any,
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
    stream: Any = None,
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
        Worker threads (default: the host's cores); on a GPU, persistent CTAs (default: two
        per multiprocessor).
    block_m, block_n : int
        Query rows per work item and keys per inner step (host; the GPU kernels use 64 and
        64).
    return_lse : bool
        Also return the log-sum-exp per (row, head), float32.
    stream : optional
        GPU inputs only: a GPU DeviceContext or an object with ``__cuda_stream__`` to queue
        the kernel on (the call then returns at once); default: wait for the result.

    Returns
    -------
    O (like ``q``, same dtype and kind of array), or ``(O, LSE)``.

    Raises
    ------
    AttentionArgumentError
        Invalid shapes (rank, k/v or head_dim mismatch, heads not a multiple of the KV heads),
        dtype, ``window``, ``valid_length`` or ``scheduler``, or ``stream`` with host arrays.
    """
    where = "attention"
    ragged = valid_length is not None
    left, right = normalise_window(window, where)
    mask = MaskSpec(causal=bool(causal), left=left, right=right)
    uneven = causal or left is not None or right is not None or ragged
    order = MHASchedule(schedule or ("lpt" if uneven else "default"))
    if any(is_gpu_array(a) for a in (q, k, v)):
        shapes = [tuple(int(n) for n in a.shape) for a in (q, k, v)]
        _check_shapes(shapes[0], shapes[1], shapes[2], ragged, where)
        offsets = _offsets(valid_length, shapes[0], shapes[1], where) if ragged else None
        d = shapes[0][-1]
        return attention_gpu(
            q,
            k,
            v,
            mask=mask,
            offsets=offsets,
            scale=float(1.0 / math.sqrt(d) if scale is None else scale),
            scheduler=scheduler,
            schedule=order,
            workers=workers,
            return_lse=return_lse,
            stream=stream,
        )
    if stream is not None:
        raise AttentionArgumentError(
            f"{where}: stream= applies to GPU inputs (got numpy arrays and {stream!r})"
        )
    q_, k_, v_ = _validate(q, k, v, ragged, where)
    d = q_.shape[-1]
    sc = float(1.0 / math.sqrt(d) if scale is None else scale)
    offsets = _offsets(valid_length, q_.shape, k_.shape, where) if ragged else None
    summary, (qh, kh, vh) = _heads_major(q_, k_, v_, offsets, block_m, block_n, mask)
    num_heads, num_kv = qh.shape[1], kh.shape[1]
    group = num_heads // num_kv
    out = np.zeros((*qh.shape[:-1], v_.shape[-1]), np.float32)
    lse = np.full(qh.shape[:-1], -np.inf, np.float32)
    n_workers = workers or CPU().attributes.cores or 1
    sched, grid = _host_scheduler(where, scheduler, n_workers, num_heads, order, summary)

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


def _offsets(
    valid_length: Any, q_shape: tuple[int, ...], k_shape: tuple[int, ...], where: str
) -> list[int]:
    offsets = [int(x) for x in valid_length]
    if offsets[-1] != q_shape[0] or k_shape[0] != q_shape[0]:
        raise AttentionArgumentError(
            f"{where}: valid_length does not match the tokens (got last offset "
            f"{offsets[-1]}, {q_shape[0]} query and {k_shape[0]} key rows)"
        )
    return offsets


def _check_shapes(
    qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], ragged: bool, where: str
) -> None:
    """The layout rules shared by the host and the GPU: rank, k/v agreement, head_dim, GQA."""
    rank = 3 if ragged else 4
    for name, shape in (("q", qs), ("k", ks), ("v", vs)):
        if len(shape) != rank:
            layout = "[tokens, heads, head_dim]" if ragged else "[batch, seq, heads, head_dim]"
            raise AttentionArgumentError(
                f"{where}: {name} has rank {len(shape)} (expected {layout})"
            )
    if ks[:-1] != vs[:-1]:
        raise AttentionArgumentError(f"{where}: k and v shapes differ (got {ks}, {vs})")
    if qs[-1] != ks[-1]:
        raise AttentionArgumentError(
            f"{where}: head_dim of q and k differ (got {qs[-1]} and {ks[-1]})"
        )
    if not ragged and ks[:2] != qs[:2]:
        raise AttentionArgumentError(
            f"{where}: q and k/v differ in batch or sequence (got {qs[:2]} and {ks[:2]})"
        )
    hq, hk = qs[-2], ks[-2]
    if hk < 1 or hq % hk:
        raise AttentionArgumentError(
            f"{where}: num_kv_heads must divide num_heads (got {hk} and {hq})"
        )


def _validate(q: Any, k: Any, v: Any, ragged: bool, where: str) -> tuple[Any, Any, Any]:
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not isinstance(a, np.ndarray):
            raise AttentionArgumentError(
                f"{where}: {name} must be a numpy array or a GPU array (got {type(a).__name__})"
            )
        if dtype_name(as_dtype(a.dtype, where)) not in INPUT_DTYPES:
            raise AttentionArgumentError(
                f"{where}: unsupported dtype for {name} (got {a.dtype}; expected one of "
                f"{list(INPUT_DTYPES)})"
            )
    _check_shapes(q.shape, k.shape, v.shape, ragged, where)
    return q, k, v


def _host_backward(
    qh: np.ndarray[Any, Any],
    kh: np.ndarray[Any, Any],
    vh: np.ndarray[Any, Any],
    doh: np.ndarray[Any, Any],
    lh: np.ndarray[Any, Any],
    delta: np.ndarray[Any, Any],
    summary: MHATileSummary,
    ragged: bool,
    block_n: int,
    sc: float,
    mask: MaskSpec,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """dQ, dK, dV in the heads-major float32 layout, tile by tile on this thread."""
    block_m = summary.block_m
    num_heads, num_kv = qh.shape[1], kh.shape[1]
    group = num_heads // num_kv
    dq = np.zeros_like(qh)
    dk = np.zeros_like(kh)
    dv = np.zeros_like(vh)
    for b in range(summary.batch_size):
        start = summary.start_of_seq(b) if ragged else 0
        bb = 0 if ragged else b
        n = summary.seq_len(b)
        for h in range(num_heads):
            hk = h // group
            for off in range(0, n, block_m):
                r0, r1 = start + off, start + min(off + block_m, n)
                kv0, kv1 = mask.kv_range(off, min(off + block_m, n), n)
                if kv1 <= kv0:
                    continue
                gq, gk, gv = attention_tile_backward(
                    qh[bb, h, r0:r1],
                    kh[bb, hk, start : start + n],
                    vh[bb, hk, start : start + n],
                    doh[bb, h, r0:r1],
                    lh[bb, h, r0:r1],
                    delta[bb, h, r0:r1],
                    q_offset=off,
                    kv_start=kv0,
                    kv_end=kv1,
                    block_n=block_n,
                    scale=sc,
                    mask=mask,
                )
                dq[bb, h, r0:r1] += gq
                dk[bb, hk, start + kv0 : start + kv1] += gk
                dv[bb, hk, start + kv0 : start + kv1] += gv
    return dq, dk, dv


def attention_backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    *,
    causal: bool = False,
    window: Any = None,
    valid_length: Any = None,
    scale: float | None = None,
    block_m: int = 128,
    block_n: int = 256,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """Gradients ``(dq, dk, dv)`` of :func:`attention` (FlashAttention-2 backward, ``P``
    recomputed from the forward's ``lse``), given its inputs, its output ``out``, its
    ``lse`` (``return_lse=True``) and ``dout`` = dL/dO; the same layouts and masks.
    Gradients come in the inputs' dtype (computed in float32); for GQA, ``dk``/``dv``
    sum over the query heads that share a KV head. On a GPU the kernels of
    :mod:`collectives.mha.gpu` run (deterministic: no atomics).

    Parameters
    ----------
    q, k, v : ndarray
        The forward's inputs (the layouts of :func:`attention`).
    out, lse : ndarray
        The forward's output and its log-sum-exp per (row, head) (``return_lse=True``).
    dout : ndarray
        dL/dO, of ``q``'s shape.
    causal, window, valid_length, scale
        The forward's mask and scale (as :func:`attention`'s).
    block_m, block_n : int
        Query rows and keys per tile (host).
    stream : optional
        GPU inputs only: a GPU DeviceContext or an object with ``__cuda_stream__``.

    Returns
    -------
    dq, dk, dv
        Like ``q``, ``k`` and ``v`` (their dtypes and kind of array).

    Raises
    ------
    AttentionArgumentError
        Invalid shapes (as :func:`attention`; ``out``, ``dout`` like ``q``, ``lse`` like ``q``
        without ``head_dim``), dtypes, ``window`` or ``valid_length``, or ``stream`` with
        host arrays.
    """
    where = "attention_backward"
    ragged = valid_length is not None
    left, right = normalise_window(window, where)
    mask = MaskSpec(causal=bool(causal), left=left, right=right)
    shapes = [tuple(int(n) for n in a.shape) for a in (q, k, v)]
    _check_shapes(shapes[0], shapes[1], shapes[2], ragged, where)
    for name, a in (("out", out), ("dout", dout)):
        if tuple(a.shape) != shapes[0]:
            raise AttentionArgumentError(
                f"{where}: {name} must have q's shape {shapes[0]} (got {tuple(a.shape)})"
            )
    if tuple(lse.shape) != shapes[0][:-1]:
        raise AttentionArgumentError(
            f"{where}: lse must have shape {shapes[0][:-1]} (got {tuple(lse.shape)})"
        )
    offsets = _offsets(valid_length, shapes[0], shapes[1], where) if ragged else None
    d = shapes[0][-1]
    sc = float(1.0 / math.sqrt(d) if scale is None else scale)
    if any(is_gpu_array(a) for a in (q, k, v, out, lse, dout)):
        return attention_backward_gpu(
            q, k, v, out, lse, dout, mask=mask, offsets=offsets, scale=sc, stream=stream
        )
    if stream is not None:
        raise AttentionArgumentError(
            f"{where}: stream= applies to GPU inputs (got numpy arrays and {stream!r})"
        )
    for name, a in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
        if (
            not isinstance(a, np.ndarray)
            or dtype_name(as_dtype(a.dtype, where)) not in INPUT_DTYPES
        ):
            raise AttentionArgumentError(
                f"{where}: {name} must be a numpy array of {list(INPUT_DTYPES)} (got "
                f"{type(a).__name__} {getattr(a, 'dtype', '')})"
            )
    # [batch, heads, seq, d] float32 (ragged: one batch of all tokens)
    axis = 1 if ragged else 2

    def heads_first(a: Any) -> np.ndarray[Any, Any]:
        h = np.ascontiguousarray(np.moveaxis(np.asarray(a), axis, axis - 1), dtype=np.float32)
        return h[None] if ragged else h

    qh, kh, vh, oh, doh = (heads_first(a) for a in (q, k, v, out, dout))
    lh = np.moveaxis(np.asarray(lse, np.float32), axis, axis - 1)
    lh = lh[None] if ragged else lh
    delta = np.einsum("bhsd,bhsd->bhs", doh, oh)
    summary = MHATileSummary.create(  # row_offsets, when given, win over the padded shape
        num_heads=qh.shape[1],
        block_m=block_m,
        block_n=block_n,
        seq_len=qh.shape[2],
        batch_size=qh.shape[0],
        row_offsets=offsets,
        mask=mask,
    )
    dq, dk, dv = _host_backward(qh, kh, vh, doh, lh, delta, summary, ragged, block_n, sc, mask)

    def back(g: np.ndarray[Any, Any], like: Any) -> np.ndarray[Any, Any]:
        g = g[0] if ragged else g
        return np.ascontiguousarray(np.moveaxis(g, axis - 1, axis)).astype(like.dtype, copy=False)

    return back(dq, q), back(dk, k), back(dv, v)
