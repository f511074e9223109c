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
