"""Attention against a float64 naive reference: softmax(Q K^T * scale + mask) V, and the LSE.

Tolerances: float32 inputs within 1e-5 relative (plus 1e-6 absolute), float16 within 2e-3 and
bfloat16 within 1e-2 relative to the reference computed from the same rounded inputs.
"""

from __future__ import annotations

import itertools
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from collectives.mha import attention

TOL = {"float32": (1e-5, 1e-6), "float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2)}


def naive(q: Any, k: Any, v: Any, causal: bool, window: Any, scale: float) -> tuple[Any, Any]:
    """One sequence: q [S, H, D], k/v [S, Hk, D] -> (O [S, H, D], LSE [S, H]) in float64."""
    s_len, heads, _ = q.shape
    group = heads // k.shape[1]
    i = np.arange(s_len)[:, None]
    j = np.arange(s_len)[None, :]
    visible = np.ones((s_len, s_len), bool)
    if causal:
        visible &= j <= i
    if window is not None:
        left, right = window if isinstance(window, tuple) else (window, window)
        if left is not None:
            visible &= j >= i - left
        if right is not None:
            visible &= j <= i + right
    out = np.zeros((s_len, heads, v.shape[2]))
    lse = np.full((s_len, heads), -np.inf)
    for h in range(heads):
        s = q[:, h].astype(np.float64) @ k[:, h // group].astype(np.float64).T * scale
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        ok = np.isfinite(m[:, 0])
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        denom = p.sum(axis=1, keepdims=True)
        out[ok, h] = (p[ok] / denom[ok]) @ v[:, h // group].astype(np.float64)
        lse[ok, h] = m[ok, 0] + np.log(denom[ok, 0])
    return out, lse


def inputs(b: int, s: int, h: int, hk: int, d: int, dtype: str, seed: int = 0) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    dt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    q = rng.standard_normal((b, s, h, d)).astype(dt)
    k = rng.standard_normal((b, s, hk, d)).astype(dt)
    v = rng.standard_normal((b, s, hk, d)).astype(dt)
    return q, k, v


def check(o: Any, lse: Any, ref_o: Any, ref_lse: Any, dtype: str) -> None:
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(o.astype(np.float64), ref_o, rtol=rtol, atol=atol)
    finite = np.isfinite(ref_lse)
    assert (np.isfinite(lse) == finite).all()
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-5, atol=1e-5)


MASKS = [
    ("none", False, None),
    ("causal", True, None),
    ("window", False, (5, 3)),
    ("causal-window", True, (16, None)),
    ("left-only", False, (None, 0)),
]


@pytest.mark.parametrize("length", [1, 7, 129, 1000])
@pytest.mark.parametrize(("mask_name", "causal", "window"), MASKS, ids=[m[0] for m in MASKS])
def test_masks_and_odd_lengths(length: int, mask_name: str, causal: bool, window: Any) -> None:
    q, k, v = inputs(2, length, 4, 2, 64, "float32", seed=length)
    o, lse = attention(
        q, k, v, causal=causal, window=window, block_m=48, block_n=40, return_lse=True, workers=3
    )
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, length, 4)
    for b in range(2):
        ref_o, ref_lse = naive(q[b], k[b], v[b], causal, window, 1 / np.sqrt(64))
        check(o[b], lse[b], ref_o, ref_lse, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_dtypes_gqa_head_dims(dtype: str, heads: tuple[int, int], head_dim: int) -> None:
    q, k, v = inputs(1, 200, heads[0], heads[1], head_dim, dtype)
    o, lse = attention(q, k, v, causal=True, return_lse=True, block_m=64, block_n=64)
    assert o.dtype == q.dtype
    ref_o, ref_lse = naive(q[0], k[0], v[0], True, None, 1 / np.sqrt(head_dim))
    check(o[0], lse[0], ref_o, ref_lse, dtype)


@pytest.mark.parametrize("scheduler", ["queued", "static", "transient"])
@pytest.mark.parametrize("schedule", ["default", "prompt_rotate", "lpt"])
def test_ragged_document_causal(scheduler: str, schedule: str) -> None:
    lengths = [1, 130, 7, 0, 64, 333]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    total = offsets[-1]
    rng = np.random.default_rng(3)
    q = rng.standard_normal((total, 6, 32)).astype(np.float32)
    k = rng.standard_normal((total, 3, 32)).astype(np.float32)
    v = rng.standard_normal((total, 3, 32)).astype(np.float32)
    o, lse = attention(
        q,
        k,
        v,
        causal=True,
        valid_length=offsets,
        scheduler=scheduler,
        schedule=schedule,
        block_m=32,
        block_n=24,
        return_lse=True,
        scale=0.3,
    )
    for a, b in itertools.pairwise(offsets):
        if b == a:
            continue
        ref_o, ref_lse = naive(q[a:b], k[a:b], v[a:b], True, None, 0.3)
        check(o[a:b], lse[a:b], ref_o, ref_lse, "float32")


def test_argument_errors() -> None:
    q, k, v = inputs(1, 8, 4, 3, 16, "float32")
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads"):
        attention(q, k, v)
    q, k, v = inputs(1, 8, 4, 2, 16, "float32")
    with pytest.raises(ValueError, match="rank 3"):
        attention(q[0], k, v)
    with pytest.raises(ValueError, match="unsupported dtype"):
        attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match="invalid window"):
        attention(q, k, v, window=(-1, 2))
    with pytest.raises(ValueError, match="unknown scheduler"):
        attention(q, k, v, scheduler="random")
    with pytest.raises(ValueError, match="valid_length does not match"):
        attention(q[0], k[0], v[0], valid_length=[0, 5])
    with pytest.raises(ValueError, match="head_dim of q and k differ"):
        attention(q, k[..., :8], v)
