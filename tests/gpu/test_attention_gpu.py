"""Attention on one GPU (collectives/mha/gpu.py, collectives/kernels/attention.cu): the
forward against the host kernel and float64, every scheduler and order, the kernel's tile
sequence against the host scheduler's, the backward against the host's; torch SDPA as the
peer where torch has CUDA. Skipped without a GPU (./dev gpu runs it)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from collectives.mha import (
    MaskSpec,
    MHASchedule,
    MHATileSummary,
    TileScheduler,
    TransientScheduler,
    attention,
    attention_backward,
)
from collectives.mha.gpu import (
    attention_backward_gpu,
    attention_gpu,
    work_order,
    worker_items,
)
from collectives.mha.gpu_args import BLOCK_M
from shmem import Accelerator, Buffer
from shmem.dtypes import as_dtype
from tests.attention_reference import chunk_reference, visible

pytestmark = pytest.mark.gpu

# tolerances against float64 (max abs error, inputs ~N(0, 1), outputs O(1))
ATOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 2e-5}


def to_gpu(a: np.ndarray[Any, Any]) -> Buffer:
    buf = Buffer(a.dtype, a.shape, device=Accelerator(0))
    buf.inplace_copy_from(Buffer.from_numpy(np.ascontiguousarray(a)))
    return buf


def reference(q: Any, k: Any, v: Any, mask: MaskSpec, docs: list[int]) -> tuple[Any, Any]:
    """float64 O and LSE of ragged [tokens, heads, d] inputs."""
    tokens, heads, d = q.shape
    group = heads // k.shape[1]
    o = np.zeros(q.shape)
    lse = np.full((tokens, heads), -np.inf)
    for a, b in itertools.pairwise(docs):
        vis = visible(np.arange(b - a), np.arange(b - a), mask)
        for h in range(heads):
            s = np.where(vis, q[a:b, h] @ k[a:b, h // group].T / np.sqrt(d), -np.inf)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - np.where(np.isfinite(m), m, 0))
            den = e.sum(axis=1, keepdims=True)
            o[a:b, h] = np.divide(e, den, out=np.zeros_like(e), where=den > 0) @ v[a:b, h // group]
            with np.errstate(divide="ignore"):
                lse[a:b, h] = (np.log(den) + np.where(np.isfinite(m), m, 0))[:, 0]
    return o, lse


def inputs(dtype: str, tokens: int, heads: int, kv: int, d: int, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    dt = as_dtype(dtype)
    return [rng.standard_normal((tokens, n, d)).astype(dt) for n in (heads, kv, kv)]


CASES = [
    # (dtype, d, mask, docs, heads, kv heads)
    ("bfloat16", 128, MaskSpec(), [0, 300], 4, 4),
    ("bfloat16", 128, MaskSpec(causal=True), [0, 257], 4, 1),
    ("bfloat16", 64, MaskSpec(causal=True), [0, 5, 140, 141, 333], 4, 2),
    ("float16", 64, MaskSpec(left=37, right=5), [0, 200], 2, 2),
    ("float16", 80, MaskSpec(causal=True, left=70), [0, 130, 260], 2, 1),
    ("bfloat16", 96, MaskSpec(), [0, 65], 3, 3),
    ("float32", 72, MaskSpec(causal=True), [0, 99, 180], 2, 2),
    ("float32", 128, MaskSpec(), [0, 64], 1, 1),
    ("bfloat16", 40, MaskSpec(causal=True), [0, 77], 2, 1),  # the general path in bf16
    ("bfloat16", 80, MaskSpec(causal=True), [0, 150], 2, 2),
    ("float16", 48, MaskSpec(), [0, 90], 2, 1),  # the general path in fp16
]


# the smoke tier (scripts/gpu_run.py): every head-dim path (128, 64, 80, 96, general) once
SMOKE_CASES = (0, 2, 4, 5, 6)
FORWARD = [
    pytest.param(*case, scheduler, marks=[pytest.mark.smoke] * (i in SMOKE_CASES and j == 0))
    for i, case in enumerate(CASES)
    for j, scheduler in enumerate(["queued", "static", "transient"])
]


@pytest.mark.parametrize(("dtype", "d", "mask", "docs", "heads", "kv", "scheduler"), FORWARD)
def test_forward_matches_float64_and_the_host(
    dtype: str, d: int, mask: MaskSpec, docs: list[int], heads: int, kv: int, scheduler: str
) -> None:
    q, k, v = inputs(dtype, docs[-1], heads, kv, d)
    window = None if mask.left is None and mask.right is None else (mask.left, mask.right)
    ragged = len(docs) > 2

    def lay(a: Any) -> Any:
        return a if ragged else a[None]

    extra: dict[str, Any] = {"valid_length": docs} if ragged else {}
    out, lse = attention(
        *(to_gpu(lay(a)) for a in (q, k, v)),
        causal=mask.causal,
        window=window,
        scheduler=scheduler,
        workers=7,
        return_lse=True,
        **extra,
    )
    got = out.to_numpy().reshape(q.shape).astype(np.float64)
    got_lse = lse.to_numpy().reshape(q.shape[:2])
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    want, want_lse = reference(f64[0], f64[1], f64[2], mask, docs)
    np.testing.assert_allclose(got, want, atol=ATOL[dtype], rtol=0)
    np.testing.assert_allclose(got_lse, want_lse, atol=ATOL[dtype] * 5, rtol=0)
    host = attention(*(lay(a) for a in (q, k, v)), causal=mask.causal, window=window, **extra)
    np.testing.assert_allclose(got, host.reshape(q.shape).astype(np.float64), atol=2 * ATOL[dtype])


def test_rows_that_see_no_key_give_zero_and_minus_infinity() -> None:
    q, k, v = inputs("bfloat16", 50, 1, 1, 64)
    out, lse = attention(
        *(to_gpu(a[None]) for a in (q, k, v)), window=(0, 0), causal=False, return_lse=True
    )
    # window (0, 0): every row sees exactly itself -> O = v
    np.testing.assert_allclose(
        out.to_numpy()[0].astype(np.float32), v.astype(np.float32), atol=1e-2
    )
    assert np.isfinite(lse.to_numpy()).all()


@pytest.mark.parametrize(
    ("dtype", "d", "rows", "keys", "heads", "kv_heads", "delta", "mask"),
    [
        ("bfloat16", 128, 70, 300, 8, 2, 230, MaskSpec(causal=True)),  # at a KV cache's end
        ("float16", 64, 64, 64, 2, 1, 64, MaskSpec(causal=True)),  # an earlier chunk: all
        ("bfloat16", 64, 130, 90, 2, 2, -60, MaskSpec(causal=True)),  # 60 rows see nothing
        ("float16", 96, 100, 200, 4, 4, 37, MaskSpec(causal=False, left=40, right=3)),
        ("float32", 40, 33, 77, 2, 2, -20, MaskSpec(causal=False, left=15, right=4)),
    ],
)
def test_a_unit_with_its_own_keys_and_a_position_offset(
    dtype: str, d: int, rows: int, keys: int, heads: int, kv_heads: int, delta: int, mask: Any
) -> None:
    """The sequence-parallel unit: a query chunk against another chunk's keys (kv_len !=
    seq_len, query row i at key position i + delta), forward and backward against float64."""
    dt = as_dtype(dtype)
    rng = np.random.default_rng(rows + keys)
    q = rng.standard_normal((2, rows, heads, d)).astype(dt)
    k, v = (rng.standard_normal((2, keys, kv_heads, d)).astype(dt) for _ in range(2))
    do = rng.standard_normal(q.shape).astype(dt)
    o, lse, *grads = chunk_reference(q, k, v, do, delta, mask)
    scale = 1.0 / np.sqrt(d)
    for scheduler in ("queued", "static"):
        got_o, got_lse = attention_gpu(
            to_gpu(q), to_gpu(k), to_gpu(v), mask=mask, offsets=None, scale=scale,
            scheduler=scheduler, schedule=MHASchedule.LPT, workers=None, return_lse=True,
            delta=delta,
        )  # fmt: skip
        np.testing.assert_allclose(got_o.to_numpy().astype(np.float64), o, atol=ATOL[dtype])
        gl = got_lse.to_numpy()
        assert np.array_equal(np.isinf(gl), np.isinf(lse))
        np.testing.assert_allclose(gl[np.isfinite(lse)], lse[np.isfinite(lse)], atol=1e-3)
    got = attention_backward_gpu(
        to_gpu(q), to_gpu(k), to_gpu(v), to_gpu(o.astype(dt)), to_gpu(lse.astype(np.float32)),
        to_gpu(do), mask=mask, offsets=None, scale=scale, delta=delta,
    )  # fmt: skip
    for g, want in zip(got, grads, strict=True):
        np.testing.assert_allclose(g.to_numpy().astype(np.float64), want, atol=4 * ATOL[dtype])


@pytest.mark.parametrize("schedule", list(MHASchedule))
@pytest.mark.parametrize("scheduler", ["static", "transient", "queued"])
def test_the_kernel_takes_the_host_schedulers_tiles(scheduler: str, schedule: Any) -> None:
    """The trace of every CTA: for transient and static schedulers the same items in the
    same order as the host loop (worker_items); for the queued one, CTA c starts on item c
    (or on its first claim where item c is invalid) and the CTAs together take every valid
    item exactly once (claim order is dynamic)."""
    docs = [0, 70, 400, 401, 600]
    mask = MaskSpec(causal=True)
    heads, d = 3, 64
    q, k, v = inputs("bfloat16", docs[-1], heads, heads, d)
    summary = MHATileSummary.create(
        num_heads=heads, block_m=BLOCK_M, block_n=BLOCK_M, row_offsets=docs, mask=mask
    )
    workers = 5
    _, grid, _ = work_order(summary, scheduler, schedule, workers)
    cap = summary.num_items + 1
    trace = Buffer.zeros((grid * cap,), "int32", device=Accelerator(0))
    attention_gpu(
        *(to_gpu(a) for a in (q, k, v)),
        mask=mask,
        offsets=docs,
        scale=1 / np.sqrt(d),
        scheduler=scheduler,
        schedule=MHASchedule(schedule),
        workers=workers,
        return_lse=False,
        trace=trace,
        trace_cap=cap,
    )
    rows = trace.to_numpy().reshape(grid, cap)
    taken = [[int(x) - 1 for x in row if x] for row in rows]
    if scheduler == "queued":
        sched: Any = TileScheduler(workers, schedule)  # for valid(): the same order
        valid = [i for i in range(summary.num_items) if sched.valid(summary, i)]
        assert sorted(i for t in taken for i in t if sched.valid(summary, i)) == valid
        # CTA c starts on item c, or, where item c is past its sequence's end, on the first
        # valid item it claims (the host's QueuedTileScheduler.initial_state; the fake's old
        # copy of the kernel recorded item c regardless, which hid this)
        for c, t in enumerate(taken):
            if t:
                assert t[0] == c if sched.valid(summary, c) else t[0] >= grid, (c, t)
        return
    sched = (
        TileScheduler(workers, schedule)
        if scheduler == "static"
        else TransientScheduler(heads, schedule)
    )
    assert taken == [worker_items(sched, summary, c) for c in range(grid)]


def test_queued_counter_resets_between_launches() -> None:
    """The last CTA resets the queue: many launches in a row all compute every tile."""
    q, k, v = inputs("float16", 500, 2, 2, 64, seed=3)
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    want, _ = reference(f64[0], f64[1], f64[2], MaskSpec(causal=True), [0, 500])
    dev = [to_gpu(a[None]) for a in (q, k, v)]
    for _ in range(20):
        out = attention(*dev, causal=True, scheduler="queued", workers=3)
        np.testing.assert_allclose(out.to_numpy()[0].astype(np.float64), want, atol=ATOL["float16"])


@pytest.mark.parametrize(
    ("dtype", "mask", "docs"),
    [
        pytest.param("float32", MaskSpec(causal=True), [0, 150], marks=pytest.mark.smoke),
        ("bfloat16", MaskSpec(causal=True), [0, 150]),
        ("float32", MaskSpec(left=20, right=4), [0, 33, 160, 161]),
        ("bfloat16", MaskSpec(left=20, right=4), [0, 33, 160, 161]),
    ],
)
def test_backward_matches_the_host(dtype: str, mask: MaskSpec, docs: list[int]) -> None:
    heads, kv, d = 4, 2, 64
    q, k, v = inputs(dtype, docs[-1], heads, kv, d, seed=5)
    do = np.random.default_rng(9).standard_normal(q.shape).astype(q.dtype)
    window = None if mask.left is None else (mask.left, mask.right)
    ragged = len(docs) > 2

    def lay(a: Any) -> Any:
        return a if ragged else a[None]

    extra: dict[str, Any] = {"valid_length": docs} if ragged else {}
    host_in = [lay(a).astype(np.float32) for a in (q, k, v, do)]
    o, lse = attention(*host_in[:3], causal=mask.causal, window=window, return_lse=True, **extra)
    hq, hk, hv, hdo = host_in
    want = attention_backward(hq, hk, hv, o, lse, hdo, causal=mask.causal, window=window, **extra)
    gq, gk, gv, gdo = (to_gpu(lay(a)) for a in (q, k, v, do))
    o_g, lse_g = attention(gq, gk, gv, causal=mask.causal, window=window, return_lse=True, **extra)
    got = attention_backward(
        gq, gk, gv, o_g, lse_g, gdo, causal=mask.causal, window=window, **extra
    )
    tol = 2e-4 if dtype == "float32" else 6e-2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.to_numpy().astype(np.float32), w, atol=tol, rtol=0)
    again = attention_backward(
        gq, gk, gv, o_g, lse_g, gdo, causal=mask.causal, window=window, **extra
    )
    for a, b in zip(got, again, strict=True):  # deterministic: bitwise the same
        assert a.to_numpy().tobytes() == b.to_numpy().tobytes()


@pytest.mark.smoke
def test_torch_tensors_in_torch_tensors_out_and_sdpa_agrees() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(2, 333, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(3)
    )
    out = attention(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    assert (out.float() - want.float()).abs().max().item() < 3e-2
