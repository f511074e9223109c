"""Collectives against references built from every rank's input, on every world size.

The exact reference is the definition: ``((x_0 op x_1) op x_2) ...`` in the accumulation dtype
(float32 for float16/bfloat16/float8), rounded once. One-shot and two-shot must match it
bitwise; hierarchical (several nodes) reduces node by node, so it is compared with a float64
reference within a tolerance, and bitwise across ranks.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import collectives
import shmem
from collectives.allreduce import replay_status
from collectives.allreduce_plans import NODE_PLAN_NBYTES, SHARE_MIN
from collectives.family import BROADCAST_PLAN_NBYTES, FAMILY_PLAN_NBYTES
from collectives.schedule import shard_of
from shmem import SUPPORTED_DTYPES, World, as_dtype
from shmem.errors import (
    ArgumentError,
    CollectiveArgumentError,
    CollectiveMismatchError,
    OpError,
    ShmemError,
    SignalTimeoutError,
)

pytestmark = pytest.mark.mpi

LOW = {"float16", "bfloat16", "float8_e4m3", "float8_e5m2"}
COMPLEX = {"complex64", "complex128"}
FLOATS = {"float16", "float32", "float64", "bfloat16", "float8_e4m3", "float8_e5m2", "longdouble"}
FLOATS |= COMPLEX  # not integers: no bitwise ops, compared within a tolerance across nodes
UFUNC = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}


def valid(op: str, name: str) -> bool:
    if op in ("band", "bor", "bxor"):
        return name not in FLOATS
    if op in ("min", "max") and name in COMPLEX:
        return False
    return not (op == "avg" and name == "bool")


CASES = [(op, name) for name in sorted(SUPPORTED_DTYPES) for op in UFUNC if valid(op, name)]


def make_input(name: str, op: str, count: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    dt = SUPPORTED_DTYPES[name]
    if name == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if name in COMPLEX:
        if op == "prod":
            return (1 + rng.random(count) / 8 + 1j * rng.random(count) / 8).astype(dt)
        return (100 * (rng.standard_normal(count) + 1j * rng.standard_normal(count))).astype(dt)
    if op == "prod":
        vals = rng.choice([-1, 1, 2], count) if name not in FLOATS else 1 + rng.random(count) / 8
        return np.asarray(vals).astype(dt)
    if name in FLOATS:
        return (rng.standard_normal(count) * (4 if name.startswith("float8") else 100)).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), count).astype(dt)


def reference(inputs: list[np.ndarray[Any, Any]], op: str, name: str) -> np.ndarray[Any, Any]:
    """The definition, written independently of collectives.ops."""
    dt = SUPPORTED_DTYPES[name]
    acc = np.dtype(np.float32) if name in LOW else dt
    if not inputs[0].size:
        return np.zeros(0, dt)
    out = inputs[0].astype(acc)
    for x in inputs[1:]:
        if op == "prod" and acc.kind == "c":  # componentwise, each operation rounded
            y = x.astype(acc)
            re = out.real * y.real - out.imag * y.imag
            im = out.real * y.imag + out.imag * y.real
            out = np.empty_like(y)
            out.real, out.imag = re, im
        else:
            out = UFUNC[op](out, x.astype(acc))
    if op == "avg":
        p = len(inputs)
        if acc.kind == "c":  # each component divided by the count
            out = out.copy()
            out.real, out.imag = (
                out.real / out.real.dtype.type(p),
                out.imag / out.imag.dtype.type(p),
            )
        elif acc.kind == "f":
            out = out / acc.type(p)
        elif acc.kind == "u":
            out = out // p
        else:
            wide = out.astype(np.int64)
            out = (wide // p + ((wide % p != 0) & (wide < 0))).astype(acc)
    return out.astype(dt)


def float64_reference(inputs: list[np.ndarray[Any, Any]], op: str) -> np.ndarray[Any, Any]:
    wide = np.complex128 if inputs[0].dtype.kind == "c" else np.float64
    out = inputs[0].astype(wide)
    for x in inputs[1:]:
        out = UFUNC[op](out, x.astype(wide))
    return out / len(inputs) if op == "avg" else out


def bits(a: np.ndarray[Any, Any]) -> bytes:
    """The value bytes (a long double's padding bytes are not part of its value)."""
    a = np.ascontiguousarray(a).reshape(-1)
    if a.dtype == np.longdouble and np.finfo(np.longdouble).nmant == 63 and a.itemsize > 10:
        return a.view(np.uint8).reshape(-1, a.itemsize)[:, :10].tobytes()
    return a.tobytes()


def check_result(
    world: World,
    got: np.ndarray[Any, Any],
    inputs: list[np.ndarray[Any, Any]],
    op: str,
    name: str,
    exact: bool,
) -> None:
    got = np.asarray(got).reshape(-1)
    everyone = world.comm.allgather(got.tobytes())  # padding included: reductions zero it
    assert len(set(everyone)) == 1, "bitwise identical on every rank"
    ref = reference(inputs, op, name)
    # (a complex product is componentwise, never fused: collectives.ops.complex_multiply;
    # numpy's own multiply fuses or not by the loop it picks, so it is not the reference)
    if exact or name not in FLOATS:
        assert bits(got) == bits(ref), f"{op} {name}: not the rank-order result"
    else:
        # one rounding of the result: half an ulp of the dtype's mantissa, relative
        tol = {
            "float64": 1e-9,
            "float32": 1e-4,
            "float16": 2e-3,
            "bfloat16": 1e-2,
            "float8_e4m3": 0.07,
            "float8_e5m2": 0.13,
            "longdouble": 1e-9,
            "complex64": 1e-4,
            "complex128": 1e-9,
        }[name]
        ref64 = float64_reference(inputs, op)
        np.testing.assert_allclose(got.astype(ref64.dtype), ref64, rtol=tol, atol=tol * 8)


@pytest.fixture
def comm(world: World) -> Any:
    c = collectives.Communicator(world)
    yield c
    c.close()


@pytest.mark.parametrize(("op", "name"), CASES, ids=[f"{o}-{n}" for o, n in CASES])
def test_all_reduce_every_op_dtype_algorithm(world: World, comm: Any, op: str, name: str) -> None:
    exact = world.num_nodes == 1
    for algorithm in ("one_shot", "two_shot", "hierarchical"):
        for count in (0, 1, 7, 1021):
            x = make_input(name, op, count, seed=world.rank * 7919 + count)
            inputs = world.comm.allgather(x)
            got = comm.all_reduce(x.copy(), op=op, algorithm=algorithm)  # out of place
            # on one node hierarchical is two-shot in rank order: exact as well
            check_result(world, got, inputs, op, name, exact)
            y = x.copy()
            assert comm.all_reduce(y, op=op, out=y, algorithm=algorithm) is y  # in place
            assert y.tobytes() == np.asarray(got).tobytes()


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_two_shot_stages_only_what_peers_read_of_a_numpy_input(
    world: World, comm: Any, name: str
) -> None:
    """The two-shot all-reduce of a numpy input stages only the elements peers reduce (not
    my own shard: I reduce it from my array), in every form (new array, numpy out=, in place
    on the array), with the one-shot algorithm's bits."""
    if world.num_nodes > 1:
        pytest.skip("one node's two-shot exchange")
    p, r, count = world.world_size, world.rank, 300_001
    x = make_input(name, "sum", count, seed=world.rank)
    want = comm.all_reduce(x, algorithm="one_shot")
    a, b = collectives.schedule.shard_of(count, p, r)
    for form in ("new", "out", "in_place"):
        y = x.copy()
        staged = comm.stats.staged_bytes
        if form == "new":
            got = comm.all_reduce(y, algorithm="two_shot")
        elif form == "out":
            got = np.full_like(y, 7)
            comm.all_reduce(y, out=got, algorithm="two_shot")
        else:
            comm.all_reduce(y, out=y, algorithm="two_shot")
            got = y
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), form
        assert comm.stats.staged_bytes - staged == (count - (b - a)) * x.itemsize, form
        if form != "in_place":
            assert y.tobytes() == x.tobytes(), form  # the input is left as it was


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64"])
def test_a_large_reduce_scatter_stages_only_what_peers_read_of_a_numpy_input(
    world: World, comm: Any, name: str
) -> None:
    """Beyond its cached plan the node-local reduce-scatter of a numpy input stages every
    element but my shard (I reduce it from my array): the one-shot all-reduce's bits of my
    shard, the input left as it was; an ``out`` that is a view of the input itself stages
    it all (the result overwrites my shard while peers' shards are read)."""
    if world.num_nodes > 1:
        pytest.skip("one node's exchange")
    p, r = world.world_size, world.rank
    count = NODE_PLAN_NBYTES // 2 + 3 * p + 1  # past the plan in every dtype here
    a, b = shard_of(count, p, r)
    for i in range(3):  # new data each call
        x = make_input(name, "sum", count, seed=world.rank * 10 + i)
        want = np.asarray(comm.all_reduce(x, algorithm="one_shot"))[a:b]
        comm.all_reduce(np.full_like(x, 3), algorithm="one_shot")  # (my stage: not my data)
        y = x.copy()
        staged = comm.stats.staged_bytes
        got = np.full(b - a, 7, x.dtype)
        comm.reduce_scatter(y, out=got)
        assert got.tobytes() == want.tobytes(), i
        assert comm.stats.staged_bytes - staged == (count - (b - a)) * x.itemsize, i
        assert y.tobytes() == x.tobytes(), i  # the input is left as it was
    y = x.copy()
    staged = comm.stats.staged_bytes
    view = y[a:b]  # out overlaps my input: every element is staged
    comm.reduce_scatter(y, out=view)
    assert view.tobytes() == want.tobytes()
    assert comm.stats.staged_bytes - staged == count * x.itemsize


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int32", "float64"])
def test_large_count_numpy_and_symmetric(world: World, comm: Any, name: str) -> None:
    count = 1 << 20
    x = make_input(name, "sum", count, seed=world.rank)
    inputs = world.comm.allgather(x)
    results = {}
    for algorithm in ("one_shot", "two_shot"):
        results[algorithm] = comm.all_reduce(x, algorithm=algorithm)
        check_result(world, results[algorithm], inputs, "sum", name, world.num_nodes == 1)
    if world.num_nodes == 1:
        assert results["one_shot"].tobytes() == results["two_shot"].tobytes()
    with world.zeros(count, name) as sym:
        sym.local()[...] = x
        world.barrier()
        staged = comm.stats.staged_bytes
        out = comm.all_reduce(sym)
        assert comm.stats.staged_bytes == staged, "the zero-copy path copies nothing"
        assert out.tobytes() == np.asarray(results["one_shot"]).tobytes()
        comm.all_reduce(sym, out=sym)  # in place
        assert sym.local().tobytes() == out.tobytes()
        # in place stages nothing either, whatever the table picks: every rank reduces its
        # shard straight into x, where no peer reads, and copies the others' (issue 44)
        assert comm.stats.staged_bytes == staged


@pytest.mark.parametrize(
    ("name", "op"), [("float32", "sum"), ("bfloat16", "avg"), ("int64", "max"), ("float64", "prod")]
)
def test_large_in_place_shares_the_work_and_matches_every_form(
    world: World, comm: Any, name: str, op: str
) -> None:
    """A large in-place all-reduce on a symmetric buffer publishes its result (``RES``):
    every rank then reduces only its shard, straight into x where no peer reads, and copies
    the others' from their owners. Bitwise the numpy form's result, with every rank in place
    and with ranks mixing the forms in one call (in place, numpy, a symmetric ``out=``: the
    ones not in place follow the shards too), an odd count (unequal shards), every
    algorithm the table or a user picks, and again on new data (nothing stale)."""
    count = SHARE_MIN // np.dtype(SUPPORTED_DTYPES[name]).itemsize + 7  # (any dtype: shards)
    for trial in range(2):
        x = make_input(name, op, count, seed=7 * world.rank + trial)
        want = comm.all_reduce(x, op=op)  # the reference: a numpy input, staged
        check_result(world, want, world.comm.allgather(x), op, name, world.num_nodes == 1)
        with world.zeros(count, name) as sym, world.zeros(count, name) as other:
            for form in ("in_place", "mixed", "two_shot", "hierarchical"):
                sym.local()[...] = x
                algorithm = form if form in ("two_shot", "hierarchical") else "auto"
                if form != "mixed" or world.rank % 3 == 0:
                    comm.all_reduce(sym, op=op, out=sym, algorithm=algorithm)
                    got = np.asarray(sym.local())
                elif world.rank % 3 == 1:
                    got = comm.all_reduce(x, op=op)
                else:
                    comm.all_reduce(sym, op=op, out=other)
                    got = np.asarray(other.local())
                assert got.tobytes() == want.tobytes(), (trial, form)


@pytest.mark.parametrize("where", ["plan", "general"])
@pytest.mark.parametrize(
    ("name", "op"), [("float32", "sum"), ("bfloat16", "avg"), ("int64", "max")]
)
def test_large_in_place_with_streaming_stores_gives_the_same_bits(
    world: World, comm: Any, name: str, op: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In place shard by shard, the results written with streaming stores (the way
    ``collectives.stage_way`` may choose, forced here for every shard): the reduced shard
    chunk by chunk through a block, the gathered shards copied with ``stream_copy``. The
    bits are the numpy form's, an odd count (unequal shards) included, from the cached plan
    (just above SHARE_MIN) and from the general route (above the plans, 3 MiB: several
    chunks)."""
    import collectives.ops
    from collectives.stage_way import StageWays

    real_copy = collectives.ops._c_stream_copy
    if real_copy is None:
        pytest.skip("the C extension is not built")
    real_way = StageWays.way
    streamed: list[int] = []

    def spy(dst: Any, src: Any) -> None:
        streamed.append(dst.nbytes)
        real_copy(dst, src)

    def way(self: StageWays, nbytes: int, timed: bool = True, key: str = "") -> bool:
        return True if key == "shards" else real_way(self, nbytes, timed, key)

    monkeypatch.setattr(collectives.ops, "_c_stream_copy", spy)
    monkeypatch.setattr(StageWays, "way", way)
    isz = np.dtype(SUPPORTED_DTYPES[name]).itemsize
    count = (SHARE_MIN if where == "plan" else 3 << 20) // isz + 7
    p = world.world_size
    for trial in range(2):
        x = make_input(name, op, count, seed=11 * world.rank + trial)
        want = comm.all_reduce(x, op=op)  # staged: no shards
        before = len(streamed)
        with world.zeros(count, name) as sym:
            sym.local()[...] = x
            comm.all_reduce(sym, op=op, out=sym)
            assert np.asarray(sym.local()).tobytes() == want.tobytes(), trial
        if world.num_nodes == 1 and p > 1:  # my shard (chunk by chunk), then the p - 1 others
            from collectives.schedule import shard_of

            a, b = shard_of(count, p, world.local_rank)
            chunks = -(-(b - a) * max(isz, 4) // collectives.ops.CHUNK_BYTES)  # (acc >= 4 B)
            assert len(streamed) - before >= chunks + p - 1, trial


def test_in_place_in_pieces_beyond_scratch_capacity(world: World, comm: Any) -> None:
    """In place, larger than the scratch (ci.toml: 16 MiB): every piece a call of its own,
    each publishing where its part of x sits; exact (small integers)."""
    count = 5 << 20  # 20 MiB of float32
    with world.zeros(count, "float32") as sym:
        sym.local()[...] = np.arange(count, dtype=np.float32) % 61 + world.rank
        comm.all_reduce(sym, out=sym)
        p = world.world_size
        want = (np.arange(count, dtype=np.float32) % 61) * p + p * (p - 1) // 2
        assert np.asarray(sym.local()).tobytes() == want.astype(np.float32).tobytes()


def test_zero_copy_family_and_staging_counts(world: World, comm: Any) -> None:
    p = world.world_size
    with world.zeros(4 * p, "int64") as sym:
        sym.local()[...] = np.arange(4 * p) + 100 * world.rank
        world.barrier()
        before = comm.stats.staged_bytes
        comm.reduce_scatter(sym)
        comm.all_gather(sym)
        comm.broadcast(sym, root=0, out=np.empty(4 * p, np.int64))
        comm.all_to_all(sym, out=np.empty(4 * p, np.int64))
        if world.num_nodes == 1:
            assert comm.stats.staged_bytes == before
        comm.all_reduce(np.zeros(4 * p, np.int64))
        if world.num_nodes == 1:
            assert comm.stats.staged_bytes == before + 4 * p * 8  # numpy inputs are staged


def test_small_zero_copy_inputs_are_staged_by_the_c_replay(plain: tuple[World, Any]) -> None:
    """A replayed call's zero-copy input of up to STAGE_SMALL bytes is copied in like a numpy
    one (cheaper than waiting for every peer's DONE before returning); a larger one is read
    where it is. Results are the same either way."""
    from collectives.replay import STAGE_SMALL

    world, comm = plain
    if replay_status() != "C" or world.num_nodes > 1 or world.config.collectives.check_args:
        pytest.skip("the C replay on one node (the defaults)")
    p = world.world_size
    with (
        world.zeros(4, "int64") as small,
        world.zeros(STAGE_SMALL // 8 + 8, "int64") as big,
    ):
        for buf in (small, big):
            buf.local()[...] = world.rank + 1
            for _ in range(3):  # the plan, then replays
                comm.all_reduce(buf)
            before = comm.stats.staged_bytes
            for _ in range(20):
                assert (comm.all_reduce(buf) == p * (p + 1) // 2).all()
            staged = comm.stats.staged_bytes - before
            if buf is big:
                assert staged == 0
            elif comm.host_channel.spin_s > 0:  # (no spin with more ranks than cores)
                assert staged > 0 and staged % 32 == 0


def test_determinism_run_to_run_and_across_algorithms(world: World, comm: Any) -> None:
    x = make_input("bfloat16", "sum", 4099, seed=world.rank)
    first = comm.all_reduce(x)
    for _ in range(3):
        assert comm.all_reduce(x).tobytes() == first.tobytes()
    if world.num_nodes == 1:
        assert comm.all_reduce(x, algorithm="two_shot").tobytes() == first.tobytes()
        assert comm.all_reduce(x, algorithm="one_shot").tobytes() == first.tobytes()


@pytest.mark.parametrize("count", [0, 1, 7, 1021, 5000])
def test_family(world: World, comm: Any, count: int) -> None:
    p, r = world.world_size, world.rank
    x = make_input("int32", "sum", count, seed=r + 1)
    inputs = world.comm.allgather(x)
    total = reference(inputs, "sum", "int32")
    lo, hi = shard_of(count, p, r)
    assert comm.reduce_scatter(x).tobytes() == total[lo:hi].tobytes()
    mx = comm.reduce_scatter(x, op="max")
    assert mx.tobytes() == reference(inputs, "max", "int32")[lo:hi].tobytes()
    assert comm.all_gather(x).tobytes() == np.concatenate(inputs).tobytes()
    for root in range(p):
        y = x.copy()
        assert comm.broadcast(y, root=root) is y
        assert y.tobytes() == inputs[root].tobytes()
    m = count - count % p
    got = comm.all_to_all(x[:m].copy())
    expected = np.concatenate([a[:m].reshape(p, -1)[r] for a in inputs]) if m else x[:0]
    assert got.tobytes() == expected.tobytes()
    z = x[:m].copy()
    comm.all_to_all(z, out=z)  # in place
    assert z.tobytes() == expected.tobytes()
    comm.barrier()


def test_argument_errors(world: World, comm: Any) -> None:
    p = world.world_size
    with pytest.raises(ValueError, match="unknown op"):
        comm.all_reduce(np.zeros(4, np.float32), op="mean")
    with pytest.raises(ValueError, match="needs an integer or bool dtype"):
        comm.all_reduce(np.zeros(4, np.float32), op="bxor")
    with pytest.raises(ValueError, match="invalid out"):
        comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="unknown algorithm"):
        comm.all_reduce(np.zeros(4, np.float32), algorithm="ring")
    # a strided input is read through a copy, on every path; a strided out is refused
    strided = np.arange(16, dtype=np.float32).reshape(4, 4)[:, 0]
    assert np.asarray(comm.all_reduce(strided)).tolist() == [p * v for v in (0, 4, 8, 12)]
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        comm.all_reduce(np.zeros(4, np.float32), out=np.zeros((4, 4), np.float32)[:, 0])
    with pytest.raises(ValueError, match="must be a SHMEMBuffer or a numpy array"):
        comm.all_reduce([1, 2, 3])
    with pytest.raises(ValueError, match="invalid root"):
        comm.broadcast(np.zeros(2), root=p)
    if p > 1:
        with pytest.raises(ValueError, match="multiple of the world size"):
            comm.all_to_all(np.zeros(p + 1))
    comm.barrier()  # still in step


def test_mismatch_is_detected_on_every_rank(world: World, comm: Any) -> None:
    if world.world_size == 1:
        pytest.skip("needs two ranks to disagree")
    assert world.config.collectives.check_args
    with pytest.raises(CollectiveMismatchError, match=r"rank 1 in its call \d+: all_reduce\(4 "):
        comm.all_reduce(np.zeros(3 + world.rank, np.float32))
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 in its call \d+: .*op=max"):
        comm.all_reduce(np.zeros(3, np.float32), op="sum" if world.rank else "max")
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 in its call \d+: .*float64"):
        comm.all_reduce(np.zeros(3, np.float32 if world.rank else np.float64))
    bad = np.zeros(3, np.float32) if world.rank else np.zeros(3, np.clongdouble)
    with pytest.raises(
        (CollectiveMismatchError, TypeError), match=r"invalid arguments on other|unsupported dtype"
    ):
        comm.all_reduce(bad)
    out = comm.all_reduce(np.ones(5, np.float32))  # nothing was corrupted
    assert (out == world.world_size).all()


def test_pieces_beyond_scratch_capacity(world: World, comm: Any) -> None:
    count = 3 << 20  # 12 MiB of float32: staging + shards exceed ci.toml's 16 MiB cap
    x = np.full(count, world.rank + 1, np.float32)
    x[::977] = world.rank * 0.5
    inputs_sum = np.zeros(count, np.float32)
    for r in range(world.world_size):
        y = np.full(count, r + 1, np.float32)
        y[::977] = r * 0.5
        inputs_sum = y if r == 0 else inputs_sum + y
    for algorithm in ("one_shot", "two_shot"):
        got = comm.all_reduce(x, algorithm=algorithm)
        assert got.tobytes() == inputs_sum.tobytes()  # small integers and halves: exact
    if world.num_nodes == 1:
        assert comm.stats.scratch_growths >= 1


def test_a_missing_peer_times_out_instead_of_hanging() -> None:
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=0.5, collectives_check_args=False)
    try:
        comm = collectives.Communicator(world)
        if world.world_size == 1 or world.num_nodes > 1:
            comm.close()
            pytest.skip("needs 2+ ranks on one node")
        start = time.monotonic()
        if world.rank != 0:
            with pytest.raises(SignalTimeoutError, match="waiting for rank 0"):
                comm.all_reduce(np.ones(4, np.float32))
            assert time.monotonic() - start < 5
        world.comm.Barrier()
        comm._closed = True  # the communicator's state is broken on purpose: drop it
    finally:
        world.finalize()


def test_soak_random_calls_bitwise_and_heap_baseline(world: World) -> None:
    baseline = world.heap_stats()
    comm = collectives.Communicator(world)
    _soak(world, comm, 2000, zero_copy=False)
    comm.close()
    assert world.heap_stats() == baseline, "every allocation of the communicator was freed"


def test_soak_with_the_cached_replays() -> None:
    """The same soak with the defaults (no check_args: small calls replay cached plans, in C
    where built) and zero-copy inputs half the time: every kind of call, shape, dtype, op and
    root in a random order, so plans are made, replayed, switched and dropped between
    general-path calls; every result exact, the heap back to its baseline after."""
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=20.0)
    try:
        baseline = world.heap_stats()
        comm = collectives.Communicator(world)
        _soak(world, comm, 1500, zero_copy=True)
        comm.close()
        assert world.heap_stats() == baseline, "every allocation of the communicator was freed"
    finally:
        world.finalize()


def _soak(world: World, comm: Any, iterations: int, zero_copy: bool) -> None:
    rng = np.random.default_rng(2024)  # the same sequence on every rank
    names = sorted(SUPPORTED_DTYPES)
    p = world.world_size
    for i in range(iterations):
        name = names[rng.integers(len(names))]
        op = str(rng.choice([o for o in UFUNC if valid(o, name)]))
        count = int(rng.choice([0, 1, 2, 3, 7, 64, 1000, 4097]))
        kind = int(rng.integers(4))
        root = int(rng.integers(p))
        # with zero-copy inputs, the call is repeated (replays of its plan) half the time,
        # half of them on a SHMEMBuffer (the same choices on every rank)
        repeats = int(rng.integers(1, 4)) if zero_copy else 1
        sym = world.empty(count, name) if zero_copy and rng.integers(2) else None
        for rep in range(repeats):
            _soak_call(world, comm, i * 4 + rep, name, op, count, kind, root, sym)
        if sym is not None:
            world.barrier()  # (closing is collective; no peer still reads it)
            sym.close()


def _soak_call(
    world: World,
    comm: Any,
    where: int,
    name: str,
    op: str,
    count: int,
    kind: int,
    root: int,
    sym: Any,
) -> None:
    p, r = world.world_size, world.rank
    x = make_input(name, op, count, seed=where * 31 + r)
    if sym is not None:  # a zero-copy input (the call returned: no peer reads it any more)
        sym.local()[...] = x
    arg: Any = x if sym is None else sym
    if kind == 0:
        got = comm.all_reduce(arg, op=op)
        inputs = world.comm.allgather(x)
        check_result(world, got, inputs, op, name, world.num_nodes == 1)
    elif kind == 1:
        lo, hi = shard_of(count, p, r)
        got = comm.reduce_scatter(arg, op=op)
        full = reference(world.comm.allgather(x), op, name)
        if (world.num_nodes == 1 or name not in FLOATS) and not (
            name in COMPLEX and op == "prod"  # see check_result
        ):
            assert bits(got) == bits(full[lo:hi]), f"iteration {where}"
    elif kind == 2:
        got = comm.all_gather(arg)
        assert got.tobytes() == np.concatenate(world.comm.allgather(x)).tobytes(), where
    else:
        if sym is None:
            y = x.copy()
            comm.broadcast(y, root=root)
        else:
            comm.broadcast(sym, root=root)
            y = sym.local().copy()
        assert y.tobytes() == world.comm.bcast(x, root=root).tobytes(), f"iteration {where}"


_ = ml_dtypes


def test_fast_path_follows_the_table_with_mixed_arguments() -> None:
    """A cached one-shot plan must not be replayed where the table picks two-shot: ranks
    passing a SHMEMBuffer (no fast path) and numpy would run different protocols."""
    world = shmem.init(
        heap_nbytes="16MiB", collectives_one_shot_max_nbytes="1KiB", signal_timeout_s=10.0
    )
    try:
        with collectives.Communicator(world) as comm, world.zeros(1024, "float32") as shm:
            x = np.full(1024, world.rank + 1, np.float32)
            total = float(sum(range(1, world.world_size + 1)))
            assert (comm.all_reduce(x, algorithm="one_shot") == total).all()  # caches a plan
            if world.rank % 2:
                shm.local()[...] = x
                got = np.asarray(comm.all_reduce(shm))
            else:
                got = comm.all_reduce(x)
            assert (got == total).all()
    finally:
        world.finalize()


def test_use_after_finalize_raises_instead_of_crashing() -> None:
    world = shmem.init(heap_nbytes="16MiB")
    comm = collectives.Communicator(world)
    x, out = np.ones(4, np.float32), np.zeros(4, np.float32)
    for _ in range(3):  # (the same objects: the memo, in C where built, is armed)
        comm.all_reduce(x, out=out)
    world.finalize()
    with pytest.raises(shmem.ShmemStateError, match="finalized"):
        comm.all_reduce(np.ones(4, np.float32))
    with pytest.raises(shmem.ShmemStateError, match="finalized"):
        comm.all_reduce(x, out=out)  # the memo's guard: its heap is unmapped
    comm.close()  # nothing left to free: no crash


def test_family_beyond_the_scratch_cap_does_not_grow_it(world: World, comm: Any) -> None:
    cap = comm.scratch_capacity
    big = np.ones(cap // 4 + 1000, np.float32)  # more than the scratch may ever hold
    got = comm.all_gather(big)
    assert got.shape[0] == big.shape[0] * world.world_size and (got == 1).all()
    comm.broadcast(big, root=0)
    assert comm.scratch_nbytes <= cap


def test_enums_and_strings_give_the_same_calls(world: World, comm: Any) -> None:
    x = np.arange(1, 65, dtype=np.int32) * (world.rank + 1)
    for op in collectives.ReduceOp:
        if op == "avg":
            continue
        for algo in ("one_shot", "two_shot"):
            by_enum = comm.all_reduce(x, op=op, algorithm=collectives.Algorithm(algo))
            by_name = comm.all_reduce(x, op=str(op), algorithm=algo)
            assert by_enum.tobytes() == by_name.tobytes()
    right = (world.rank + 1) % world.world_size
    world.signal(right, 0, 5, op=shmem.SignalOp.ADD)
    assert world.wait_until(0, shmem.Cmp.GE, 5) >= 5
    world.barrier()


def use_engine(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """Cached replays run in C (skipped where the extension is not built) or, as without
    it, in Python."""
    if engine == "python":
        monkeypatch.setattr(collectives.replay, "_c_replay", None)
    elif replay_status() != "C":
        pytest.skip(replay_status())


@pytest.mark.parametrize("engine", ["C", "python"])
@pytest.mark.parametrize("width", [1, 3], ids=["inline", "staged"])
@pytest.mark.parametrize("kind", ["numpy", "symmetric", "mixed"])
def test_back_to_back_tiny_calls_never_read_a_reused_stage(
    monkeypatch: pytest.MonkeyPatch, kind: str, width: int, engine: str
) -> None:
    """Cached replays right after one another write the other staging area without waiting
    for the peers' DONE: each call's input changes, and one rank stalls now and then while
    still reading the previous call's inputs; every result must be exact, replayed in C
    (where built) or in Python (as without the extension). (The defaults: with check_args,
    as in configs/ci.toml, calls skip the cached replay.)"""
    use_engine(monkeypatch, engine)
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    assert not world.config.collectives.check_args
    p, r = world.world_size, world.rank
    rng = np.random.default_rng(7)  # the same stalls everywhere: a schedule, not noise
    stall = rng.integers(0, p, 400)
    sym = world.zeros(width, "int64")  # one int64: the input rides in the flags' line
    try:
        for i in range(400):
            mine = np.array([i * (r + 1), i, r + 1][:width], np.int64)
            use_sym = kind == "symmetric" or (kind == "mixed" and (i + r) % 3 == 0)
            if use_sym:
                sym.local()[:] = mine
            if stall[i] == r:
                t = time.perf_counter() + 200e-6  # busy: this rank falls behind
                while time.perf_counter() < t:
                    pass
            got = comm.all_reduce(sym if use_sym else mine)
            want = [i * p * (p + 1) // 2, i * p, p * (p + 1) // 2][:width]
            assert np.asarray(got).tolist() == want, (i, np.asarray(got).tolist(), want)
        if world.num_nodes == 1:  # the cached replay ran (across nodes: hierarchical)
            assert comm.stats.algorithms is None or comm.stats.algorithms.get("one_shot", 0)
            assert comm.host_channel is not None
            plan: Any = comm.host_channel.plans[(width, np.dtype(np.int64), "sum")]
            assert (plan.fast is None) == (engine == "python")
            if plan.fast is not None:  # C took every call after the first (which made the
                # plan); how far it got in each (whole, or handing over to Python after READY
                # or DONE) depends on the peers' timing, so only the total is asserted
                done, untouched, after_ready, after_done = answers = plan.fast.answers()
                assert done + untouched + after_ready + after_done >= 399, answers
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("engine", ["C", "python"])
@pytest.mark.parametrize("n", [3, 512], ids=["staged", "zero_copy"])
@pytest.mark.parametrize("form", ["numpy_new", "numpy_out", "sym_new", "sym_out", "in_place"])
def test_the_same_call_again_replays_from_the_memo(
    monkeypatch: pytest.MonkeyPatch, form: str, n: int, engine: str
) -> None:
    """The same x, out and op call after call (a training loop's form): on one node it
    replays from the engine's memo, in C where built (the plan's Python run() no longer
    called), one rank stalling now and then so the C replay hands over mid-call; every
    result exact, every call counted once, under its algorithm."""
    use_engine(monkeypatch, engine)
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    sym, sym_out = world.zeros(n, "int64"), world.zeros(n, "int64")
    xn, on = np.zeros(n, np.int64), np.zeros(n, np.int64)
    x: Any = sym if form.startswith("sym") or form == "in_place" else xn
    out: Any = {"numpy_out": on, "sym_out": sym_out, "in_place": sym}.get(form)
    stall = np.random.default_rng(5).integers(0, 2 * p, 200)  # (the same on every rank)
    try:
        comm.all_reduce(x, out=out)  # makes the plan and the memo
        runs = [0]
        plan: Any = None
        if world.num_nodes == 1:
            assert comm.host_channel is not None
            plan = comm.host_channel.plans[(n, np.dtype(np.int64), "sum")]
            run = plan.run

            def counted(*args: Any) -> None:
                runs[0] += 1
                run(*args)

            monkeypatch.setattr(plan, "run", counted)
        calls = comm.stats.calls
        counts = sum((comm.stats.algorithms or {}).values())
        for i in range(200):
            mine = np.arange(n, dtype=np.int64) * (r + 1) + i
            (sym.local() if x is sym else xn)[...] = mine
            if stall[i] == r:
                t = time.perf_counter() + 200e-6  # busy: this rank falls behind
                while time.perf_counter() < t:
                    pass
            got = comm.all_reduce(x, out=out)
            if out is not None:
                assert got is out
            want = np.arange(n, dtype=np.int64) * (p * (p + 1) // 2) + i * p
            assert np.array_equal(np.asarray(got), want), (i, np.asarray(got)[:3], want[:3])
        assert comm.stats.calls - calls == 200
        assert sum((comm.stats.algorithms or {}).values()) - counts == 200
        if plan is not None and engine == "C":
            assert plan.fast is not None
            # (the first repeat, which makes the memo's C form, and the first call after the
            # plan was made, whose SIG word Python checks)
            assert runs[0] <= 2, runs
        elif plan is not None:
            assert runs[0] == 200
    finally:
        world.barrier()
        sym.close()
        sym_out.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("engine", ["C", "python"])
@pytest.mark.parametrize("form", ["numpy_new", "numpy_out", "sym_new", "sym_out"])
@pytest.mark.parametrize("kind", ["broadcast", "all_gather", "reduce_scatter"])
def test_the_same_family_call_again_replays_from_the_memo(
    monkeypatch: pytest.MonkeyPatch, kind: str, form: str, engine: str
) -> None:
    """As the all-reduce's: the same x, out and root or op call after call replays from the
    engine's memo of that kind, in C where built, one rank stalling now and then; every
    result exact (a broadcast without out into x itself), every call counted once."""
    use_engine(monkeypatch, engine)
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    n = 12  # (shards alike at 1-4 ranks: a symmetric out is the same size everywhere)
    lo, hi = shard_of(n, p, r)
    total = {"all_gather": n * p, "reduce_scatter": hi - lo}.get(kind, n)
    sym, sym_out = world.zeros(n, "int64"), world.zeros(total, "int64")
    xn, on = np.zeros(n, np.int64), np.zeros(total, np.int64)
    x: Any = sym if form.startswith("sym") else xn
    out: Any = {"numpy_out": on, "sym_out": sym_out}.get(form)
    extra: Any = {"broadcast": p - 1, "reduce_scatter": "sum"}.get(kind)
    call = getattr(comm, kind)
    args = () if extra is None else (extra,)
    stall = np.random.default_rng(9).integers(0, 2 * p, 150)
    try:
        call(x, *args, out=out)  # makes the plan and the memo
        plans: list[Any] = []
        runs = [0]
        if world.num_nodes == 1:
            assert comm.host_channel is not None
            plans = [v for v in comm.host_channel.plans.values() if v.where.endswith(kind)]
            for plan in plans:
                run = plan.run

                def counted(*a: Any, run: Any = run) -> None:
                    runs[0] += 1
                    run(*a)

                monkeypatch.setattr(plan, "run", counted)
        calls = comm.stats.calls
        for i in range(150):
            inputs = [np.arange(n, dtype=np.int64) * (q + 1) + i for q in range(p)]
            (sym.local() if x is sym else xn)[...] = inputs[r]
            if stall[i] == r:
                t = time.perf_counter() + 200e-6
                while time.perf_counter() < t:
                    pass
            got = call(x, *args, out=out)
            if kind == "broadcast":
                want = inputs[p - 1]
                assert got is (out if out is not None else x)
            elif kind == "all_gather":
                want = np.concatenate(inputs)
            else:
                want = np.sum(inputs, axis=0)[lo:hi]
            assert np.array_equal(np.asarray(got).reshape(-1), want), (i, got, want)
        assert comm.stats.calls - calls == 150
        if plans and engine == "C" and all(v.fast is not None for v in plans):
            assert runs[0] <= 2, runs  # (as the all-reduce's)
        elif plans and engine == "python":
            assert runs[0] == 150
    finally:
        world.barrier()
        sym.close()
        sym_out.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("kind", ["broadcast", "all_gather", "reduce_scatter"])
def test_the_family_replays_its_plans_up_to_their_limits(kind: str) -> None:
    """A node-local call up to its kind's plan limit (``FAMILY_PLAN_NBYTES``; the
    reduce-scatter's: ``NODE_PLAN_NBYTES``, the broadcast's ``BROADCAST_PLAN_NBYTES``) runs
    from a cached plan, and just above it the general path: exact results either way, in
    every form, on new data each call."""
    world = shmem.init(heap_nbytes="96MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    limits = {"reduce_scatter": NODE_PLAN_NBYTES, "broadcast": BROADCAST_PLAN_NBYTES}
    limit = limits.get(kind, FAMILY_PLAN_NBYTES)
    try:
        for nbytes, planned in ((limit, True), (limit + 4 * p, False)):
            n = nbytes // 4 // p * p  # (equal shards: a symmetric out of one size)
            lo, hi = shard_of(n, p, r)
            total = {"all_gather": n * p, "reduce_scatter": hi - lo}.get(kind, n)
            with world.zeros(n, "int32") as sym, world.zeros(total, "int32") as sym_out:
                on = np.zeros(total, np.int32)
                for i, form in enumerate(("numpy", "numpy_out", "sym", "sym_out", "in_place")):
                    if form == "in_place" and kind != "broadcast":
                        continue
                    inputs = [(np.arange(n, dtype=np.int32) % 1000) * (q + 1) + i for q in range(p)]
                    xn = inputs[r].copy()
                    sym.local()[...] = inputs[r]
                    x: Any = xn if form.startswith("numpy") else sym
                    out: Any = {"numpy_out": on, "sym_out": sym_out, "in_place": sym}.get(form)
                    if kind == "broadcast":
                        got, want = comm.broadcast(x, root=p - 1, out=out), inputs[p - 1]
                    elif kind == "all_gather":
                        got, want = comm.all_gather(x, out=out), np.concatenate(inputs)
                    else:
                        got, want = comm.reduce_scatter(x, out=out), np.sum(inputs, axis=0)[lo:hi]
                    assert np.array_equal(np.asarray(got).reshape(-1), want), (nbytes, form)
            ch = comm.host_channel
            if world.num_nodes == 1 and ch is not None:
                mine = [k for k in ch.plans if isinstance(k, tuple) and k[:2] == (kind, n)]
                assert bool(mine) == planned, (nbytes, list(ch.plans))
    finally:
        world.barrier()
        comm.close()
        world.finalize()


def test_a_memo_of_closed_buffers_or_an_old_scratch_is_not_replayed() -> None:
    """The memo's checks: after the scratch grew the same call is right; after its input or
    its symmetric out closed, every rank gets the general path's clear error, none hangs."""
    world = shmem.init(heap_nbytes="64MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    x, out = world.zeros(4, "int64"), world.zeros(4, "int64")
    try:
        for _ in range(3):
            x.local()[...] = r + 1
            comm.all_reduce(x, out=x)
        ch = comm.host_channel
        if ch is not None:  # the scratch grows (as a large call grows it: every rank)
            scratch = ch.scratch_buf
            ch.scratch(scratch.nbytes + 1)
            assert ch.scratch_buf is not scratch
        for _ in range(2):
            x.local()[...] = r + 1
            assert comm.all_reduce(x, out=x).local().tolist() == [p * (p + 1) // 2] * 4
        x.local()[...] = r + 1
        comm.all_reduce(x, out=out)
        out.close()
        with pytest.raises(shmem.ShmemStateError, match="all_reduce: out is a closed"):
            comm.all_reduce(x, out=out)
        x.close()
        with pytest.raises(shmem.ShmemStateError, match="all_reduce: x is a closed"):
            comm.all_reduce(x, out=x)
        world.barrier()
        assert comm.all_reduce(np.full(2, r + 1, np.int64)).tolist() == [p * (p + 1) // 2] * 2
    finally:
        world.barrier()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("engine", ["C", "python"])
@pytest.mark.parametrize("n", [1000, 100_000])
@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_small_low_precision_sums_replay_bitwise(
    monkeypatch: pytest.MonkeyPatch, op: str, name: str, n: int, engine: str
) -> None:
    """float16/bfloat16 sums and averages (and float32's) on one node replay from the cached
    plan, in C where built (accumulated in float32, rounded once to nearest even; up to 2 MiB
    there, in place shard by shard beyond 256 KiB): every call the definition's bits, in
    every form (numpy in, symmetric in, symmetric in place), a float16 sum that overflows
    (inf, numpy's warning) among them; in Python alike without the extension (up to 64 KiB)."""
    use_engine(monkeypatch, engine)
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=20.0)
    if world.num_nodes > 1:  # (there the order is each node's, then the nodes': the
        world.finalize()  # fixed-order test across nodes checks those bits)
        pytest.skip("one node's cached plan")
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    dt = SUPPORTED_DTYPES[name]
    sym = world.zeros(n, dt)
    try:
        calls = 60 if n == 1000 else 24
        for i in range(calls):
            inputs = [make_input(name, "sum", n, seed=i * p + k) for k in range(p)]
            if i == 12 and name == "float16" and p > 1 and op == "sum":
                for x in inputs:
                    x[5] = 40000.0  # the sum overflows float16: numpy's inf and warning
            mine = inputs[r]
            with np.errstate(over="ignore"):
                want = reference(inputs, op, name)
                if i % 3 == 0:
                    got = np.asarray(comm.all_reduce(mine, op=op))
                else:
                    sym.local()[...] = mine
                    if i % 3 == 1:
                        got = np.asarray(comm.all_reduce(sym, op=op))
                    else:
                        comm.all_reduce(sym, op=op, out=sym)
                        got = sym.local().copy()
            assert bits(got) == bits(want), (i, got[:4], want[:4])
        if engine == "C":  # the cached replay took the calls in C
            assert comm.host_channel is not None
            plan: Any = comm.host_channel.plans.get((n, dt, op))
            # (beyond 64 KiB only where the table picks the one-shot algorithm, and in place
            # there the calls share the work in Python: collectives.shards)
            assert plan is not None or n > 1000
            if plan is not None:
                assert plan.fast is not None
                assert sum(plan.fast.answers()) >= (59 if n == 1000 else 15), plan.fast.answers()
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("engine", ["C", "python"])
@pytest.mark.parametrize("kind", ["numpy", "symmetric", "mixed"])
@pytest.mark.parametrize("collective", ["broadcast", "all_gather", "reduce_scatter"])
def test_back_to_back_cached_family_calls(
    monkeypatch: pytest.MonkeyPatch, collective: str, kind: str, engine: str
) -> None:
    """Small broadcasts (every root in turn), all-gathers and reduce-scatters (3 elements:
    empty shards from 4 ranks) replay a cached plan like the small all-reduce, in C or in
    Python: each call's input changes, one rank stalls now and then, ranks mix numpy and
    zero-copy inputs; every result is exact, returned as the general path returns it (a
    broadcast into x itself by default)."""
    use_engine(monkeypatch, engine)
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    rng = np.random.default_rng(11)
    stall = rng.integers(0, p, 300)
    sym = world.zeros(3, "int64")
    try:
        for i in range(300):
            root = i % p
            mine = np.array([i, r, 7 * i + r], np.int64)
            use_sym = kind == "symmetric" or (kind == "mixed" and (i + r) % 3 == 0)
            if use_sym:
                sym.local()[:] = mine
            if stall[i] == r:
                t = time.perf_counter() + 200e-6
                while time.perf_counter() < t:
                    pass
            x: Any = sym if use_sym else mine
            if collective == "broadcast":
                got = comm.broadcast(x, root=root)
                assert got is x
                val = sym.local() if use_sym else mine
                assert val.tolist() == [i, root, 7 * i + root], (i, val.tolist())
            elif collective == "all_gather":
                got = comm.all_gather(x)
                want = [v for q in range(p) for v in (i, q, 7 * i + q)]
                assert got.shape == (3 * p,) and got.tolist() == want, (i, got.tolist())
            else:
                got = comm.reduce_scatter(x)
                lo, hi = shard_of(3, p, r)
                tri = p * (p - 1) // 2
                want = [p * i, tri, 7 * i * p + tri][lo:hi]
                assert got.tolist() == want, (i, got.tolist(), want)
        if world.num_nodes == 1:  # the cached replays ran
            ch = comm.host_channel
            assert ch is not None
            plans = [v for k, v in ch.plans.items() if isinstance(k, tuple) and k[0] == collective]
            assert plans and all((v.fast is None) == (engine == "python") for v in plans)
            answers = [v.fast.answers() for v in plans if v.fast is not None]
            assert engine == "python" or sum(sum(a) for a in answers) >= 299 - len(plans)
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


def test_cached_family_calls_take_every_out_the_general_path_takes() -> None:
    """The replayed broadcast and all-gather return what the general path returns, for
    every form of ``out``, and leave to the general path what they do not take."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    sym = world.zeros((2, 2), "float32")
    try:
        for _ in range(3):  # the first call makes each plan, the others replay it
            x = np.full((2, 2), r + 1, np.float32)
            assert comm.broadcast(x, root=p - 1) is x and (x == p).all()
            out = np.empty((2, 2), np.float32)
            x = np.full((2, 2), r + 1, np.float32)
            assert comm.broadcast(x, p - 1, out) is out and (out == p).all() and (x == r + 1).all()
            sym.local()[...] = r + 1
            assert comm.broadcast(sym, root=0) is sym and (sym.local() == 1).all()
            g = comm.all_gather(np.full((2, 2), r, np.float32))
            want = np.repeat(np.arange(p, dtype=np.float32), 4)
            assert g.shape == ((2, 2) if p == 1 else (4 * p,)) and (g.reshape(-1) == want).all()
            sym.local()[...] = r
            flat_out = np.empty(4 * p, np.float32)
            assert comm.all_gather(sym, out=flat_out) is flat_out and (flat_out == want).all()
            lo, hi = shard_of(4, p, r)
            rs = comm.reduce_scatter(np.full((2, 2), r + 1, np.float32))
            assert rs.shape == ((2, 2) if p == 1 else (hi - lo,))
            assert (rs == p * (p + 1) // 2).all()
            sym.local()[...] = r + 1
            mine = sym.local().reshape(-1)[lo:hi]  # out over my own input, peers read it
            assert comm.reduce_scatter(sym, out=mine) is mine and (mine == p * (p + 1) // 2).all()
            ro = np.full((2, 2), r + 1, np.float32)
            ro.flags.writeable = False  # broadcast into a read-only x: refused, nothing moved
            with pytest.raises(ArgumentError):
                comm.broadcast(ro, root=0)
            with pytest.raises(ArgumentError):
                comm.all_gather(x, out=np.empty(4 * p + 1, np.float32))
            strided = np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::2]
            with pytest.raises(ArgumentError):
                comm.broadcast(strided, root=0)
        if world.num_nodes == 1:  # (across nodes the family runs over MPI: not counted)
            algos = comm.stats.algorithms
            assert algos is not None and algos["broadcast"] == 9 and algos["all_gather"] == 6
            assert algos["reduce_scatter"] == 6
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_nans_and_flagged_floats_give_numpys_bits_on_every_rank(name: str) -> None:
    """Different NaNs on different ranks (and inf - inf, overflow): which NaN a sum keeps is
    numpy's choice, so every rank must get numpy's bits whether its replay ran in C or in
    Python (rank 0 passes a strided view: the Python replay). Found in review: the C loop
    kept the other NaN, and two ranks disagreed."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    r = world.rank
    dt = np.dtype(name)
    bits = np.uint32 if dt.itemsize == 4 else np.uint64
    top = 0x7FC00000 if dt.itemsize == 4 else 0x7FF8000000000000
    sign = 0x80000000 if dt.itemsize == 4 else 1 << 63
    try:
        for i in range(20):
            nan = np.array([top + r + 1 + i + (sign if r % 2 else 0)], bits).view(dt)[0]
            big = np.finfo(dt).max
            vals = [nan, np.inf if r == 0 else -np.inf, big, 1.0 + r]
            base = np.array(vals * 2, dt)
            x = base[::2] if r == 0 and i % 2 else base[:4].copy()
            with np.errstate(all="ignore"):
                got = comm.all_reduce(x)
                every = world.comm.allgather(np.ascontiguousarray(x))
                want = every[0].copy()
                for y in every[1:]:
                    want = want + y
            assert len(set(world.comm.allgather(got.tobytes()))) == 1, i
            assert got.tobytes() == want.tobytes(), (i, got, want)
    finally:
        world.barrier()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("count", [3, 1000])
def test_a_cached_call_whose_out_is_its_own_symmetric_input(count: int) -> None:
    """``all_reduce(sym, out=sym.local())``: peers read my SHMEMBuffer until their DONE, so
    the result goes aside and into it after (before the fix the replay wrote it in place:
    149-290 of 300 results were wrong at 2 ranks, found in review)."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    sym = world.zeros(count, "int64")
    try:
        for i in range(300):
            sym.local()[:] = i + r
            got = comm.all_reduce(sym, "sum", out=sym.local())
            assert (got == p * i + p * (p - 1) // 2).all(), i
            assert (sym.local() == p * i + p * (p - 1) // 2).all(), i
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("name", ["float32", "float64", "int64", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_small_calls_across_nodes_are_the_fixed_order(name: str, op: str) -> None:
    """The cached plan across nodes (uniform nodes, the defaults) gives, bitwise, the fixed
    order every path promises: each node's ranks in rank order, then the nodes in order."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    try:
        if world.num_nodes == 1 or len({n for n, _ in world.comm.allgather((world.node, 0))}) < 2:
            pytest.skip("needs several nodes (SHMEM_HEAP_NODE_SPLIT)")
        dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        if name == "int64" and op == "avg":
            pytest.skip("covered by the integer average tests")
        rng = np.random.default_rng(world.rank)
        for count in (1, 7, 1000):
            raw = rng.standard_normal(count) * 100
            x = raw.astype(dt)
            got = comm.all_reduce(x, op=op)
            every = world.comm.allgather((world.node, world.rank, x))
            acc = np.dtype(np.float32) if name == "bfloat16" else dt
            ufunc = {"sum": np.add, "avg": np.add, "max": np.maximum}[op]
            partials = []
            for node in sorted({n for n, _, _ in every}):
                mine = [a.astype(acc) for n, _, a in sorted(every, key=lambda e: e[1]) if n == node]
                part = mine[0].copy()
                for a in mine[1:]:
                    part = ufunc(part, a)
                partials.append(part)
            want = partials[0].copy()
            for part in partials[1:]:
                want = ufunc(want, part)
            if op == "avg":
                want = np.divide(want, acc.type(world.world_size))
            want = want.astype(dt)
            assert np.asarray(got).tobytes() == want.tobytes(), (count, got, want)
        if world.config.heap.node_split == "rank" or world.num_nodes > 1:
            assert comm.stats.algorithms and comm.stats.algorithms.get("hierarchical", 0) > 0
    finally:
        comm.close()
        world.finalize()


@pytest.fixture(params=[False, True], ids=["defaults", "check_args"])
def plain(request: pytest.FixtureRequest) -> Iterator[tuple[World, Any]]:
    """A World and Communicator with the default settings (the cached replays run), and
    with check_args on (as configs/ci.toml: they do not)."""
    w = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0, collectives_check_args=request.param)
    c = collectives.Communicator(w)
    yield w, c
    c.close()
    w.finalize()


def test_fast_path_switches_shapes_buffers_and_outs(plain: tuple[World, Any]) -> None:
    """The fast path remembers the last plan, zero-copy buffer and out it saw: every switch
    (count, dtype, op, buffer, out, a closed buffer, a wrong out) must still be honoured."""
    world, comm = plain
    p, r = world.world_size, world.rank
    tri = p * (p + 1) // 2
    a = world.zeros(4, "float32")
    b = world.zeros(4, "float32")
    a.local()[...] = r + 1
    b.local()[...] = 10 * (r + 1)
    out4 = np.empty(4, np.float32)
    other = np.empty(4, np.float32)
    for _ in range(3):
        assert (comm.all_reduce(a, out=out4) == tri).all()
        assert (comm.all_reduce(b, out=out4) == 10 * tri).all()
        assert (comm.all_reduce(a, out=other) == tri).all()
        # the same count in float64, with bits float32 would drop: not the float32 plan
        wide = comm.all_reduce(np.full(4, r + 1 + 2.0**-30, np.float64))
        assert wide.dtype == np.float64 and (wide == tri + p * 2.0**-30).all()
        assert (comm.all_reduce(np.full(4, r + 1, np.float32), op="max") == p).all()
        assert (comm.all_reduce(np.full(5, r + 1, np.float32)) == tri).all()
        got = comm.all_reduce(np.full((2, 2), r + 1, np.float32), out=out4.reshape(2, 2))
        assert got.shape == (2, 2) and (got == tri).all()
    with pytest.raises(ArgumentError):
        comm.all_reduce(a, out=np.empty(3, np.float32))  # refused before any flag
    ro = np.empty(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ArgumentError):
        comm.all_reduce(a, out=ro)
    a.close()
    with pytest.raises(ShmemError):
        comm.all_reduce(a, out=out4)  # the remembered buffer is closed now
    assert (comm.all_reduce(b, out=out4) == 10 * tri).all()  # and the communicator works
    b.close()


def test_more_shapes_than_the_plan_cache_holds(plain: tuple[World, Any]) -> None:
    """Plans beyond the cache's size are dropped (across nodes: their persistent MPI
    requests freed) and made again: every result stays right, the remembered plan too."""
    world, comm = plain
    from collectives.replay import MAX_PLANS

    p, r = world.world_size, world.rank
    tri = p * (p + 1) // 2
    counts = list(range(1, MAX_PLANS + 10))
    for _ in range(2):
        for n in counts + counts[:3]:
            got = comm.all_reduce(np.full(n, r + 1, np.float32))
            assert got.shape == (n,) and (got == tri).all()
            again = comm.all_reduce(np.full(n, r + 1, np.int64), op="max")
            assert (again == p).all()
    assert len(comm.host_channel.plans) <= MAX_PLANS


def test_the_c_replay_is_built_where_it_can_be() -> None:
    """The editable install builds collectives._replay when a C compiler and Python's headers
    are there (CI has both): a silent fall back to the Python replay would go unnoticed (its
    tests skip without it)."""
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not headers or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler or Python headers: the Python replay is expected")
    assert replay_status() == "C", replay_status()


@pytest.mark.parametrize(
    ("late", "zero_copy", "answer"),
    [("before", False, 2), ("finish", True, 3), ("finish", False, 1)],
    ids=["ready", "done-zero-copy", "previous-done"],
)
def test_the_c_replay_hands_a_late_peer_to_the_python_replay(
    monkeypatch: pytest.MonkeyPatch, late: str, zero_copy: bool, answer: int
) -> None:
    """The last rank replays in Python and is 2 ms late at one step: before its call (its
    READY), or between READY and DONE (its DONE, which a zero-copy input waits for and the
    next call needs before it overwrites a stage). The other ranks' C replays hand each call
    to the Python replay at that step (Replay.answers counts it), and every result is exact."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    n = 256 if zero_copy else 3  # (a zero-copy input up to STAGE_SMALL bytes is staged)
    sym = world.zeros(n, "int64")
    try:
        if p == 1 or world.num_nodes > 1 or replay_status() != "C":
            pytest.skip("needs two ranks on one node and the C replay")
        comm.all_reduce(np.zeros(n, np.int64))  # makes the plan (numpy and symmetric share it)
        assert comm.host_channel is not None
        plan: Any = comm.host_channel.plans[(n, np.dtype(np.int64), "sum")]
        slow = r == p - 1
        if slow:
            plan.fast.close()
            plan.fast = None
            finish = plan.finish

            def late_finish(*args: Any) -> None:
                time.sleep(0.002)
                finish(*args)

            if late == "finish":
                monkeypatch.setattr(plan, "finish", late_finish)
        before = None if slow else plan.fast.answers()
        for i in range(1, 21):
            mine = np.zeros(n, np.int64)
            mine[:3] = [i * (r + 1), i, r + 1]
            if zero_copy:
                sym.local()[:] = mine
            if slow and late == "before":
                time.sleep(0.002)
            got = comm.all_reduce(sym if zero_copy else mine)
            tri = p * (p + 1) // 2
            assert np.asarray(got).tolist() == [i * tri, i * p, tri] + [0] * (n - 3), i
        if before is not None:
            # At which step the C replay hands over depends on timing (under load a late DONE
            # also makes the next READY late): checked is that calls were handed over, and
            # (above) that every result is exact; ``answer`` names the step expected when the
            # machine is idle, as a hint in the message.
            after = plan.fast.answers()
            assert sum(after[1:]) > sum(before[1:]), (answer, before, after)
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


def test_closing_a_communicator_releases_everything_it_held(plain: tuple[World, Any]) -> None:
    """After the fast path ran (it remembers its plan, whose views reach the scratch and
    the flags), close() must leave the heap as it found it: nothing held, nothing used."""
    world, comm = plain
    comm.close()
    before = world.heap_stats()
    other = collectives.Communicator(world)
    for n in (1, 2, 100):
        other.all_reduce(np.ones(n, np.float32))
        sym = world.zeros(n, "float32")
        other.all_reduce(sym)
        sym.close()
    other.close()
    after = world.heap_stats()
    assert after.held == 0 and after.used == before.used, (before, after)


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32"])
def test_all_reduce_out_dtype_and_scale(world: World, comm: Any, name: str, op: str) -> None:
    """Issue 17's fused options on the host backend: the rank-order reduction in the
    accumulation dtype, times ``scale`` there, rounded once to ``out_dtype`` (for a 16-bit
    input with float32 out: no rounding to the input type on the way). Across nodes the
    partials are summed per node first: compared within float32's tolerance there."""
    p, r = world.world_size, world.rank

    def same(got: Any, want: Any) -> None:
        if world.num_nodes == 1:
            assert bits(got) == bits(want)
        else:
            np.testing.assert_allclose(
                np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-5, atol=1e-6
            )

    dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    inputs = [make_input(name, op, 1001, seed) for seed in range(p)]
    acc = np.dtype(np.float32)
    wide = [a.astype(acc) for a in inputs]
    expect = np.empty(1001, acc)
    collectives.ops.reduce_into(expect, wide, op, acc, avg_count=p)
    scale = 1.0 / (p + 2)
    scaled = expect * acc.type(scale)
    for out_dtype in (np.float32, np.float64, None):
        odt = dt if out_dtype is None else np.dtype(out_dtype)
        got = comm.all_reduce(inputs[r], op=op, out_dtype=out_dtype, scale=scale)
        assert got.dtype == odt and got.shape == (1001,)
        same(got, scaled.astype(odt))
    got = comm.all_reduce(inputs[r], op=op, out_dtype=np.float32)  # no scale: unrounded
    same(got, expect)
    out = np.empty(1001, np.float32)
    assert comm.all_reduce(inputs[r], op=op, out=out, out_dtype="float32", scale=scale) is out
    same(out, scaled)
    with world.zeros(1001, name) as sym:
        sym.local()[:] = inputs[r]
        world.barrier()
        got = comm.all_reduce(sym, op=op, out_dtype="float32", scale=scale)
        same(got, scaled)
        world.barrier()


def test_all_reduce_fused_options_refuse_bad_input(world: World, comm: Any) -> None:
    x = np.ones(4, np.float32)
    cases = [
        (dict(x=np.ones(4, np.int32), scale=0.5), "floating-point inputs"),
        (dict(x=x, out_dtype="int32"), "invalid out_dtype"),
        (dict(x=x, out_dtype="complex64"), "invalid out_dtype"),
        (dict(x=x, scale=float("nan")), "invalid scale"),
        (dict(x=x, scale="2"), "invalid scale"),
        (dict(x=x, out_dtype="float32", out=np.empty(4, np.float64)), "invalid out"),
        (dict(x=x, out_dtype="float32", op="band"), "needs an integer"),
    ]
    for kwargs, message in cases:
        with pytest.raises((CollectiveArgumentError, OpError), match=message):
            comm.all_reduce(**kwargs)
    for bad in (dict(x=np.array([object()]), scale=2.0), dict(x=x, scale=10**400)):
        with pytest.raises(ArgumentError):  # clear errors, not KeyError or OverflowError
            comm.all_reduce(**bad)
    out = np.zeros((2, 2), np.float32, order="F")  # any layout of out receives the result
    assert comm.all_reduce(x.reshape(2, 2), out=out, scale=3.0) is out
    assert (out == 3 * world.world_size).all()
    # nothing moved: a correct call still works on every rank
    assert (comm.all_reduce(x, scale=2.0) == 2 * world.world_size).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("count", [5, 40_000])
def test_reduce_scatter_is_the_all_reduces_shard_bitwise(
    world: World, comm: Any, dtype: str, count: int
) -> None:
    """On every layout (one node, one rank per node, nodes of different sizes, 2 x 2) and on
    both sides of the size where the exchange between nodes changes: reduce_scatter's shard
    is bitwise the all-reduce's elements, for sums and averages of values whose rounding
    depends on the order."""
    p, r = world.world_size, world.rank
    rng = np.random.default_rng(7 + r)
    x = (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(as_dtype(dtype))
    lo, hi = shard_of(count, p, r)
    for op in ("sum", "avg"):
        full = np.asarray(comm.all_reduce(x, op=op))
        part = np.asarray(comm.reduce_scatter(x, op=op))
        assert part.tobytes() == full[lo:hi].tobytes(), op
        assert len(set(world.comm.allgather(full.tobytes()))) == 1, op


@pytest.mark.parametrize("kind", ["numpy", "symmetric"])
def test_small_family_across_nodes_from_a_cached_plan(kind: str) -> None:
    """Across nodes, with the default configuration (no check_args), small family calls
    replay a cached persistent all-gather (``collectives.cross_plan``): every call of a
    shape after the first comes from the plan, the results are exact for every form of
    ``out`` (new, given, in place), and the reduce-scatter's shard is bitwise the
    all-reduce's where both reduce in rank order (values whose rounding depends on it)."""
    from collectives.cross_plan import CrossPlan

    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    p, r = world.world_size, world.rank
    sym = world.zeros(6 * p, "float32")
    try:
        if world.num_nodes == 1:
            pytest.skip("needs several nodes (SHMEM_HEAP_NODE_SPLIT)")
        ch = comm.host_channel
        assert ch is not None
        rank_order = len(ch.local_peers) == 1 or not ch.uniform_nodes
        rng = np.random.default_rng(3 + r)
        for i in range(6):
            mine = (rng.standard_normal(6 * p) * 10.0 ** rng.integers(-3, 4, 6 * p)).astype(
                np.float32
            )
            x: Any = mine
            if kind == "symmetric":
                sym.local()[:] = mine
                x = sym
            inputs = world.comm.allgather(mine)
            got = comm.all_gather(x)
            assert got.tobytes() == np.concatenate(inputs).tobytes(), i
            out = np.empty(6 * p * p, np.float32)
            assert comm.all_gather(x, out=out) is out and out.tobytes() == got.tobytes()
            root = i % p
            y = mine.copy()
            assert comm.broadcast(y, root=root) is y and y.tobytes() == inputs[root].tobytes()
            want = np.concatenate([a.reshape(p, -1)[r] for a in inputs])
            assert comm.all_to_all(x).tobytes() == want.tobytes(), i
            z = mine.copy()
            assert comm.all_to_all(z, out=z) is z and z.tobytes() == want.tobytes()
            lo, hi = shard_of(6 * p, p, r)
            for op in ("sum", "avg"):
                part = np.asarray(comm.reduce_scatter(x, op=op))
                full = np.asarray(comm.all_reduce(mine, op=op))
                if rank_order:
                    assert part.tobytes() == full[lo:hi].tobytes(), (i, op)
                else:
                    np.testing.assert_allclose(part, full[lo:hi], rtol=1e-5, atol=1e-30)
        kinds = {v.kind for v in ch.plans.values() if isinstance(v, CrossPlan)}
        want_kinds = {"all_gather", "broadcast", "all_to_all"} | (
            {"reduce_scatter"} if rank_order else set()
        )
        assert kinds == want_kinds, kinds
    finally:
        world.barrier()
        sym.close()
        comm.close()
        world.finalize()


@pytest.mark.parametrize(("name", "op"), [("float32", "sum"), ("int64", "max"), ("float16", "sum")])
def test_in_place_shares_the_work_from_the_cached_plans(
    plain: tuple[World, Any], name: str, op: str
) -> None:
    """In place above SHARE_MIN runs shard by shard from the cached plans too (the C replay
    hands such a call to Python: a SRC word with SHARES set is never one it expects):
    bitwise the numpy form's result call after call (the general path makes the plan, the
    fast path and its memo replay it), with every rank in place, with the forms mixed in
    one call, and with no rank in place right after (the C replay again); in place stages
    nothing."""
    world, comm = plain
    isz = np.dtype(SUPPORTED_DTYPES[name]).itemsize
    for count in ((SHARE_MIN + (32 << 10)) // isz + 3, (1 << 20) // isz):  # to the plans'
        x = make_input(name, op, count, seed=world.rank + 5)
        want = comm.all_reduce(x, op=op)
        check_result(world, want, world.comm.allgather(x), op, name, world.num_nodes == 1)
        with world.zeros(count, name) as sym, world.zeros(count, name) as other:
            for trial in range(3):
                for form in ("in_place", "mixed", "sym_out", "numpy"):
                    sym.local()[...] = x
                    staged = comm.stats.staged_bytes
                    mine = (
                        form
                        if form != "mixed"
                        else ("in_place", "numpy", "sym_out")[world.rank % 3]
                    )
                    if mine == "in_place":
                        comm.all_reduce(sym, op=op, out=sym)
                        got = np.asarray(sym.local())
                    elif mine == "numpy":
                        got = comm.all_reduce(x, op=op)
                    else:
                        comm.all_reduce(sym, op=op, out=other)
                        got = np.asarray(other.local())
                    assert got.tobytes() == want.tobytes(), (count, trial, form)
                    if form == "in_place" and world.num_nodes == 1:
                        assert comm.stats.staged_bytes == staged, "in place stages nothing"
