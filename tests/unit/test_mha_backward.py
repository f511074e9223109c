"""The attention backward tile against float64 gradients (themselves checked by finite
differences), and the sequence-parallel unit plan: every visible (query, key) pair in exactly
one unit, queues that partition the units, slots that do not overlap."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from collectives.mha import MaskSpec, attention_tile, attention_tile_backward
from collectives.mha._units import UnitPlan, pieces, runs
from tests.attention_reference import visible

MASKS = [
    ("none", MaskSpec()),
    ("causal", MaskSpec(causal=True)),
    ("window", MaskSpec(left=5, right=2)),
    ("causal-window", MaskSpec(causal=True, left=9)),
]


def loss_and_grads(q: Any, k: Any, v: Any, do: Any, vis: Any, scale: float) -> tuple[Any, ...]:
    """float64: L = sum(O * dO) and its gradients, rows without a visible key give O = 0."""
    s = np.where(vis, q @ k.T * scale, -np.inf)
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    den = e.sum(axis=1, keepdims=True)
    p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    o = p @ v
    dp = do @ v.T
    ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
    return float((o * do).sum()), o, ds @ k * scale, ds.T @ q * scale, p.T @ do


def test_reference_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((6, 4)) for _ in range(4))
    vis = visible(np.arange(6), np.arange(6), MaskSpec(causal=True))
    _, _, dq, dk, dv = loss_and_grads(q, k, v, do, vis, 0.5)
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + 1e-6
            hi = loss_and_grads(q, k, v, do, vis, 0.5)[0]
            x[idx] = old - 1e-6
            lo = loss_and_grads(q, k, v, do, vis, 0.5)[0]
            x[idx] = old
            num[idx] = (hi - lo) / 2e-6
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("name", "mask"), MASKS, ids=[m[0] for m in MASKS])
@pytest.mark.parametrize(("q_offset", "kv"), [(0, (0, 40)), (17, (5, 33)), (30, (30, 40))])
def test_backward_tile_matches_float64(name: str, mask: MaskSpec, q_offset: int, kv: Any) -> None:
    rng = np.random.default_rng(2)
    rows, n_keys, d, k_offset = 11, 40, 16, 3
    q = rng.standard_normal((rows, d)).astype(np.float32)
    k = rng.standard_normal((n_keys, d)).astype(np.float32)  # key i at row i - k_offset
    v = rng.standard_normal((n_keys, d)).astype(np.float32)
    do = rng.standard_normal((rows, d)).astype(np.float32)
    kv_start, kv_end = kv[0] + k_offset, min(kv[1] + k_offset, n_keys + k_offset)
    scale = 0.3
    o, lse = attention_tile(
        q,
        k,
        v,
        q_offset=q_offset,
        kv_start=kv_start,
        kv_end=kv_end,
        block_n=7,
        scale=scale,
        mask=mask,
        k_offset=k_offset,
    )
    delta = (o * do).sum(axis=1)
    dq, dk, dv = attention_tile_backward(
        q,
        k,
        v,
        do,
        lse,
        delta,
        q_offset=q_offset,
        kv_start=kv_start,
        kv_end=kv_end,
        block_n=7,
        scale=scale,
        mask=mask,
        k_offset=k_offset,
    )
    cols = np.arange(kv_start, kv_end)
    vis = visible(np.arange(q_offset, q_offset + rows), cols, mask)
    sl = slice(kv_start - k_offset, kv_end - k_offset)
    _, o_ref, dq_ref, dk_ref, dv_ref = loss_and_grads(
        q.astype(np.float64), k[sl].astype(np.float64), v[sl].astype(np.float64), do, vis, scale
    )
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-5)
    assert dk.shape == dv.shape == (kv_end - kv_start, d)
    for got, ref in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    dead = ~vis.any(axis=1)  # rows with no visible key contribute nothing
    assert np.all(dq[dead] == 0)


def covered(plan: UnitPlan, mask: MaskSpec, docs: Any, total: int, block_m: int) -> Any:
    """How often each (query, key) pair is computed by the plan's units (one KV head)."""
    seen = np.zeros((total, total), np.int64)
    for u in (u for u in plan.units if u.head == 0):
        qc, kc = plan.chunks[u.q], plan.chunks[u.kv]
        kv_runs = runs(kc.pos)
        for lo in range(0, qc.rows, block_m):
            for qa, qb, qg, _, _, s0, s1 in pieces(
                qc.pos, lo, min(lo + block_m, qc.rows), kc.pos, kv_runs, mask, docs
            ):
                rows = np.arange(qg, qg + qb - qa)
                cols = np.arange(s0, s1)
                seen[np.ix_(rows, cols)] += visible(rows, cols, mask)
    return seen


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize(("name", "mask"), MASKS, ids=[m[0] for m in MASKS])
@pytest.mark.parametrize("docs", [None, np.array([0, 20, 21, 60, 97])], ids=["one", "docs"])
@pytest.mark.parametrize("kv_rows", ["same", None, 11], ids=["kv-same", "kv-shard", "kv-11"])
def test_plan_covers_every_visible_pair_once(
    size: int, layout: str, name: str, mask: MaskSpec, docs: Any, kv_rows: Any
) -> None:
    total, block_m = 97, 8
    if layout == "contiguous":
        edges = np.linspace(0, total, size + 1).astype(int)
        positions = [np.arange(a, b) for a, b in itertools.pairwise(edges)]
        chunk_rows: int | None = 7
    else:
        edges = np.linspace(0, total, 2 * size + 1).astype(int)
        positions = [
            np.concatenate(
                [np.arange(edges[r], edges[r + 1]), np.arange(edges[-r - 2], edges[-r - 1])]
            )
            for r in range(size)
        ]
        chunk_rows = None
    plan = UnitPlan(positions, chunk_rows, 2, mask, docs, block_m, "lpt", kv_rows)
    if kv_rows not in ("same", chunk_rows):  # key/value chunks of their own size
        kv_chunks = {u.kv for u in plan.units}
        assert not kv_chunks & {u.q for u in plan.units}
        step = max(p.size for p in positions) if kv_rows is None else kv_rows
        assert all(plan.chunks[i].rows <= step for i in kv_chunks)
    vis = visible(np.arange(total), np.arange(total), mask)
    if docs is not None:
        d = np.searchsorted(docs, np.arange(total), side="right") - 1
        vis &= d[:, None] == d[None, :]
    np.testing.assert_array_equal(covered(plan, mask, docs, total, block_m), vis.astype(int))
    # queues partition the units; each home's units are exactly its queue
    ids = sorted(u.id for queue in plan.queues for u in queue)
    assert ids == list(range(len(plan.units)))
    for r in range(size):
        assert {u.id for u in plan.queues[r]} == {u.id for u in plan.by_q_home[r]}
        costs = [u.cost for u in plan.queues[r]]
        assert costs == sorted(costs, reverse=True)  # longest first
    # slots of one home never overlap
    sizes = {u.id: plan.chunks[u.q].rows for u in plan.units}
    for offsets in plan.slots(plan.by_q_home, lambda u: sizes[u.id]):
        spans = sorted((off, off + sizes[i]) for i, off in offsets.items())
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_ring_order_is_by_step() -> None:
    positions = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    plan = UnitPlan(positions, None, 1, MaskSpec(), None, 4, "ring")
    for r in range(3):
        sources = [plan.chunks[u.kv].rank for u in plan.queues[r]]
        assert sources == [r, (r - 1) % 3, (r - 2) % 3]


def _reference(q: Any, k: Any, v: Any, do: Any, mask: MaskSpec, docs: Any) -> tuple[Any, ...]:
    """float64 per (sequence, head): O, LSE and the gradients of L = sum(O * dO)."""
    tokens, heads, d = q.shape
    group = heads // k.shape[1]
    o = np.zeros((tokens, heads, d))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for a, b in itertools.pairwise(docs):
        rows = np.arange(b - a)
        vis = visible(rows, rows, mask)
        for h in range(heads):
            hk = h // group
            _, o_h, gq, gk, gv = loss_and_grads(
                q[a:b, h], k[a:b, hk], v[a:b, hk], do[a:b, h], vis, 1 / np.sqrt(d)
            )
            o[a:b, h], dq[a:b, h] = o_h, gq
            dk[a:b, hk] += gk
            dv[a:b, hk] += gv
    return o, dq, dk, dv


@pytest.mark.parametrize(
    ("mask", "ragged"),
    [
        (MaskSpec(), False),
        (MaskSpec(causal=True), False),
        (MaskSpec(causal=True), True),
        (MaskSpec(left=5, right=3), True),
    ],
    ids=["none", "causal", "document-causal", "window-ragged"],
)
def test_attention_backward_matches_float64(mask: MaskSpec, ragged: bool) -> None:
    """collectives.mha.attention_backward (single process, host): dq, dk, dv of the forward
    against float64 gradients, GQA (4 query heads on 2 KV heads), odd sizes and tiles."""
    from collectives.mha import attention, attention_backward

    rng = np.random.default_rng(7)
    docs = [0, 13, 14, 50, 77] if ragged else [0, 37]
    tokens, heads, kv, d = docs[-1], 4, 2, 24
    q, k, v, do = (
        rng.standard_normal((tokens, n, d)).astype(np.float32) for n in (heads, kv, kv, heads)
    )
    window = None if mask.left is None else (mask.left, mask.right)
    if ragged:
        args: dict[str, Any] = {"valid_length": docs}
        qa, ka, va, da = q, k, v, do
    else:
        args = {}
        qa, ka, va, da = (a[None] for a in (q, k, v, do))
    out, lse = attention(
        qa,
        ka,
        va,
        causal=mask.causal,
        window=window,
        block_m=16,
        block_n=8,
        return_lse=True,
        **args,
    )
    dq, dk, dv = attention_backward(
        qa,
        ka,
        va,
        out,
        lse,
        da,
        causal=mask.causal,
        window=window,
        block_m=16,
        block_n=8,
        **args,
    )
    f64 = [a.astype(np.float64) for a in (q, k, v, do)]
    want_o, want_dq, want_dk, want_dv = _reference(f64[0], f64[1], f64[2], f64[3], mask, docs)

    def flat(a: Any) -> Any:
        return a if ragged else a[0]

    np.testing.assert_allclose(flat(out), want_o, atol=2e-5)
    for got, want in ((dq, want_dq), (dk, want_dk), (dv, want_dv)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(flat(got), want, atol=5e-5, rtol=1e-4)
