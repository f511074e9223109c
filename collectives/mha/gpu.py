"""Attention on one GPU: the persistent FlashAttention-2 kernels of
``collectives/kernels/attention.cu``, driven by the host's scheduler model.

:func:`collectives.mha.attention` comes here when its inputs are on a GPU (torch or cupy
tensors, DLPack producers on CUDA, GPU :class:`~shmem.Buffer`\\ s); outputs are made by the
input's own library. The work order is enumerated on the host by the same scheduler classes
the host kernel uses (:func:`work_order`), uploaded once per shape, and stepped through by
the kernel (transient: one CTA per item; static: stride by the CTA count; queued: a global
atomic counter), so host and GPU take the same tiles in the same order.

Precision: bfloat16 and float16 inputs run on tensor cores (``mma.sync`` m16n8k16, float32
accumulation, P rounded to the input type before P V, as FlashAttention-2 does) for head_dim
64, 80, 96 and 128; float32 inputs, and other head dims up to 128, run on the general path
(CUDA cores, float32 throughout). The LSE is float32. The backward pass recomputes P from
the LSE in float32 on CUDA cores and is bitwise deterministic (no atomics).

Streams: with ``stream=None`` the call runs on this module's stream for the device and waits
for it before returning; with ``stream=`` (a GPU :class:`~shmem.DeviceContext`, or any
object with ``__cuda_stream__``, such as a torch stream) the kernels are queued there and the
call returns at once. Inputs written on another stream must be ordered before the call by
the caller (as with NCCL).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from shmem import Buffer, DeviceContext
from shmem import cuda as shmem_cuda
from shmem.dtypes import dtype_name
from shmem.errors import ArgumentError, AttentionArgumentError

from ..interop import is_gpu_array, like, upload
from .gpu_args import (
    GPU_DTYPES,
    backward_inputs,
    backward_layout,
    forward_inputs,
    forward_layout,
)
from .scheduler import (
    MaskSpec,
    MHASchedule,
    MHATileSummary,
    QueuedTileScheduler,
    TileScheduler,
    TransientScheduler,
)

__all__ = [
    "GPU_DTYPES",
    "TENSOR_CORE_DIMS",
    "attention_backward_gpu",
    "attention_gpu",
    "device_context",
    "is_gpu_array",
    "kernel_name",
    "work_order",
    "worker_items",
]

KERNELS = "collectives/kernels/attention.cu"
THREADS = 128
TENSOR_CORE_DIMS = (64, 80, 96, 128)
MODES = {"transient": 0, "static": 1, "queued": 2}
CTAS_PER_SM = 2  # up to 226 registers x 128 threads: two CTAs fit an SM (nvcc --resource-usage)

_lock = threading.Lock()
_contexts: dict[int, DeviceContext] = {}
_pending: list[tuple[Any, tuple[object, ...]]] = []  # (event, buffers) of unwaited launches
_orders: OrderedDict[tuple[object, ...], Buffer] = OrderedDict()
_ORDERS_MAX = 32


def kernel_name(dtype: str, head_dim: int) -> str:
    """The forward kernel for inputs of ``dtype`` and ``head_dim``: the tensor-core kernel
    where one is instantiated, else the general path."""
    if dtype in ("bfloat16", "float16") and head_dim in TENSOR_CORE_DIMS:
        return f"mha_fwd_{dtype}_d{head_dim}"
    return f"mha_fwd_{dtype}_general"


def _scheduler(kind: str, order: MHASchedule, workers: int, num_heads: int) -> Any:
    if kind == "queued":
        return QueuedTileScheduler(workers, order)
    if kind == "static":
        return TileScheduler(workers, order)
    if kind == "transient":
        return TransientScheduler(num_heads, order)
    raise AttentionArgumentError(
        f"attention: unknown scheduler (got {kind!r}; expected 'queued', 'static' or 'transient')"
    )


def work_order(
    summary: MHATileSummary, scheduler: str, schedule: MHASchedule | str, workers: int
) -> tuple[np.ndarray[Any, np.dtype[np.int32]], int, int]:
    """``(table, grid, mode)`` for the kernel: ``table[i] = (batch, head, tile)`` of linear
    index ``i`` as the host scheduler enumerates it (for ``transient``, of CTA ``i``'s item,
    so a flip is the host's), the CTA count, and the kernel's mode number."""
    order = MHASchedule(schedule)
    sched = _scheduler(scheduler, order, max(workers, 1), summary.num_heads)
    n = summary.num_items
    if scheduler == "transient":
        idx = [sched.initial_state(w, summary).idx for w in range(n)]
        grid = n
    else:
        idx = list(range(n))
        grid = max(1, min(workers, n))
    table = np.array([sched.item(summary, i) for i in idx], dtype=np.int32).reshape(n, 3)
    return table, grid, MODES[scheduler]


def worker_items(sched: Any, summary: MHATileSummary, worker: int) -> list[int]:
    """The linear indices a deterministic scheduler (``TransientScheduler``,
    ``TileScheduler``) gives ``worker``, in order, as the host loop takes them: what the
    kernel's trace must show for CTA ``worker``."""
    state = sched.initial_state(worker, summary)
    taken = []
    while state.idx < summary.num_items:
        taken.append(state.idx)
        if not sched.may_advance or sched.advance(summary, state) is None:
            break
    return taken


# -- inputs and outputs --------------------------------------------------------------------------


def device_context(device_id: int) -> DeviceContext:
    """This module's context for a GPU, made on first use (thread-safe).

    Parameters
    ----------
    device_id : int
        The CUDA device ordinal.

    Returns
    -------
    shmem.DeviceContext
        The context whose stream the kernels run on when a call passes no ``stream=`` (the
        same object on every call, until it is closed).
    """
    with _lock:
        ctx = _contexts.get(device_id)
        if ctx is None or ctx.closed:
            from shmem import Accelerator

            ctx = _contexts[device_id] = DeviceContext(Accelerator(device_id))
        return ctx


def _stream(stream: Any, device: Any, where: str) -> tuple[Any, bool]:
    """``(cuda.core stream, whether the call waits for it)``."""
    try:
        got = shmem_cuda.as_stream(stream, device, where)
    except ArgumentError as exc:
        raise AttentionArgumentError(str(exc)) from None
    if got is None:
        return device_context(device.id).stream, True
    return got, False


def _order_buffer(
    device: Any, summary: MHATileSummary, scheduler: str, schedule: MHASchedule, workers: int
) -> tuple[Buffer, int, int]:
    table, grid, mode = work_order(summary, scheduler, schedule, workers)
    key = (device.id, summary, scheduler, schedule, grid)
    with _lock:
        buf = _orders.get(key)
        if buf is not None:
            _orders.move_to_end(key)
            return buf, grid, mode
    buf = upload(table, device)
    with _lock:
        _orders[key] = buf
        while len(_orders) > _ORDERS_MAX:
            _orders.popitem(last=False)
    return buf, grid, mode


def _counter_buffer(device: Any, stream: Any) -> Buffer:
    """The queued scheduler's two counters for one launch, zeroed on its stream (launches
    on different streams may overlap: each has its own; a memset node under capture)."""
    buf = Buffer("int32", (2,), device=device)
    # its stream-ordered allocation comes before the launch stream uses it
    shmem_cuda.default_stream_synchronize(device)
    shmem_cuda.memset_async(buf.unsafe_ptr(), 0, 8, stream)
    return buf


def _keep(stream: Any, *objs: object) -> None:
    """Keep ``objs`` (buffers a queued kernel reads or writes) alive until the work queued on
    ``stream`` so far is done; entries whose event completed are dropped."""
    event = stream.record()
    with _lock:
        _pending[:] = [(e, o) for e, o in _pending if not e.is_done]
        _pending.append((event, objs))


def _ptr(buf: Buffer | None) -> np.uint64:
    return np.uint64(0 if buf is None else buf.unsafe_ptr())


_WIDE = 1 << 30  # a window side this wide is unbounded for any sequence (no int overflow)


def _mask_args(mask: MaskSpec) -> list[np.int32]:
    return [
        np.int32(1 if mask.causal else 0),
        np.int32(-1 if mask.left is None else min(mask.left, _WIDE)),
        np.int32(-1 if mask.right is None else min(mask.right, _WIDE)),
    ]


# -- forward -------------------------------------------------------------------------------------


def attention_gpu(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: MaskSpec,
    offsets: list[int] | None,
    scale: float,
    scheduler: str,
    schedule: MHASchedule,
    workers: int | None,
    return_lse: bool,
    stream: Any = None,
    trace: Buffer | None = None,
    trace_cap: int = 0,
    delta: int = 0,
) -> Any:
    """The forward pass on a GPU (called by :func:`collectives.mha.attention`, which has
    checked shapes, dtypes, the mask and the offsets).

    Padded inputs may have another number of keys than query rows (``k``/``v``
    ``[batch, kv_len, kv_heads, d]``), query row ``i`` standing at key position
    ``i + delta`` for every mask: a sequence-parallel unit, a query chunk against another
    chunk's keys (the caller checks those shapes)."""
    where = "attention"
    qb, kb, vb = forward_inputs(q, k, v, where)
    device, dtype, d = qb.device, dtype_name(qb.dtype), qb.shape[-1]
    ragged = offsets is not None
    summary, (seq, heads, kv_heads, kv_seq), lse_shape = forward_layout(qb, kb, offsets, mask)
    out = Buffer(qb.dtype, qb.shape, device=device)
    lse = Buffer("float32", lse_shape, device=device)
    if summary.num_items == 0:
        return (like(q, out), like(q, lse)) if return_lse else like(q, out)
    sms = int(device.attributes.multiprocessor_count or 1)
    n_workers = workers or CTAS_PER_SM * sms
    order_buf, grid, mode = _order_buffer(device, summary, scheduler, schedule, n_workers)
    offs_buf = upload(np.asarray(offsets, np.int64), device) if ragged else None
    cuda_stream, wait = _stream(stream, device, where)
    counters = _counter_buffer(device, cuda_stream) if scheduler == "queued" else None
    # element strides (batch, row, head) of the contiguous layouts
    row_q, row_k = heads * d, kv_heads * d
    per_batch_q, per_batch_k = (0, 0) if ragged else (seq * row_q, kv_seq * row_k)
    i64 = np.int64
    strides = [
        *(i64(per_batch_q), i64(row_q), i64(d)),  # q
        *(i64(per_batch_k), i64(row_k), i64(d)),  # k
        *(i64(per_batch_k), i64(row_k), i64(d)),  # v
        *(i64(per_batch_q), i64(row_q), i64(d)),  # o
        *(i64(0 if ragged else seq * heads), i64(heads), i64(1)),  # lse
    ]
    name = kernel_name(dtype, d)
    args: list[Any] = [
        _ptr(qb),
        _ptr(kb),
        _ptr(vb),
        _ptr(out),
        _ptr(lse),
        _ptr(order_buf),
        np.int32(summary.num_items),
        np.int32(mode),
        _ptr(counters),
        _ptr(offs_buf),
        np.int32(seq),
        np.int32(0 if ragged else kv_seq),
        _ptr(trace),
        np.int32(trace_cap),
        *strides,
        *_mask_args(mask),
        np.int32(delta),
        np.int32(heads // kv_heads),
        np.float32(scale * math.log2(math.e)),
    ]
    if name.endswith("_general"):
        args.append(np.int32(d))
    fn = shmem_cuda.load_kernel(device.id, KERNELS, name)
    if not wait:
        # out and lse: their stream-ordered allocations come first
        shmem_cuda.default_stream_synchronize(device)
    shmem_cuda.launch(cuda_stream, fn, grid, THREADS, *args)
    if wait:
        cuda_stream.sync()
    else:
        _keep(cuda_stream, qb, kb, vb, out, lse, order_buf, counters, offs_buf, trace)
    return (like(q, out), like(q, lse)) if return_lse else like(q, out)


# -- backward ------------------------------------------------------------------------------------


def attention_backward_gpu(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    *,
    mask: MaskSpec,
    offsets: list[int] | None,
    scale: float,
    stream: Any = None,
    delta: int = 0,
) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` on a GPU (FA2 backward; P recomputed from ``lse``); gradients in the
    inputs' dtype (computed in float32), deterministic. Padded ``k``/``v`` may have their
    own number of keys, query row ``i`` at key position ``i + delta`` (as
    :func:`attention_gpu`)."""
    where = "attention_backward"
    bufs = backward_inputs((q, k, v, out, lse, dout), where)
    qb, kb, vb, ob, lb, db = bufs
    device, dtype, d = qb.device, dtype_name(qb.dtype), qb.shape[-1]
    ragged = offsets is not None
    rows, heads, kv_heads, batch, seq, kv_seq, longest, kv_longest = backward_layout(
        qb, kb, offsets, where
    )
    if ob.shape != qb.shape or db.shape != qb.shape:
        raise AttentionArgumentError(
            f"{where}: out and dout must have q's shape {qb.shape} (got {ob.shape}, {db.shape})"
        )
    dq = Buffer(qb.dtype, qb.shape, device=device)
    dk = Buffer(kb.dtype, kb.shape, device=device)
    dv = Buffer(vb.dtype, vb.shape, device=device)
    dvec = Buffer("float32", (max(rows * heads, 1),), device=device)
    cuda_stream, wait = _stream(stream, device, where)
    offs_buf = upload(np.asarray(offsets, np.int64), device) if ragged else None
    if not wait:
        # the outputs' stream-ordered allocations come first
        shmem_cuda.default_stream_synchronize(device)
    common = [
        _ptr(offs_buf),
        np.int32(seq),
        np.int32(kv_seq),
        np.int32(heads),
        np.int32(kv_heads),
        np.int32(d),
        *_mask_args(mask),
        np.int32(delta),
        np.float32(scale),
    ]
    # every gradient element is written by its kernel, zero where no key or row reaches it
    # (dq of rows before any key, dk/dv of keys after every row); nothing runs for none
    if rows and longest:
        fn = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_bwd_dvec_{dtype}")
        warps = rows * heads
        shmem_cuda.launch(
            cuda_stream,
            fn,
            -(-warps // (THREADS // 32)),
            THREADS,
            _ptr(ob),
            _ptr(db),
            _ptr(dvec),
            np.int64(rows),
            np.int32(heads),
            np.int32(d),
        )
        fn = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_bwd_dq_{dtype}")
        _launch3(
            cuda_stream,
            fn,
            (-(-longest // 32), batch, heads),
            [_ptr(qb), _ptr(kb), _ptr(vb), _ptr(db), _ptr(lb), _ptr(dvec), _ptr(dq), *common],
        )
    if batch and kv_longest:
        fn = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_bwd_dkdv_{dtype}")
        _launch3(
            cuda_stream,
            fn,
            (-(-kv_longest // 32), batch, kv_heads),
            [
                _ptr(qb),
                _ptr(kb),
                _ptr(vb),
                _ptr(db),
                _ptr(lb),
                _ptr(dvec),
                _ptr(dk),
                _ptr(dv),
                *common,
            ],
        )
    if wait:
        cuda_stream.sync()
    else:
        _keep(cuda_stream, *bufs, dq, dk, dv, dvec, offs_buf)
    return like(q, dq), like(q, dk), like(q, dv)


def _launch3(stream: Any, fn: Any, grid: tuple[int, int, int], args: list[Any]) -> None:
    from cuda.core import LaunchConfig, launch

    launch(stream, LaunchConfig(grid=grid, block=THREADS), fn, *args)
