"""Pure parts of the collectives: shards, the algorithm table, and the reduction kernel."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectives.ops import OPS, accumulate_dtype, check_op, int_avg, reduce_into
from collectives.schedule import AlgorithmTable, shard_bounds, shard_of


@given(n=st.integers(0, 10_000), parts=st.integers(1, 17))
def test_shards_tile_the_range(n: int, parts: int) -> None:
    bounds = shard_bounds(n, parts)
    assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == n
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(parts - 1))
    assert [shard_of(n, parts, i) for i in range(parts)] == bounds


def test_algorithm_table() -> None:
    t = AlgorithmTable()
    assert t.choose(1 << 30, 2, 1) == "one_shot"
    assert t.choose(64 << 10, 4, 1) == "one_shot" and t.choose(1 << 20, 4, 1) == "two_shot"
    assert t.choose(8, 4, 2) == "hierarchical"
    assert t.choose(8, 1, 1) == "one_shot"
    assert AlgorithmTable(forced="two_shot").choose(8, 2, 1) == "two_shot"
    # a crowded node (more ranks than cores): one-shot up to 1 MiB at every world size
    crowded = AlgorithmTable(crowded=True)
    for p in (3, 4, 8, 64):
        assert crowded.choose(1 << 20, p, 1) == "one_shot"
        assert crowded.choose((1 << 20) + 1, p, 1) == "two_shot"
        assert t.choose(512 << 10, p, 1) == "two_shot"  # (not crowded: the rows)
    assert crowded.choose(1 << 30, 2, 1) == "one_shot" and crowded.choose(8, 4, 2) == "hierarchical"
    assert AlgorithmTable(crowded=True, forced="two_shot").choose(8, 4, 1) == "two_shot"
    # a configured limit below the crowded one: the rows' (the Communicator sets both)
    low = AlgorithmTable(
        ((2, 4096), (1 << 30, 4096)), crowded=True, crowded_one_shot_max_nbytes=4096
    )
    assert low.choose(4096, 4, 1) == "one_shot" and low.choose(4097, 4, 1) == "two_shot"
    with pytest.raises(ValueError, match="parts must be >= 1"):
        shard_bounds(4, 0)


def test_op_checks_and_accumulation() -> None:
    assert set(OPS) == {"sum", "avg", "prod", "min", "max", "band", "bor", "bxor"}
    with pytest.raises(ValueError, match="needs an integer or bool"):
        check_op("band", np.dtype(ml_dtypes.bfloat16), "t")
    with pytest.raises(ValueError, match="does not apply to bool"):
        check_op("avg", np.dtype(bool), "t")
    with pytest.raises(ValueError, match="unknown op"):
        check_op("mean", np.dtype(np.float32), "t")
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    assert accumulate_dtype(np.dtype(ml_dtypes.bfloat16), f32) == f32
    assert accumulate_dtype(np.dtype(np.float16), f32) == f32
    assert accumulate_dtype(f32, f64) == f64
    assert accumulate_dtype(np.dtype(np.int8), f32) == np.dtype(np.int8)


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
def test_low_precision_rounds_once(name: str) -> None:
    dt = np.dtype(getattr(ml_dtypes, name, None) or name)
    rng = np.random.default_rng(1)
    xs = [(rng.standard_normal(300_000) * 3).astype(dt) for _ in range(3)]  # several chunks
    out = np.empty_like(xs[0])
    reduce_into(out, xs, "sum", np.dtype(np.float32))
    ref = (xs[0].astype(np.float32) + xs[1].astype(np.float32)) + xs[2].astype(np.float32)
    assert out.tobytes() == ref.astype(dt).tobytes()
    reduce_into(out, xs, "avg", np.dtype(np.float32), avg_count=3)
    assert out.tobytes() == (ref / np.float32(3)).astype(dt).tobytes()


def test_integer_avg_truncates_toward_zero() -> None:
    a = np.array([-7, 7, -6, 5, -1], np.int32)
    int_avg(a, 2)
    assert a.tolist() == [-3, 3, -3, 2, 0]
    u = np.array([7, 8], np.uint8)
    int_avg(u, 2)
    assert u.tolist() == [3, 4]


def test_single_source_and_float64_accumulation() -> None:
    x = np.arange(5, dtype=np.float32)
    out = np.empty(5, np.float32)
    reduce_into(out, [x], "max", np.dtype(np.float32))
    assert out.tolist() == x.tolist()
    big = np.full(4, 1e8, np.float32)
    small = np.full(4, 1.0, np.float32)
    out4 = np.empty(4, np.float32)
    reduce_into(out4, [big, small, -big], "sum", np.dtype(np.float64))
    assert out4.tolist() == [1.0] * 4  # float32 accumulation would lose the 1


@pytest.mark.parametrize("op", ["sum", "prod", "avg"])
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_low_precision_reduce_into_in_c_gives_numpys_bits(
    monkeypatch: pytest.MonkeyPatch, name: str, op: str
) -> None:
    """reduce_into of float16/bfloat16 in float32 takes the C reduction where it applies
    (sum, prod, an avg without its count: a partial sum) and gives numpy's bits: through its
    chunks, with NaNs, infinities and float16 overflows handed back to numpy (out written
    again), in place (out is an input: numpy's), and for a strided input (numpy's)."""
    from collectives import ops

    if ops._c_reduce_wide is None:
        pytest.skip("collectives._replay is not built")
    dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(3)
    calls: list[int] = []
    real = ops._c_reduce_wide

    def counted(*args: object) -> bool:
        ok = bool(real(*args))
        calls.append(ok)
        return ok

    def both(out_of: np.ndarray | None, xs: list[np.ndarray], avg: int | None = None) -> None:
        monkeypatch.setattr(ops, "_c_reduce_wide", None)
        want = np.full(xs[0].shape, 7, dt)
        with np.errstate(all="ignore"):
            reduce_into(want, [x.copy() for x in xs], op, f32, avg_count=avg)
        monkeypatch.setattr(ops, "_c_reduce_wide", counted)
        got = np.full(xs[0].shape, 7, dt) if out_of is None else out_of
        with np.errstate(all="ignore"):
            reduce_into(got, xs, op, f32, avg_count=avg)
        assert got.tobytes() == want.tobytes(), (name, op, len(xs))

    for count in (1, 511, 512, 513, 5000):
        for members in (1, 2, 3):
            scale = 1.5 if op == "prod" else 100.0
            xs = [(rng.standard_normal(count) * scale).astype(dt) for _ in range(members)]
            both(None, xs)
    assert calls.count(True) > len(calls) // 2  # in C (but where a result is flagged)
    xs = [(rng.standard_normal(600) * 100).astype(dt) for _ in range(2)]
    for bad in (np.nan, np.inf, 60000.0 if name == "float16" else 3e38):
        ys = [x.copy() for x in xs]
        ys[0][550] = ys[1][550] = bad
        calls.clear()
        both(None, ys)
        # handed back after the first chunk was written (a bfloat16 inf is no flag: C's)
        assert calls == [bad == np.inf and name == "bfloat16"], bad
    calls.clear()
    ys = [x.copy() for x in xs]
    both(ys[0], ys)  # in place: out is the first input
    both(None, [xs[0][::2], xs[1][::2]])  # strided
    assert calls == []
    both(None, xs, avg=2)  # an avg with its count: divided in C too
    assert len(calls) == 1
