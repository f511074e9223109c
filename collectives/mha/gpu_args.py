"""The GPU attention's arguments: the inputs as GPU Buffers the kernels take (one device, one
dtype, a head_dim they support) and the layout of the work (the tile summary, the row counts
and the LSE's shape), checked before anything is allocated or launched."""

from __future__ import annotations

import itertools
from typing import Any

from shmem import Buffer
from shmem.dtypes import dtype_name
from shmem.errors import AttentionArgumentError

from ..interop import as_gpu_buffer
from .scheduler import MaskSpec, MHATileSummary

__all__ = [
    "BLOCK_M",
    "GPU_DTYPES",
    "MAX_HEAD_DIM",
    "backward_inputs",
    "backward_layout",
    "forward_inputs",
    "forward_layout",
]

BLOCK_M = 64  # the kernel's BM: query rows per work item
MAX_HEAD_DIM = 128
GPU_DTYPES = ("bfloat16", "float16", "float32")


def forward_inputs(q: Any, k: Any, v: Any, where: str) -> tuple[Buffer, Buffer, Buffer]:
    """q, k, v as GPU Buffers of one device and one dtype, with a head_dim the kernels take."""
    qb, kb, vb = (
        as_gpu_buffer(a, n, where, error=AttentionArgumentError)
        for a, n in ((q, "q"), (k, "k"), (v, "v"))
    )
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
    return qb, kb, vb


def forward_layout(
    qb: Buffer, kb: Buffer, offsets: list[int] | None, mask: MaskSpec
) -> tuple[MHATileSummary, tuple[int, int, int, int], tuple[int, ...]]:
    """The tile summary, ``(seq, heads, kv_heads, kv_seq)`` (ragged: seq and kv_seq 0) and
    the LSE's shape."""
    if offsets is not None:
        tokens, heads, kv_heads = qb.shape[0], qb.shape[1], kb.shape[1]
        summary = MHATileSummary.create(
            num_heads=heads, block_m=BLOCK_M, block_n=BLOCK_M, row_offsets=offsets, mask=mask
        )
        return summary, (0, heads, kv_heads, 0), (tokens, heads)
    batch, seq, heads = qb.shape[0], qb.shape[1], qb.shape[2]
    summary = MHATileSummary.create(
        num_heads=heads, block_m=BLOCK_M, block_n=BLOCK_M, seq_len=seq, batch_size=batch, mask=mask
    )
    return summary, (seq, heads, kb.shape[2], kb.shape[1]), (batch, seq, heads)


def backward_inputs(operands: tuple[Any, ...], where: str) -> list[Buffer]:
    """q, k, v, out, lse, dout as GPU Buffers: one dtype the kernels take (lse float32) and
    a head_dim up to the largest."""
    names = ("q", "k", "v", "out", "lse", "dout")
    bufs = [
        # the LSE is read with scalar loads: a row slice of it need not be 16-byte aligned
        as_gpu_buffer(a, n, where, 4 if n == "lse" else 16, error=AttentionArgumentError)
        for a, n in zip(operands, names, strict=True)
    ]
    qb, kb, vb, ob, lb, db = bufs
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
    return bufs


def backward_layout(
    qb: Buffer, kb: Buffer, offsets: list[int] | None, where: str
) -> tuple[int, int, int, int, int, int, int, int]:
    """``(rows, heads, kv_heads, batch, seq, kv_seq, longest, kv_longest)`` of the inputs
    (ragged: seq and kv_seq 0, the longest sequence's rows for both longest values)."""
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
    return rows, heads, kv_heads, batch, seq, kv_seq, longest, kv_longest
