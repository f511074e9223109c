"""Sequence-parallel attention (forward, ring and zigzag) against a float64 single-process
reference on the full sequence: every mask, GQA, head_dim 64, lengths not divisible by P."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import collectives
from collectives.mha import sequence_parallel_attention, zigzag_shard, zigzag_unshard
from collectives.schedule import shard_bounds
from shmem import World

pytestmark = pytest.mark.mpi

DOCS = np.array([0, 50, 51, 120, 203])
MASKS = [
    ("none", False, None, None),
    ("causal", True, None, None),
    ("window", False, (7, 3), None),
    ("doc-causal", True, None, DOCS),
]


def visible_mask(s_len: int, causal: bool, window: Any, docs: Any) -> Any:
    i, j = np.arange(s_len)[:, None], np.arange(s_len)[None, :]
    visible = np.ones((s_len, s_len), bool)
    if causal:
        visible &= j <= i
    if window is not None:
        visible &= (j >= i - window[0]) & (j <= i + window[1])
    if docs is not None:
        d = np.searchsorted(docs, np.arange(s_len), side="right") - 1
        visible &= d[:, None] == d[None, :]
    return visible


def naive(
    q: Any, k: Any, v: Any, causal: bool, window: Any, docs: Any, scale: float, dout: Any = None
) -> Any:
    """float64 attention on the full sequence; with ``dout`` also (dQ, dK, dV)."""
    s_len, heads, dim = q.shape
    group = heads // k.shape[1]
    visible = visible_mask(s_len, causal, window, docs)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    out = np.zeros((s_len, heads, dim))
    dq, dk, dv = np.zeros(q64.shape), np.zeros(k64.shape), np.zeros(v64.shape)
    for h in range(heads):
        kh = h // group
        s = q64[:, h] @ k64[:, kh].T * scale
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        den = e.sum(axis=1, keepdims=True)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        out[:, h] = p @ v64[:, kh]
        if dout is not None:
            do = dout[:, h].astype(np.float64)
            dp = do @ v64[:, kh].T
            ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
            dq[:, h] = ds @ k64[:, kh] * scale
            dk[:, kh] += ds.T @ q64[:, h] * scale
            dv[:, kh] += p.T @ do
    return out if dout is None else (out, dq, dk, dv)


@pytest.fixture
def comm(world: World) -> Any:
    c = collectives.Communicator(world)
    yield c
    c.close()


@pytest.mark.parametrize("schedule", ["ring", "zigzag"])
@pytest.mark.parametrize(("name", "causal", "window", "docs"), MASKS, ids=[m[0] for m in MASKS])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 32), (2, 2, 64)])
def test_forward_matches_the_full_sequence(
    world: World,
    comm: Any,
    schedule: str,
    name: str,
    causal: bool,
    window: Any,
    docs: Any,
    heads: int,
    kv_heads: int,
    dim: int,
) -> None:
    total, p, r = 203, world.world_size, world.rank  # 203: not divisible by 2, 3 or 4
    rng = np.random.default_rng(0)  # the same full sequence on every rank, for the reference
    q_all = rng.standard_normal((total, heads, dim)).astype(np.float32)
    k_all = rng.standard_normal((total, kv_heads, dim)).astype(np.float32)
    v_all = rng.standard_normal((total, kv_heads, dim)).astype(np.float32)
    if schedule == "ring":
        a, b = shard_bounds(total, p)[r]
        q, k, v = q_all[a:b], k_all[a:b], v_all[a:b]
    else:
        q, k, v = (zigzag_shard(x, r, p) for x in (q_all, k_all, v_all))
    out, lse = sequence_parallel_attention(
        comm,
        q,
        k,
        v,
        causal=causal,
        window=window,
        valid_length=docs,
        schedule=schedule,
        block_m=32,
        block_n=24,
        return_lse=True,
    )
    ref = naive(q_all, k_all, v_all, causal, window, docs, 1 / np.sqrt(dim))
    mine = ref[a:b] if schedule == "ring" else zigzag_shard(ref, r, p)
    np.testing.assert_allclose(out, mine, rtol=1e-5, atol=2e-5)
    assert lse.shape == (q.shape[0], heads) and np.isfinite(lse).all()
    if schedule == "zigzag":  # unsharding every rank's output gives the full result
        full = zigzag_unshard(world.comm.allgather(out), total)
        np.testing.assert_allclose(full, ref, rtol=1e-5, atol=2e-5)


def test_errors(world: World, comm: Any) -> None:
    x = np.zeros((4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="'dynamic' is not implemented yet"):
        sequence_parallel_attention(comm, x, x, x, schedule="dynamic")
    with pytest.raises(ValueError, match="shapes do not match"):
        sequence_parallel_attention(comm, x, x[:3], x)
    with pytest.raises(ValueError, match="must be"):
        sequence_parallel_attention(comm, x[0], x, x)
