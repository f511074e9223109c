"""The plan caches evict safely (issue 40): a plan dropped from the channel's cache is never
replayed from a reference kept elsewhere (the engine's last replayed plans), a plan made again
replays right, and the cache changes alike on every rank whatever kind of arguments each one
passes (a persistent MPI exchange between nodes is made and started in step by every member).

Every cache a call passes through is made to evict here, at every rank count and node split:
the channel's plans (a cache of 3 instead of 64), the engine's remembered all-reduce and
family plans, the cross-node plans and their persistent all-gathers, and the signed
exchanges' reused receive arrays (more than their 64 shapes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from collectives.allreduce_plans import NODE_PLAN_NBYTES
from collectives.schedule import shard_bounds
from shmem import SHMEMBuffer, World

pytestmark = pytest.mark.mpi

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
FORMS = ("numpy", "symmetric", "out_numpy", "out_symmetric", "in_place")


@pytest.fixture
def small_cache() -> Iterator[tuple[World, Any]]:
    """Defaults (the cached replays run) with a plan cache of 3 shapes."""
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    assert comm.host_channel is not None
    comm.host_channel.max_plans = 3
    yield world, comm
    comm.close()
    world.finalize()


def _input(rank: int, count: int, salt: int) -> np.ndarray[Any, Any]:
    """Rank ``rank``'s input: integers, so the reference is exact in any order."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt) % 101).astype(np.int32)


def _expected(kind: str, p: int, rank: int, count: int, salt: int) -> np.ndarray[Any, Any]:
    inputs = [_input(q, count, salt) for q in range(p)]
    total = np.asarray(np.sum(inputs, axis=0, dtype=np.int32))
    if kind == "all_reduce":
        return total
    if kind == "reduce_scatter":
        a, b = shard_bounds(count, p)[rank]
        return total[a:b]
    if kind == "all_gather":
        return np.concatenate(inputs)
    if kind == "broadcast":
        return inputs[0]
    c = count // p  # all_to_all: chunk `rank` of every member, in member order
    return np.concatenate([x[rank * c : (rank + 1) * c] for x in inputs])


def _out_count(kind: str, p: int, rank: int, count: int) -> int:
    if kind == "reduce_scatter":
        a, b = shard_bounds(count, p)[rank]
        return b - a
    return count * p if kind == "all_gather" else count


def _call(
    world: World, comm: Any, kind: str, form: str, count: int, salt: int
) -> np.ndarray[Any, Any]:
    """One ``kind`` call in ``form``: its result as a numpy copy (every buffer closed)."""
    p, r = world.world_size, world.rank
    x = _input(r, count, salt)
    n_out = _out_count(kind, p, r, count)
    if form == "in_place" and n_out != count:
        form = "out_symmetric"  # (a result of another size cannot overwrite its input)
    call: Callable[..., Any] = getattr(comm, kind)
    args: tuple[Any, ...] = (0,) if kind == "broadcast" else ()
    opened: list[SHMEMBuffer] = []

    def sym(n: int, fill: np.ndarray[Any, Any] | None = None) -> SHMEMBuffer:
        buf = world.zeros(n, "int32")
        opened.append(buf)
        if fill is not None:
            buf.local()[...] = fill
        return buf

    try:
        if form == "numpy":
            got = call(x, *args)
        elif form == "symmetric":
            got = call(sym(count, x), *args)
        elif form == "out_numpy":
            out = np.empty(n_out, np.int32)
            got = call(x, *args, out=out)
            assert got is out
        elif form == "out_symmetric":
            buf = sym(n_out)
            got = call(sym(count, x), *args, out=buf)
            assert got is buf
        else:
            buf = sym(count, x)
            got = call(buf, *args, out=buf)
            assert got is buf
        result = np.array(got.local() if isinstance(got, SHMEMBuffer) else got).reshape(-1)
    finally:
        # every rank closes in the same order (collective); a wait for the last call's
        # readers is part of each call already
        for buf in reversed(opened):
            buf.close()
    return result


def _check(world: World, comm: Any, kind: str, form: str, count: int, salt: int) -> None:
    got = _call(world, comm, kind, form, count, salt)
    want = _expected(kind, world.world_size, world.rank, count, salt)
    assert got.tobytes() == want.tobytes(), (kind, form, count, salt)


def _counts(p: int, n: int) -> list[int]:
    """``n`` small counts, each a multiple of ``p`` (all_to_all's rule)."""
    return [p * (k + 1) for k in range(n)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_replays_right_after_its_plan_was_evicted(
    small_cache: tuple[World, Any], kind: str
) -> None:
    """Replay a shape (so the engine remembers its plan), evict it with more shapes than the
    cache holds, replay it again: before the fix the engine replayed the dropped plan
    (across nodes: "a persistent gather reused after close")."""
    world, comm = small_cache
    first, *others = _counts(world.world_size, 6)
    for form in FORMS:
        for salt in range(2):  # made, then replayed and remembered
            _check(world, comm, kind, form, first, salt)
        for n in others:  # every one made anew: the first is dropped
            _check(world, comm, kind, form, n, 5)
        assert len(comm.host_channel.plans) <= 3
        for salt in range(2, 4):  # the remembered plan was closed: looked up, made again
            _check(world, comm, kind, form, first, salt)


def test_kinds_interleaved_evict_each_others_plans(small_cache: tuple[World, Any]) -> None:
    """Every kind, every form, shapes cycling through a cache smaller than their number."""
    world, comm = small_cache
    counts = _counts(world.world_size, 4)
    rng = np.random.default_rng(40)  # the same schedule on every rank
    for step in range(120):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        form = FORMS[int(rng.integers(len(FORMS)))]
        _check(world, comm, kind, form, counts[int(rng.integers(len(counts)))], step)


def test_the_cache_changes_alike_on_every_rank(small_cache: tuple[World, Any]) -> None:
    """Rank 0 passes a symmetric ``out`` (the fast path declines it: the general path finds
    the plan in the cache) where the others pass numpy (their fast path replays it): the
    cached shapes, in their order, stay the same on every rank. A hit that reordered the
    cache (least recently used) made rank 0 drop another plan than its peers."""
    world, comm = small_cache
    p, r = world.world_size, world.rank
    a, b, c, d = _counts(p, 4)

    def gather(n: int, salt: int, asymmetric: bool) -> None:
        with world.zeros(n * p, "int32") as sym:  # (allocated on every rank: collective)
            out = sym if (asymmetric and r == 0) else np.empty(n * p, np.int32)
            got = comm.all_gather(_input(r, n, salt), out=out)
            result = np.array(got.local() if isinstance(got, SHMEMBuffer) else got)
        assert result.tobytes() == _expected("all_gather", p, r, n, salt).tobytes()

    for n in (a, b, c):
        gather(n, 0, False)
    gather(a, 1, True)  # a hit: the general path on rank 0 only
    gather(d, 2, False)  # one plan is dropped: the same one everywhere
    keys = [repr(k) for k in comm.host_channel.plans]
    every = world.comm.allgather(keys)
    assert all(k == every[0] for k in every), every
    for n in (a, b, c, d):
        gather(n, 3, True)


def test_large_one_shot_plans_evict(small_cache: tuple[World, Any]) -> None:
    """The general one-shot path's per-shape plans (inputs above the cached replay's
    ``NODE_PLAN_NBYTES``; one-shot asked for, as the table picks two-shot there beyond 2
    ranks) share the cache and evict like the others."""
    from collectives.allreduce import _Plan

    world, comm = small_cache
    p, r = world.world_size, world.rank
    base = NODE_PLAN_NBYTES // 4 + p  # just above the cached replay's limit
    seen = False
    for rounds in range(2):
        for n in (base + k for k in range(4)):
            want = _expected("all_reduce", p, r, n, rounds)
            got = comm.all_reduce(_input(r, n, rounds), algorithm="one_shot")
            assert got.tobytes() == want.tobytes(), (n, rounds)
            with world.zeros(n, "int32") as sym:
                sym.local()[...] = _input(r, n, rounds + 7)
                comm.all_reduce(sym, out=sym, algorithm="one_shot")
                want = _expected("all_reduce", p, r, n, rounds + 7)
                assert np.asarray(sym.local()).tobytes() == want.tobytes(), (n, rounds)
            plans = comm.host_channel.plans.values()
            seen = seen or (world.num_nodes == 1 and any(isinstance(v, _Plan) for v in plans))
            assert len(comm.host_channel.plans) <= 3
    assert seen or world.num_nodes > 1


def test_more_shapes_than_the_signed_exchanges_reuse(small_cache: tuple[World, Any]) -> None:
    """70 shapes through the general path (across nodes: the signed all-gathers keep 64 receive
    arrays; one node: the flags path): each one right, the reused arrays evicted alike."""
    world, comm = small_cache
    for k, n in enumerate(_counts(world.world_size, 70)):
        _check(world, comm, "all_gather", "numpy", n, k)
