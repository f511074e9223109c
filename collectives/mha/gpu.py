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

import importlib
import itertools
import math
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from shmem import Buffer, DeviceContext
from shmem import cuda as shmem_cuda
from shmem.dtypes import dtype_name
from shmem.errors import ArgumentError, AttentionArgumentError

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
    "is_gpu_array",
    "kernel_name",
    "work_order",
    "worker_items",
]

KERNELS = "collectives/kernels/attention.cu"
BLOCK_M = 64  # the kernel's BM: query rows per work item
THREADS = 128
MAX_HEAD_DIM = 128
TENSOR_CORE_DIMS = (64, 80, 96, 128)
GPU_DTYPES = ("bfloat16", "float16", "float32")
MODES = {"transient": 0, "static": 1, "queued": 2}
CTAS_PER_SM = 2  # up to 226 registers x 128 threads: two CTAs fit an SM (nvcc --resource-usage)

_lock = threading.Lock()
_contexts: dict[int, DeviceContext] = {}
_pending: list[tuple[Any, tuple[object, ...]]] = []  # (event, buffers) of unwaited launches
_orders: OrderedDict[tuple[object, ...], Buffer] = OrderedDict()
_ORDERS_MAX = 32


def is_gpu_array(x: Any) -> bool:
    """Whether ``x`` lives on a CUDA device (a GPU Buffer, a DLPack producer on kDLCUDA, or an
    object with ``__cuda_array_interface__``); numpy arrays and host Buffers are not."""
    if isinstance(x, np.ndarray):
        return False
    if isinstance(x, Buffer):
        return not x.is_host
    device = getattr(x, "__dlpack_device__", None)
    if device is not None:
        try:
            return int(device()[0]) == 2  # kDLCUDA
        except Exception:
            return False
    return hasattr(x, "__cuda_array_interface__")


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


def _device_buffer(x: Any, name: str, where: str, align: int = 16) -> Buffer:
    """``x`` as a contiguous GPU Buffer (zero-copy when it already is one), starting on an
    ``align``-byte boundary (16: the kernels' vector loads of rows; 4: scalar loads)."""
    buf = x if isinstance(x, Buffer) else None
    if buf is None:
        try:
            buf = Buffer.from_dlpack(x)
        except Exception as exc:
            raise AttentionArgumentError(
                f"{where}: {name} must be a GPU array (torch, cupy, DLPack or a GPU Buffer; got "
                f"{type(x).__name__}: {exc})"
            ) from None
    if buf.is_host:
        raise AttentionArgumentError(
            f"{where}: {name} is on the host while another input is on a GPU (expected every "
            "input on the same GPU)"
        )
    if not buf.is_contiguous:
        buf = buf.contiguous()
    if buf.unsafe_ptr() % align:
        raise AttentionArgumentError(
            f"{where}: {name} is not {align}-byte aligned (got address {buf.unsafe_ptr():#x}; "
            f"expected a tensor that starts on a {align}-byte boundary, e.g. "
            ".contiguous().clone())"
        )
    return buf


def _like(template: Any, buf: Buffer) -> Any:
    """``buf`` as the kind of array ``template`` is (torch, cupy, or a Buffer)."""
    module = type(template).__module__.split(".")[0]
    if module in ("torch", "cupy"):
        return importlib.import_module(module).from_dlpack(buf)
    return buf


def _context(device_id: int) -> DeviceContext:
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
        return _context(device.id).stream, True
    return got, False


def _upload(host: np.ndarray[Any, Any], device: Any) -> Buffer:
    dev = Buffer(host.dtype, host.shape, device=device)
    dev.inplace_copy_from(Buffer.from_numpy(np.ascontiguousarray(host)))
    return dev


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
    buf = _upload(table, device)
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
    qb, kb, vb = (_device_buffer(a, n, where) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    device = qb.device
    for name, b in (("k", kb), ("v", vb)):
        if b.device != device:
            raise AttentionArgumentError(
                f"{where}: {name} is on {b.device.label}, q on {device.label} (expected one GPU)"
            )
    dtype = dtype_name(qb.dtype)
    if dtype not in GPU_DTYPES or dtype_name(kb.dtype) != dtype or dtype_name(vb.dtype) != dtype:
        raise AttentionArgumentError(
            f"{where}: on a GPU q, k and v must share one dtype of {list(GPU_DTYPES)} (got "
            f"{dtype}, {dtype_name(kb.dtype)}, {dtype_name(vb.dtype)})"
        )
    d = qb.shape[-1]
    if d > MAX_HEAD_DIM or d % 8 or vb.shape[-1] != d:
        raise AttentionArgumentError(
            f"{where}: on a GPU head_dim must be a multiple of 8 up to {MAX_HEAD_DIM}, the same "
            f"for q, k and v (got {d} and v's {vb.shape[-1]})"
        )
    ragged = offsets is not None
    if offsets is not None:
        tokens, heads = qb.shape[0], qb.shape[1]
        kv_heads = kb.shape[1]
        summary = MHATileSummary.create(
            num_heads=heads, block_m=BLOCK_M, block_n=BLOCK_M, row_offsets=offsets, mask=mask
        )
        batch, seq = len(offsets) - 1, 0
        lse_shape: tuple[int, ...] = (tokens, heads)
    else:
        batch, seq, heads = qb.shape[0], qb.shape[1], qb.shape[2]
        kv_heads, kv_seq = kb.shape[2], kb.shape[1]
        summary = MHATileSummary.create(
            num_heads=heads,
            block_m=BLOCK_M,
            block_n=BLOCK_M,
            seq_len=seq,
            batch_size=batch,
            mask=mask,
        )
        lse_shape = (batch, seq, heads)
    out = Buffer(qb.dtype, qb.shape, device=device)
    lse = Buffer("float32", lse_shape, device=device)
    if summary.num_items == 0:
        return (_like(q, out), _like(q, lse)) if return_lse else _like(q, out)
    sms = int(device.attributes.multiprocessor_count or 1)
    n_workers = workers or CTAS_PER_SM * sms
    order_buf, grid, mode = _order_buffer(device, summary, scheduler, schedule, n_workers)
    offs_buf = _upload(np.asarray(offsets, np.int64), device) if ragged else None
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
    return (_like(q, out), _like(q, lse)) if return_lse else _like(q, out)


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
    names = ("q", "k", "v", "out", "lse", "dout")
    bufs = [
        # the LSE is read with scalar loads: a row slice of it need not be 16-byte aligned
        _device_buffer(a, n, where, 4 if n == "lse" else 16)
        for a, n in zip((q, k, v, out, lse, dout), names, strict=True)
    ]
    qb, kb, vb, ob, lb, db = bufs
    device = qb.device
    dtype = dtype_name(qb.dtype)
    if (
        dtype not in GPU_DTYPES
        or any(dtype_name(b.dtype) != dtype for b in (kb, vb, ob, db))
        or dtype_name(lb.dtype) != "float32"
    ):
        raise AttentionArgumentError(
            f"{where}: q, k, v, out and dout must share one dtype of {list(GPU_DTYPES)} and lse "
            f"be float32 (got {[dtype_name(b.dtype) for b in bufs]})"
        )
    d = qb.shape[-1]
    if d > MAX_HEAD_DIM:
        raise AttentionArgumentError(
            f"{where}: on a GPU head_dim must be at most {MAX_HEAD_DIM} (got {d})"
        )
    ragged = offsets is not None
    if offsets is not None:
        rows, heads, kv_heads = qb.shape[0], qb.shape[1], kb.shape[1]
        batch, seq, kv_seq = len(offsets) - 1, 0, 0
        longest = kv_longest = max(b - a for a, b in itertools.pairwise(offsets))
    else:
        batch, seq, heads = qb.shape[0], qb.shape[1], qb.shape[2]
        kv_heads, rows, longest = kb.shape[2], batch * seq, seq
        kv_seq = kv_longest = kb.shape[1]
    if batch > 65535 or heads > 65535:
        raise AttentionArgumentError(
            f"{where}: on a GPU batch and heads must be at most 65535 (grid y and z; got "
            f"{batch} and {heads})"
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
    offs_buf = _upload(np.asarray(offsets, np.int64), device) if ragged else None
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
    return _like(q, dq), _like(q, dk), _like(q, dv)


def _launch3(stream: Any, fn: Any, grid: tuple[int, int, int], args: list[Any]) -> None:
    from cuda.core import LaunchConfig, launch

    launch(stream, LaunchConfig(grid=grid, block=THREADS), fn, *args)
