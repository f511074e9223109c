"""Sequence-parallel attention, forward and backward, against a float64 single-process
reference on the full sequence: every schedule and mask, GQA, head_dim 32/64/128, bfloat16,
lengths not divisible by P; ``dynamic`` determinism and a straggler whose work is taken."""

from __future__ import annotations

import gc
import time
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import collectives
from collectives.mha import (
    SequenceParallelStats,
    sequence_parallel_attention,
    sequence_parallel_attention_backward,
    simulate_straggler,
    zigzag_shard,
    zigzag_unshard,
)
from collectives.schedule import shard_bounds
from shmem import World
from shmem.errors import CollectiveMismatchError

pytestmark = pytest.mark.mpi

DOCS = np.array([0, 50, 51, 120, 203])
MASKS = [
    ("none", False, None, None),
    ("causal", True, None, None),
    ("window", False, (7, 3), None),
    ("doc-causal", True, None, DOCS),
    ("docs", False, None, DOCS),
]
SCHEDULES = ["dynamic", "ring", "zigzag"]
TOTAL = 203  # not divisible by 2, 3 or 4
FORWARD_SHAPES = [(4, 2, 32), (2, 2, 64), (2, 1, 128)]  # (heads, kv_heads, dim)
BACKWARD_SHAPES = [(4, 2, 32), (2, 1, 64)]


def every_pair(shapes: list[tuple[int, int, int]]) -> list[Any]:
    """Each mask with each schedule once, the shape turning with both (a Latin square: every
    mask meets every shape, and every schedule every shape), so the tier runs each pair of
    options without the whole product (15 cases instead of 45 at every size and layout; the
    tile and unit choices themselves are the unit tier's, tests/unit/test_mha_*)."""
    cases = []
    for i, mask in enumerate(MASKS):
        for j, schedule in enumerate(SCHEDULES):
            shape = shapes[(i + j) % len(shapes)]
            name = "-".join(map(str, (*shape, mask[0], schedule)))
            cases.append(pytest.param(schedule, *mask, *shape, id=name))
    return cases


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


def full_inputs(heads: int, kv_heads: int, dim: int, seed: int = 0, total: int = TOTAL) -> Any:
    """The same full sequence on every rank (for the reference): q, k, v, dO."""
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((total, heads, dim)).astype(np.float32),
        rng.standard_normal((total, kv_heads, dim)).astype(np.float32),
        rng.standard_normal((total, kv_heads, dim)).astype(np.float32),
        rng.standard_normal((total, heads, dim)).astype(np.float32),
    )


def sharder(world: World, schedule: str, total: int = TOTAL) -> Any:
    p, r = world.world_size, world.rank
    if schedule == "zigzag":
        return lambda x: zigzag_shard(x, r, p)
    a, b = shard_bounds(total, p)[r]
    return lambda x: x[a:b]


@pytest.mark.parametrize(
    ("schedule", "name", "causal", "window", "docs", "heads", "kv_heads", "dim"),
    every_pair(FORWARD_SHAPES),
)
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
    q_all, k_all, v_all, _ = full_inputs(heads, kv_heads, dim)
    shard = sharder(world, schedule)
    out, lse = sequence_parallel_attention(
        comm,
        shard(q_all),
        shard(k_all),
        shard(v_all),
        causal=causal,
        window=window,
        valid_length=docs,
        schedule=schedule,
        block_m=32,
        block_n=24,
        unit_rows=29,
        return_lse=True,
    )
    ref = naive(q_all, k_all, v_all, causal, window, docs, 1 / np.sqrt(dim))
    np.testing.assert_allclose(out, shard(ref), rtol=1e-5, atol=2e-5)
    assert lse.shape == out.shape[:2] and np.isfinite(lse).all()
    if schedule == "zigzag":  # unsharding every rank's output gives the full result
        full = zigzag_unshard(world.comm.allgather(out), TOTAL)
        np.testing.assert_allclose(full, ref, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(
    ("schedule", "name", "causal", "window", "docs", "heads", "kv_heads", "dim"),
    every_pair(BACKWARD_SHAPES),
)
def test_backward_matches_the_float64_gradient(
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
    q_all, k_all, v_all, do_all = full_inputs(heads, kv_heads, dim, seed=1)
    _, dq_ref, dk_ref, dv_ref = naive(
        q_all, k_all, v_all, causal, window, docs, 1 / np.sqrt(dim), dout=do_all
    )
    shard = sharder(world, schedule)
    q, k, v, do = (shard(x) for x in (q_all, k_all, v_all, do_all))
    kw: dict[str, Any] = dict(
        causal=causal, window=window, valid_length=docs, schedule=schedule, block_m=32, block_n=24
    )
    out, lse = sequence_parallel_attention(comm, q, k, v, return_lse=True, **kw)
    dq, dk, dv = sequence_parallel_attention_backward(comm, do, q, k, v, out, lse, **kw)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    for got, want, what in ((dq, dq_ref, "dQ"), (dk, dk_ref, "dK"), (dv, dv_ref, "dV")):
        np.testing.assert_allclose(got, shard(want), rtol=1e-4, atol=1e-4, err_msg=what)


@pytest.mark.parametrize("schedule", ["dynamic", "ring"])
def test_bfloat16_head_dim_128(world: World, comm: Any, schedule: str) -> None:
    q_all, k_all, v_all, do_all = (
        x.astype(ml_dtypes.bfloat16) for x in full_inputs(4, 2, 128, seed=2)
    )
    ref, dq_ref, dk_ref, dv_ref = naive(
        q_all, k_all, v_all, True, None, None, 1 / np.sqrt(128), dout=do_all
    )
    shard = sharder(world, schedule)
    q, k, v, do = (shard(x) for x in (q_all, k_all, v_all, do_all))
    out, lse = sequence_parallel_attention(
        comm, q, k, v, causal=True, schedule=schedule, block_m=32, return_lse=True
    )
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(out.astype(np.float32), shard(ref), rtol=2e-2, atol=2e-2)
    grads = sequence_parallel_attention_backward(
        comm, do, q, k, v, out, lse, causal=True, schedule=schedule, block_m=32
    )
    for got, want in zip(grads, (dq_ref, dk_ref, dv_ref), strict=True):
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(got.astype(np.float32), shard(want), rtol=5e-2, atol=5e-2)


def test_ragged_batch(world: World, comm: Any) -> None:
    """A skewed packed batch: one long document and many short ones, document-causal."""
    total = 311
    docs = np.array([0, 3, 4, 9, 30, 31, 40, 250, 260, 311])
    q_all, k_all, v_all, do_all = full_inputs(2, 1, 32, seed=3, total=total)
    ref, dq_ref, dk_ref, dv_ref = naive(
        q_all, k_all, v_all, True, None, docs, 1 / np.sqrt(32), dout=do_all
    )
    shard = sharder(world, "dynamic", total)
    q, k, v, do = (shard(x) for x in (q_all, k_all, v_all, do_all))
    kw: dict[str, Any] = dict(causal=True, valid_length=docs, block_m=16, unit_rows=20)
    out, lse = sequence_parallel_attention(comm, q, k, v, return_lse=True, **kw)
    np.testing.assert_allclose(out, shard(ref), rtol=1e-5, atol=2e-5)
    grads = sequence_parallel_attention_backward(comm, do, q, k, v, out, lse, **kw)
    for got, want in zip(grads, (dq_ref, dk_ref, dv_ref), strict=True):
        np.testing.assert_allclose(got, shard(want), rtol=1e-4, atol=1e-4)


def dynamic_run(world: World, comm: Any, slowdown: float = 1.0, slow_rank: int = -1) -> Any:
    """Forward and backward with ``dynamic`` over many small units (causal: uneven)."""
    total = 384
    q_all, k_all, v_all, do_all = full_inputs(4, 2, 32, seed=4, total=total)
    shard = sharder(world, "dynamic", total)
    q, k, v, do = (shard(x) for x in (q_all, k_all, v_all, do_all))
    kw: dict[str, Any] = dict(causal=True, block_m=16, unit_rows=16)
    mine = slowdown if world.rank == slow_rank else 1.0
    fwd, bwd = SequenceParallelStats(), SequenceParallelStats()
    with simulate_straggler(mine):
        out, lse = sequence_parallel_attention(comm, q, k, v, return_lse=True, stats=fwd, **kw)
        grads = sequence_parallel_attention_backward(comm, do, q, k, v, out, lse, stats=bwd, **kw)
    return (out, lse, *grads), (fwd, bwd)


def test_dynamic_is_bitwise_deterministic(world: World, comm: Any) -> None:
    first, _ = dynamic_run(world, comm)
    for _ in range(4):
        again, _ = dynamic_run(world, comm)
        for a, b in zip(first, again, strict=True):
            assert a.tobytes() == b.tobytes()


def test_straggler_work_is_taken_and_the_result_is_unchanged(world: World, comm: Any) -> None:
    if world.world_size == 1:
        pytest.skip("needs a second rank to take work")
    baseline, _ = dynamic_run(world, comm)
    slow = world.world_size - 1  # causal: the last rank also owns the most work
    results, (fwd, bwd) = dynamic_run(world, comm, slowdown=40.0, slow_rank=slow)
    for a, b in zip(baseline, results, strict=True):  # other ranks computed its units
        assert a.tobytes() == b.tobytes()
    for st in (fwd, bwd):
        # the work moved: without taking work the slow rank would compute its whole queue
        # (the largest: causal, last shard); slowed 40x it computes well under half of it
        done = world.comm.allgather(st.units_computed)
        own = world.comm.allgather(st.units)
        assert done[slow] * 2 < own[slow], (done, own)
        given = world.comm.allgather(st.units_given)
        taken = world.comm.allgather(st.units_taken)
        computed = world.comm.allgather(st.units_computed)
        units = world.comm.allgather(st.units)
        assert sum(computed) == sum(units)  # every unit computed exactly once
        assert sum(taken) == sum(given)
        assert given[slow] > 0, (given, taken)  # the others took the slow rank's work
        assert len(st.busy_per_rank) == world.world_size and st.imbalance >= 1.0
        # a rank may compute nothing (the slow one, when the others drained its queue
        # before it took a unit: faster queue atomics made that common at 4 ranks on 2 cores)
        assert st.wall_s >= st.busy_s >= 0 and st.idle_s >= 0 and sum(st.busy_per_rank) > 0


def test_stats_for_every_schedule(world: World, comm: Any) -> None:
    q_all, k_all, v_all, _ = full_inputs(2, 2, 16)
    for schedule in SCHEDULES:
        shard = sharder(world, schedule)
        st = SequenceParallelStats()
        sequence_parallel_attention(
            comm,
            *(shard(x) for x in (q_all, k_all, v_all)),
            causal=True,
            schedule=schedule,
            stats=st,
            block_m=32,
        )
        assert st.schedule == schedule and st.threads >= 1
        assert st.wall_s >= st.busy_s >= 0
        done = world.comm.allgather((st.units, st.units_computed, st.busy_s))
        # every unit is computed once; with "dynamic" a rank that starts late on an
        # oversubscribed machine may find its whole queue taken, so count across ranks
        assert sum(c for _, c, _ in done) == sum(u for u, _, _ in done) >= 1
        assert sum(b for _, _, b in done) > 0
        if schedule != "dynamic":
            assert st.units_taken == st.units_given == 0
            assert st.units_computed >= 1 and st.busy_s > 0


def test_errors(world: World, comm: Any) -> None:
    x = np.zeros((4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="unknown schedule"):
        sequence_parallel_attention(comm, x, x, x, schedule="fastest")
    with pytest.raises(ValueError, match="shapes do not match"):
        sequence_parallel_attention(comm, x, x[:3], x)
    with pytest.raises(ValueError, match="must be a numpy array"):
        sequence_parallel_attention(comm, x[0], x, x)
    with pytest.raises(ValueError, match="unsupported dtype"):
        sequence_parallel_attention(comm, x.astype(np.int32), x, x)
    with pytest.raises(ValueError, match="invalid unit_rows"):
        sequence_parallel_attention(comm, x, x, x, unit_rows=0)
    with pytest.raises(ValueError, match="invalid valid_length"):
        sequence_parallel_attention(comm, x, x, x, valid_length=[0, 2])
    if world.world_size > 1:  # a local error of any kind reaches the all-gather
        bad_docs = [0, float("inf")] if world.rank == 0 else [0, 4]
        with pytest.raises((OverflowError, CollectiveMismatchError), match=r"infinity|rank 0"):
            sequence_parallel_attention(comm, x, x, x, valid_length=bad_docs)
    with pytest.raises(ValueError, match="lse must be floating point"):
        sequence_parallel_attention_backward(comm, x, x, x, x, x, np.zeros((4, 2), np.int32))
    with pytest.raises(ValueError, match="stats must be"):
        sequence_parallel_attention(comm, x, x, x, stats={})  # type: ignore[call-overload]
    lse = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="lse has the wrong shape"):
        sequence_parallel_attention_backward(comm, x, x, x, x, x, lse[:, :1])
    with pytest.raises(ValueError, match="dout has the wrong shape"):
        sequence_parallel_attention_backward(comm, x[:, :1], x, x, x, x, lse)
    if world.world_size > 1:  # one rank's bad argument fails every rank, none hangs
        bad = x.astype(np.int32) if world.rank == 0 else x
        with pytest.raises(
            (ValueError, CollectiveMismatchError),
            match=r"unsupported dtype|invalid arguments on other ranks: rank 0",
        ):
            sequence_parallel_attention(comm, bad, x, x)
        with pytest.raises(CollectiveMismatchError, match="ranks called different") as err:
            sequence_parallel_attention(comm, x, x, x, causal=world.rank == 0)
        texts = [line.text for line in err.value.calls]
        assert len(texts) == world.world_size and "causal=True" in texts[0]
        assert all("causal=False" in t for t in texts[1:])
    # the communicator and the heap are still usable
    out = sequence_parallel_attention(comm, x + 1, x, x)
    np.testing.assert_allclose(out, 0.0)


def _settled(world: World) -> Any:
    """The heap's figures once the failed call's traceback is gone: its frames held views of
    the call's buffers, which keeps them allocated until the next heap call after the views
    die (shmem.quarantine), never reused under a live view."""
    gc.collect()
    with world.zeros(1, "uint8"):
        pass
    return world.heap_stats()


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_failing_rank_stops_the_others_quickly(
    world: World, comm: Any, monkeypatch: pytest.MonkeyPatch, direction: str
) -> None:
    """A unit that raises on one rank: that rank raises its error, the others a
    PeerFailedError naming it, well before any deadline; everything is freed."""
    from collectives.mha import _sp_backward, _sp_dynamic
    from collectives.mha._units import PeerFailedError

    failing = world.world_size - 1
    module: Any = _sp_dynamic if direction == "forward" else _sp_backward
    name = "_forward_unit" if direction == "forward" else "_backward_unit"
    if world.rank == failing:

        def boom(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a unit failed on purpose")

        monkeypatch.setattr(module, name, boom)
    else:
        # the others are slow, so the failing rank surely takes a unit: with work stealing
        # a late start could otherwise leave it none (seen once at 4 ranks, 2 nodes)
        real = getattr(module, name)

        def slow(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.02)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, slow)
    q_all, k_all, v_all, do_all = full_inputs(2, 1, 16, total=256)
    shard = sharder(world, "dynamic", 256)
    q, k, v, do = (shard(x) for x in (q_all, k_all, v_all, do_all))
    out = lse = np.zeros(0)
    if direction == "backward":  # a clean forward first
        out, lse = sequence_parallel_attention(
            comm, q, k, v, causal=True, unit_rows=16, return_lse=True
        )
    used = _settled(world)  # the forward's buffers are freed once its frames are gone
    start = time.monotonic()
    expected: Any = RuntimeError if world.rank == failing else PeerFailedError
    named = "on purpose" if world.rank == failing else f"rank {failing} failed"
    with pytest.raises(expected, match=named):
        if direction == "forward":
            sequence_parallel_attention(comm, q, k, v, causal=True, unit_rows=16)
        else:
            sequence_parallel_attention_backward(
                comm, do, q, k, v, out, lse, causal=True, unit_rows=16
            )
    assert time.monotonic() - start < 10  # the deadline in tests is 20 s
    assert _settled(world) == used  # every symmetric buffer of the call was freed


def test_a_rank_failing_before_the_units_start_stops_the_others(
    world: World, comm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the symmetric buffers exist but before any unit ran (here: in the
    barrier that follows writing the inputs): no rank waits out a deadline, the heap stays
    in step on every rank, and the next call works."""
    from collectives.mha import _units as spm
    from collectives.mha._units import PeerFailedError

    if world.world_size == 1:
        pytest.skip("needs a peer")
    from collectives.mha._units import ready as real_ready

    if world.rank == 0:

        def boom(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("inputs failed on purpose")

        monkeypatch.setattr(spm, "ready", boom)
    x = np.ones((8, 2, 8), np.float32)
    used = world.heap_stats()
    start = time.monotonic()
    for schedule in ("dynamic", "ring"):
        with pytest.raises((RuntimeError, PeerFailedError), match=r"on purpose|rank 0 failed"):
            sequence_parallel_attention(comm, x, x, x, schedule=schedule)
    assert time.monotonic() - start < 10
    assert _settled(world) == used
    monkeypatch.setattr(spm, "ready", real_ready)
    out = sequence_parallel_attention(comm, x, x, x)  # still in step
    np.testing.assert_allclose(out, 1.0)


def test_long_work_elsewhere_is_not_a_timeout(
    world: World, comm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ring backward takes no work from others: rank 0 waits for what the slow last rank
    computes. Longer than the deadline in total, but with progress all along: no timeout."""
    import dataclasses

    if world.world_size == 1:
        pytest.skip("needs a peer")
    cfg = world.config
    short = dataclasses.replace(cfg, signal=dataclasses.replace(cfg.signal, timeout_s=1.0))
    monkeypatch.setattr(world, "config", short)
    q_all, k_all, v_all, do_all = full_inputs(2, 2, 32, seed=5, total=256)
    shard = sharder(world, "ring", 256)
    q, k, v, do = (shard(x) for x in (q_all, k_all, v_all, do_all))
    out, lse = sequence_parallel_attention(comm, q, k, v, schedule="ring", return_lse=True)
    if world.rank == world.world_size - 1:  # every unit of the last rank takes 0.3 s
        from collectives.mha import _sp_backward as spm

        real = spm._backward_unit

        def slow_unit(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.3)
            return real(*args, **kwargs)

        monkeypatch.setattr(spm, "_backward_unit", slow_unit)
    start = time.monotonic()
    grads = sequence_parallel_attention_backward(
        comm, do, q, k, v, out, lse, schedule="ring", threads=1
    )
    took = max(world.comm.allgather(time.monotonic() - start))
    assert took > 1.0, f"the slow rank was not slow enough to test the deadline ({took:.2f} s)"
    _, dq_ref, _, _ = naive(q_all, k_all, v_all, False, None, None, 1 / np.sqrt(32), do_all)
    np.testing.assert_allclose(grads[0], shard(dq_ref), rtol=1e-4, atol=1e-4)
