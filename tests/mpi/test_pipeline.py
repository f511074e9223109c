"""One collective call, one pipeline (:mod:`collectives.pipeline`, issue 43): every call of the
family takes exactly one sequence number of its channel, whatever route it runs (its shape's
cached plan, the node-local exchange, point to point between nodes, one signed MPI exchange
beyond the scratch) and whatever form its arguments take, and gives the right result; only a
reduce-scatter that runs as the all-reduce (across uniform nodes of several ranks, or beyond
the scratch) takes the all-reduce's. A guarantee applied twice (a second ``begin``, a
``next_call`` left in a route) would take two and fail here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from shmem import World
from tests.mpi.test_plan_cache import FORMS, _call, _expected

pytestmark = pytest.mark.mpi

FAMILY = ("reduce_scatter", "all_gather", "broadcast", "all_to_all")
SCRATCH = 256 << 10
# bytes per input: a cached plan's (<= 64 KiB here: PLANS_UP_TO), the general node-local
# exchange's (above the plans, within the scratch), beyond the scratch (one signed MPI
# exchange on one node)
SIZES = {"plan": 64, "exchange": 96 << 10, "beyond": 512 << 10}
PLANS_UP_TO = 64 << 10


@pytest.fixture(autouse=True)
def small_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The family's cached plans only up to :data:`PLANS_UP_TO` (their limits exceed the
    capped scratch), so that the "exchange" size runs the general node-local route."""
    import collectives.family
    import collectives.reduce_scatter
    from collectives.allreduce_plans import shard_plan

    def small_shard_plan(ch: Any, xin: Any, *args: Any) -> Any:
        if xin.count * xin.dtype.itemsize > PLANS_UP_TO:
            return None
        return shard_plan(ch, xin, *args)

    monkeypatch.setattr(collectives.family, "FAMILY_PLAN_NBYTES", PLANS_UP_TO)
    monkeypatch.setattr(collectives.family, "BROADCAST_PLAN_NBYTES", PLANS_UP_TO)
    monkeypatch.setattr(collectives.reduce_scatter, "shard_plan", small_shard_plan)


@pytest.fixture(scope="module")
def capped() -> Iterator[tuple[World, Any]]:
    """Defaults, with the scratch capped at 256 KiB."""
    world = shmem.init(
        heap_nbytes="32MiB",
        signal_timeout_s=20.0,
        collectives_scratch_nbytes="256KiB",
        collectives_scratch_max_nbytes="256KiB",
    )
    comm = collectives.Communicator(world)
    yield world, comm
    comm.close()
    world.finalize()


def _delegated(world: World, comm: Any, kind: str, nbytes: int) -> bool:
    """Whether ``kind`` runs as the all-reduce here (the reduce-scatter's rule)."""
    ch = comm.host_channel
    if kind != "reduce_scatter":
        return False
    if ch.num_nodes > 1:
        return len(ch.local_peers) > 1 and ch.uniform_nodes
    return nbytes > SCRATCH


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", FAMILY)
def test_one_call_takes_one_sequence_number(
    capped: tuple[World, Any], kind: str, form: str, size: str
) -> None:
    world, comm = capped
    p = world.world_size
    count = max(p, SIZES[size] // 4 // p * p)  # int32, a multiple of p (all_to_all's rule)
    ch = comm.host_channel
    for salt in range(3):  # the first call of a shape makes its plan, the next replay it
        before = ch.seq
        got = _call(world, comm, kind, form, count, salt)
        taken = ch.seq - before
        want = _expected(kind, p, world.rank, count, salt)
        assert got.tobytes() == want.tobytes(), (kind, form, size, salt)
        if _delegated(world, comm, kind, count * 4):
            assert taken >= 1, (kind, form, size, salt, taken)
        else:
            assert taken == 1, (kind, form, size, salt, taken)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ("all_reduce", *FAMILY))
def test_a_small_call_in_every_form_replays_from_the_fast_path(
    capped: tuple[World, Any], kind: str, form: str
) -> None:
    """Issue 44: after the call that made a small shape's plan, the engine replays it in
    every form a user writes (numpy or symmetric in; a new array, numpy ``out=``,
    symmetric ``out=``, in place) without the general path's agreement (which counts
    ``Channel.calls``), and the result stays right. (All-to-all has no cached plan on one
    node.)"""
    world, comm = capped
    p = world.world_size
    ch = comm.host_channel
    if kind == "all_to_all" and ch.num_nodes == 1:
        pytest.skip("all_to_all has no cached plan on one node")
    if kind == "reduce_scatter" and _delegated(world, comm, kind, 0):
        # (issue 44, still open: across uniform nodes of several ranks the reduce-scatter
        # runs as the all-reduce, whose cached plan only its general path finds)
        pytest.skip("the reduce-scatter runs as the all-reduce here: no fast path of its own")
    if kind == "all_reduce" and not ch.uniform_nodes:
        # (issue 44, still open: across nodes of different sizes the all-reduce reduces in
        # rank order through its general path every call)
        pytest.skip("nodes of different sizes: the all-reduce has no cached plan")
    count = 4 * p  # 16 bytes a rank: a cached plan's size
    _call(world, comm, kind, form, count, 0)  # makes the plan (the general path)
    agreed = ch.calls
    for salt in (1, 2):
        got = _call(world, comm, kind, form, count, salt)
        want = _expected(kind, p, world.rank, count, salt)
        assert got.tobytes() == want.tobytes(), (kind, form, salt)
    assert ch.calls == agreed, f"{kind} {form}: {ch.calls - agreed} calls took the general path"


@pytest.mark.parametrize("count", [1, 4, 1000])  # 4 B to 4 KiB a rank (size classes apart)
@pytest.mark.parametrize("kind", ("all_reduce", *FAMILY))
def test_a_small_call_across_nodes_replays_in_one_exchange(
    capped: tuple[World, Any], kind: str, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44, point 2: a cached small call across nodes exchanges once between nodes (its
    signature travels with its data, ``collectives.signed.PeerGather``): no signature
    all-gather before it (``_headers_agree``, made to fail here), and the result is right
    at every size class."""
    from collectives import signed

    world, comm = capped
    p = world.world_size
    ch = comm.host_channel
    if ch.num_nodes == 1 or ch.cross is None:
        pytest.skip("needs several nodes (SHMEM_HEAP_NODE_SPLIT)")
    if kind == "reduce_scatter" and _delegated(world, comm, kind, 0):
        pytest.skip("the reduce-scatter runs as the all-reduce here: no fast path of its own")
    if kind == "all_reduce" and not ch.uniform_nodes:
        pytest.skip("nodes of different sizes: the all-reduce has no cached plan (rank order)")
    n = count * p
    _call(world, comm, kind, "numpy", n, 0)  # makes the plan (the general path)

    def second_round(*args: object) -> bool:
        raise AssertionError("a signature round before a cached exchange between nodes")

    monkeypatch.setattr(signed, "_headers_agree", second_round)
    for form in FORMS:
        for salt in (1, 2):
            got = _call(world, comm, kind, form, n, salt)
            want = _expected(kind, p, world.rank, n, salt)
            assert got.tobytes() == want.tobytes(), (kind, form, salt)


@pytest.mark.parametrize(
    ("dtype", "op"), [("float32", "avg"), ("float16", "sum"), ("int32", "avg"), ("float64", "max")]
)
def test_a_cached_all_reduce_across_nodes_in_every_form_and_dtype(
    capped: tuple[World, Any], dtype: str, op: str
) -> None:
    """The cached all-reduce across nodes (one rank per node: no node-local exchange at all)
    in every form, a dtype accumulated wider (float16) and the averages: the same result as
    the reduction in node order, in place too, call after call."""
    world, comm = capped
    p, r = world.world_size, world.rank
    if comm.host_channel.num_nodes == 1 or not comm.host_channel.uniform_nodes:
        pytest.skip("needs uniform nodes (SHMEM_HEAP_NODE_SPLIT)")
    n = 37
    acc = np.dtype(np.float32 if dtype == "float16" else dtype).type

    def data(q: int, salt: int) -> np.ndarray[Any, Any]:
        return ((np.arange(n) * 3 + q * 5 + salt) % 17).astype(dtype)

    def want(salt: int) -> np.ndarray[Any, Any]:
        rows = [data(q, salt).astype(acc) for q in range(p)]
        if op == "max":
            return np.asarray(np.maximum.reduce(rows)).astype(dtype)
        total = np.add.reduce(rows)
        if op == "avg":
            total = total // p if np.dtype(dtype).kind == "i" else total / acc(p)
        return np.asarray(total).astype(dtype)

    sym = world.zeros(n, dtype)
    out = world.zeros(n, dtype)
    try:
        for salt in range(4):
            x = data(r, salt)
            sym.local()[...] = x
            got = [
                comm.all_reduce(x, op),
                comm.all_reduce(x, op, out=np.empty(n, dtype)),
                comm.all_reduce(sym, op),
                np.array(comm.all_reduce(sym, op, out=out).local()),
            ]
            sym.local()[...] = x
            got.append(np.array(comm.all_reduce(sym, op, out=sym).local()))
            for form, g in enumerate(got):
                np.testing.assert_allclose(
                    np.asarray(g, np.float64), want(salt).astype(np.float64), rtol=1e-3,
                    err_msg=f"form {form}, salt {salt}",
                )  # fmt: skip
    finally:
        sym.close()
        out.close()


# 1.2 MiB and 4 MiB a rank: beyond the one-round plan (collectives.allreduce_plans.
# whole_gather_limit) at 2 to 8 nodes, and in several pieces (the scratch is capped)
@pytest.mark.parametrize("count", [300_001, 1_000_000])
def test_a_large_all_reduce_across_nodes_replays_from_the_fast_path(
    capped: tuple[World, Any], count: int
) -> None:
    """Issue 44, point 2: across nodes of one rank each a large all-reduce replays its
    cached plan (``collectives.allreduce_plans.AcrossPlan``) in every form, without the
    general path's agreement (``Channel.calls``), with the general path's result."""
    world, comm = capped
    ch = comm.host_channel
    if ch.num_nodes == 1 or len(ch.local_peers) != 1 or not ch.uniform_nodes:
        pytest.skip("needs nodes of one rank each (SHMEM_HEAP_NODE_SPLIT=rank)")
    p = world.world_size
    _call(world, comm, "all_reduce", "numpy", count, 0)  # makes the plan (the general path)
    agreed = ch.calls
    for form in FORMS:
        for salt in (1, 2):
            got = _call(world, comm, "all_reduce", form, count, salt)
            want = _expected("all_reduce", p, world.rank, count, salt)
            assert got.tobytes() == want.tobytes(), (form, salt)
    assert ch.calls == agreed, f"{ch.calls - agreed} calls took the general path"


def test_the_same_arguments_again_replay_with_their_new_contents(capped: tuple[World, Any]) -> None:
    """Issue 44: a call with the very objects of the last one (the loop every benchmark and
    training step runs) replays from the engine's memo of them: each call still reads its
    input's current contents and writes its output, in every form (a non-contiguous numpy
    input too, copied anew each call), and a buffer closed in between is refused, not
    written."""
    from shmem.errors import ShmemError

    world, comm = capped
    p, r = world.world_size, world.rank
    n = 6 * p
    x = np.zeros(n, np.int32)
    wide = np.zeros(2 * n, np.int32)
    strided = wide[::2]  # a non-contiguous input
    out = np.empty(n, np.int32)
    sym, sym_out = world.zeros(n, "int32"), world.zeros(n, "int32")
    try:
        for salt in range(4):
            data = (np.arange(n) * (salt + 1) + r) % 97
            want = np.sum([(np.arange(n) * (salt + 1) + q) % 97 for q in range(p)], axis=0)
            x[...] = data
            strided[...] = data
            sym.local()[...] = data
            got = {
                "numpy new": comm.all_reduce(x),
                "numpy out": np.array(comm.all_reduce(x, out=out)),
                "strided": comm.all_reduce(strided),
                "sym new": comm.all_reduce(sym),
                "sym out": np.array(comm.all_reduce(sym, out=sym_out).local()),
            }
            sym_out.local()[...] = data
            got["in place"] = np.array(comm.all_reduce(sym_out, out=sym_out).local())
            for form, g in got.items():
                assert np.array_equal(np.asarray(g).reshape(-1), want), (form, salt)
        closed = world.zeros(n, "int32")
        comm.all_reduce(sym, out=closed)
        comm.all_reduce(sym, out=closed)  # (the memo's)
        closed.close()
        with pytest.raises(ShmemError):
            comm.all_reduce(sym, out=closed)
    finally:
        sym_out.close()
        sym.close()


@pytest.mark.parametrize("kind", FAMILY)
def test_the_same_family_arguments_again_read_their_new_contents(
    capped: tuple[World, Any], kind: str
) -> None:
    """Issue 44: the family's memo of its last replay (the same x, out and root or op
    again) still reads each call's input and writes its output, in every form."""
    world, comm = capped
    p, r = world.world_size, world.rank
    ch = comm.host_channel
    if kind == "all_to_all" and ch.num_nodes == 1:
        pytest.skip("all_to_all has no cached plan on one node")
    count = 4 * p
    n_out = count * p if kind == "all_gather" else count // p if kind == "reduce_scatter" else count
    args: tuple[Any, ...] = (0,) if kind == "broadcast" else ()
    call = getattr(comm, kind)
    x = np.zeros(count, np.int32)
    out = np.empty(n_out, np.int32)
    sym, sym_out = world.zeros(count, "int32"), world.zeros(n_out, "int32")
    try:
        for salt in range(4):
            x[...] = (np.arange(count) * 7 + r * 13 + salt) % 101
            sym.local()[...] = x
            want = _expected(kind, p, r, count, salt)
            got = {
                "numpy new": call(x.copy() if kind == "broadcast" else x, *args),
                "numpy out": np.array(call(x, *args, out=out)),
                "sym out": np.array(call(sym, *args, out=sym_out).local()),
            }
            if kind != "broadcast":  # (a broadcast into its own input is the in-place form)
                got["sym new"] = call(sym, *args)
            else:  # into x itself, the same x each call
                got["numpy in place"] = np.array(call(x, *args))
            for form, g in got.items():
                assert np.asarray(g).reshape(-1).tobytes() == want.tobytes(), (form, salt)
    finally:
        sym_out.close()
        sym.close()


@pytest.mark.parametrize("size", ["plan", "exchange"])
def test_a_broadcast_stages_only_the_roots_input(capped: tuple[World, Any], size: str) -> None:
    """Issue 44: a broadcast reads the root's input only, so a non-root's input, numpy or
    symmetric, is never staged (and in place it is no hazard); every root in turn, cached
    plan and general exchange."""
    world, comm = capped
    p, r = world.world_size, world.rank
    ch = comm.host_channel
    if ch.num_nodes > 1:
        pytest.skip("between nodes a broadcast moves point to point (no node-local stage)")
    count = SIZES[size] // 4
    x = np.empty(count, np.int32)
    sym = world.zeros(count, "int32")
    try:
        for root in range(p):
            for form in ("numpy", "symmetric"):
                x[...] = np.arange(count) + 7 * r
                sym.local()[...] = x
                y = x if form == "numpy" else sym
                before = ch.stats.staged_bytes
                assert comm.broadcast(y, root) is y
                staged = ch.stats.staged_bytes - before
                got = x if form == "numpy" else sym.local()
                assert (got == np.arange(count) + 7 * root).all(), (root, form)
                assert staged == 0 if r != root else staged <= x.nbytes, (root, form, staged)
        planned = [k for k in ch.plans if isinstance(k, tuple) and k[:2] == ("broadcast", count)]
        assert bool(planned) == (size == "plan"), list(ch.plans)  # (the route it names)
    finally:
        sym.close()


class _ReadyAtThird:
    """A request whose ``Test`` is true from its third call on."""

    def __init__(self) -> None:
        self.tests = 0

    def Test(self) -> bool:
        self.tests += 1
        return self.tests >= 3


@pytest.mark.parametrize(("spin_s", "yields"), [(0.0, True), (2e-6, False)])
def test_an_mpi_wait_yields_the_core_at_once_where_ranks_outnumber_cores(
    capped: tuple[World, Any], monkeypatch: pytest.MonkeyPatch, spin_s: float, yields: bool
) -> None:
    """Where a node's ranks outnumber its cores (no spin) an exchange between nodes yields
    the core from its second test on: tests in a row kept the other ranks of a busy core,
    whose transfers it waits for, off it. With cores to spare it tests in a row first."""
    import os

    import collectives.channel as channel_module

    monkeypatch.setattr(channel_module, "spin_seconds", lambda local_size: spin_s)
    comm = collectives.Communicator(capped[0])
    try:
        ch = comm._engine.ch  # type: ignore[attr-defined]
        calls: list[int] = []
        monkeypatch.setattr(os, "sched_yield", lambda: calls.append(1))
        req = _ReadyAtThird()
        ch.mpi_wait(req, "all_reduce")
        monkeypatch.undo()
        assert req.tests == 3 and bool(calls) == yields, (req.tests, calls)
    finally:
        comm.close()


def test_every_rank_takes_a_crowded_nodes_choice_if_one_rank_sees_it(
    capped: tuple[World, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a node has more ranks than cores picks the algorithm (one-shot up to 1 MiB
    there), and the algorithm is in every call's signature: the communicator agrees on it
    when it is made. Here only the last rank sees its node crowded (its own affinity): every
    rank's table says crowded, and a 512 KiB all-reduce runs (one-shot on one node, not the
    rows' two-shot beyond 2 ranks) where it would raise a mismatch if the ranks disagreed."""
    import collectives.channel as channel_module

    world = capped[0]
    p, lone = world.world_size, world.rank == world.world_size - 1
    count = (512 << 10) // 4
    x = np.full(count, world.rank + 1, np.float32)
    total = np.float32(p * (p + 1) // 2)
    for crowded in (True, False):
        see = crowded and lone
        monkeypatch.setattr(channel_module, "spin_seconds", lambda n, see=see: 0.0 if see else 1e-4)
        comm = collectives.Communicator(world)
        try:
            assert comm.table.crowded == crowded
            got = comm.all_reduce(x)
            assert (got == total).all()
            expected = "one_shot" if crowded or p <= 2 else "two_shot"
            if world.num_nodes > 1:
                expected = "hierarchical"
            assert comm.stats.algorithms == {expected: 1}, (crowded, comm.stats.algorithms)
        finally:
            comm.close()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ("all_reduce", *FAMILY))
def test_a_stage_written_with_streaming_stores_gives_the_same_results(
    capped: tuple[World, Any], kind: str, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A numpy input staged with streaming stores (``collectives.ops.STREAM_MIN``, from
    16 MiB; here from 0 bytes, every stage of the general node-local route, the all-reduce's
    plans off) gives the same results, and the stages went through ``stream_copy``."""
    import collectives.allreduce_plans
    import collectives.ops

    real = collectives.ops._c_stream_copy
    if real is None:
        pytest.skip("the C extension is not built")
    streamed: list[int] = []

    def spy(dst: Any, src: Any) -> None:
        streamed.append(dst.nbytes)
        real(dst, src)

    monkeypatch.setattr(collectives.ops, "STREAM_MIN", 0)
    monkeypatch.setattr(collectives.ops, "_c_stream_copy", spy)
    monkeypatch.setattr(collectives.allreduce_plans, "NODE_PLAN_NBYTES", PLANS_UP_TO)
    world, comm = capped
    p = world.world_size
    count = SIZES["exchange"] // 4 // p * p
    for salt in range(2):
        got = _call(world, comm, kind, form, count, salt)
        want = _expected(kind, p, world.rank, count, salt)
        assert got.tobytes() == want.tobytes(), (kind, form, salt)
    on_node = world.num_nodes == 1 and p > 1
    read = kind != "broadcast" or world.rank == 0  # (a broadcast's non-root stages nothing)
    if on_node and read and form in ("numpy", "out_numpy"):
        assert streamed, (kind, form)
