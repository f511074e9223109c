"""float64 attention references shared by the tiers (pure numpy): the mask of a set of
query and key positions, and a sequence-parallel unit's forward and backward (the fake-GPU
run in tests/fakegpu, the GPU tests in tests/gpu, the host backward's unit tests)."""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives.mha import MaskSpec

Array = np.ndarray[Any, Any]


def visible(rows: Any, cols: Any, mask: MaskSpec) -> Array:
    """``[len(rows), len(cols)]``: whether the query at position ``rows[a]`` sees the key at
    position ``cols[b]`` under ``mask`` (causal, window sides)."""
    i, j = np.asarray(rows)[:, None], np.asarray(cols)[None, :]
    vis = np.ones((i.size, j.size), bool)
    if mask.causal:
        vis &= j <= i
    if mask.left is not None:
        vis &= j >= i - mask.left
    if mask.right is not None:
        vis &= j <= i + mask.right
    return vis


def chunk_reference(
    q: Array, k: Array, v: Array, do: Array, delta: int, mask: MaskSpec
) -> tuple[Array, Array, Array, Array, Array]:
    """float64 ``(O, LSE, dQ, dK, dV)`` of padded ``q`` ``[b, n, h, d]`` against ``k``/``v``
    ``[b, m, hk, d]`` (GQA: query head ``h`` reads KV head ``h // (h / hk)``), query row
    ``i`` standing at key position ``i + delta``; ``do`` is dL/dO. Rows that see no key:
    O = 0, LSE = -inf, no gradient."""
    q, k, v, do = (a.astype(np.float64) for a in (q, k, v, do))
    scale = 1.0 / np.sqrt(q.shape[-1])
    group = q.shape[2] // k.shape[2]
    kh, vh = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    see = visible(np.arange(q.shape[1]) + delta, np.arange(k.shape[1]), mask)
    s = np.where(see, np.einsum("bihd,bjhd->bhij", q, kh) * scale, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(see, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = p.sum(-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    o = np.einsum("bhij,bjhd->bihd", p, vh)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, m[..., 0] + np.log(total[..., 0]), -np.inf)
    dv = np.einsum("bhij,bihd->bjhd", p, do)
    dp = np.einsum("bihd,bjhd->bhij", do, vh)
    ds = p * (dp - np.einsum("bihd,bihd->bhi", do, o)[..., None])
    dq = np.einsum("bhij,bjhd->bihd", ds, kh) * scale
    dk = np.einsum("bhij,bihd->bjhd", ds, q) * scale
    fold = (k.shape[0], k.shape[1], k.shape[2], group, k.shape[3])
    return o, np.moveaxis(lse, 1, 2), dq, dk.reshape(fold).sum(3), dv.reshape(fold).sum(3)
