"""Always-on mismatch detection (issue 15, point 4): with the defaults (no check_args, no
check_symmetry), mismatched collectives and allocations raise on every rank instead of
returning wrong data or diverging heaps. Issue 40: every rank raises
``CollectiveMismatchError`` in the mismatched call itself (never a peer failure, never one
call late), with every rank's own line (``_table``); tests/mpi/test_mismatch_matrix.py checks
each line's text, here the paths that reach it are many."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from shmem.callreport import differ
from shmem.errors import CollectiveMismatchError, ShmemError, ShmemStateError

pytestmark = pytest.mark.mpi

MISMATCH = CollectiveMismatchError


def _table(err: Any, *texts: str) -> None:
    """The error holds every member's line, seen, the lines naming different calls, each in
    the message with ``texts``."""
    lines = err.value.calls
    assert lines and all(line.seen for line in lines), str(err.value)
    assert [line.member for line in lines] == list(range(len(lines)))
    assert differ(lines), str(err.value)
    message = str(err.value)
    assert "ranks called different collectives" in message
    for line in lines:
        assert str(line) in message
    for text in texts:
        assert text in message, message


@pytest.fixture
def fast() -> Iterator[Any]:
    """A World and Communicator with every debug check off (the defaults)."""
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=5.0)
    assert not world.config.collectives.check_args and not world.config.heap.check_symmetry
    comm = collectives.Communicator(world)
    try:
        yield world, comm
    finally:
        comm._closed = True  # a mismatch leaves it unusable on purpose
        world._abandon()
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


def _needs_peers(world: Any) -> None:
    if world.world_size == 1 or world.num_nodes > 1:
        pytest.skip("needs 2+ ranks on one node")


@pytest.mark.parametrize("kind", ["count", "op", "dtype", "collective", "collective-late"])
def test_mismatched_all_reduce_raises_everywhere(fast: Any, kind: str) -> None:
    world, comm = fast
    _needs_peers(world)
    odd = world.rank == 0
    if kind == "collective-late":
        # rank 0's all_gather sees the peers' READY first: a cached all_reduce plan has not
        # written its SIG word yet, so only the call tag in SRC shows the mismatch
        kind = "collective"
        if not odd:
            time.sleep(0.2)
    x = np.ones(1000 if (odd and kind == "count") else 2000 if kind == "count" else 1000)
    x = x.astype(np.float64 if (odd and kind == "dtype") else np.float32)
    with pytest.raises(MISMATCH) as err:
        if kind == "collective" and odd:
            comm.all_gather(x)
        else:
            comm.all_reduce(x, op="max" if (odd and kind == "op") else "sum")
    _table(err)
    assert len(err.value.calls) == world.world_size


@pytest.mark.parametrize("kind", ["count", "op", "dtype"])
def test_mismatched_all_reduce_across_nodes_raises_everywhere(fast: Any, kind: str) -> None:
    """Between nodes the partials travel over MPI: their blocks carry the call signature
    (no extra message), so rank 0 disagreeing raises on every rank instead of mixing data."""
    world, comm = fast
    if world.num_nodes == 1:
        pytest.skip("needs several nodes (SHMEM_HEAP_NODE_SPLIT)")
    odd = world.rank == 0
    x = np.ones(1000 if (odd and kind == "count") else 2000 if kind == "count" else 1000)
    x = x.astype(np.float64 if (odd and kind == "dtype") else np.float32)
    with pytest.raises(MISMATCH) as err:
        comm.all_reduce(x, op="max" if (odd and kind == "op") else "sum")
    _table(err)


@pytest.mark.parametrize("other", ["all_gather", "all_to_all", "broadcast", "collect", "alltoalls"])
def test_all_reduce_against_a_call_it_never_meets_raises(fast: Any, other: str) -> None:
    """Node 0 (on one node: rank 0) in ``all_reduce``, the others in another collective
    whose exchange never meets it: across nodes the all-reduce's MPI exchange and the
    family's run on different communicators, and ``collect``/``alltoalls`` are MPI
    exchanges where the all-reduce waits on flags. Before, every rank waited out the
    deadline (``SignalTimeoutError``; and a rank in the first ``collect`` blocked in MPI
    with no deadline at all). A rank whose wait is late reads the others' announced calls
    (the board) and raises the mismatch instead."""
    world, comm = fast
    if world.world_size == 1:
        pytest.skip("needs two ranks to disagree")
    if world.num_nodes == 1 and other in ("all_gather", "all_to_all", "broadcast"):
        pytest.skip("one node: the flags' signatures catch it (test_mismatched_all_reduce...)")
    first = world.node == 0 if world.num_nodes > 1 else world.rank == 0
    p = world.world_size
    x = np.ones(4 * p, np.float32)
    with pytest.raises(MISMATCH) as err:
        if first:
            comm.all_reduce(x)
        elif other == "broadcast":
            comm.broadcast(x, root=0)
        elif other == "alltoalls":
            comm.alltoalls(x, 2)
        else:
            getattr(comm, other)(x)
    _table(err, "all_reduce(", f"{other}(")


def test_collect_and_alltoalls_keep_step_with_the_other_collectives(fast: Any) -> None:
    """collect and alltoalls take the channel's sequence numbers: mixed freely with the
    other collectives they give the right results (no false mismatch, no stale scratch)."""
    world, comm = fast
    p, r = world.world_size, world.rank
    for i in range(20):
        got = comm.collect(np.full(r + 1 + i % 3, r, np.int64))
        assert got.tolist() == [q for q in range(p) for _ in range(q + 1 + i % 3)]
        summed = comm.all_reduce(np.full(3, r + i, np.int64))
        assert summed.tolist() == [sum(range(p)) + p * i] * 3
        x = np.arange(2 * p, dtype=np.float32) + 100 * r
        got2 = comm.alltoalls(x, 2)
        want = np.concatenate(
            [np.arange(2 * r, 2 * r + 2, dtype=np.float32) + 100 * q for q in range(p)]
        )
        np.testing.assert_array_equal(got2, want)
        gathered = comm.all_gather(np.full(2, r + i, np.int32))
        assert gathered.tolist() == [q + i for q in range(p) for _ in range(2)]


def test_matching_calls_across_nodes_still_work(fast: Any) -> None:
    world, comm = fast
    for n in (1, 1000, 70000):
        got = comm.all_reduce(np.full(n, world.rank + 1, np.float32))
        assert (got == world.world_size * (world.world_size + 1) / 2).all()


def test_mismatched_broadcast_roots_raise(fast: Any) -> None:
    world, comm = fast
    _needs_peers(world)
    x = np.arange(16, dtype=np.int64)
    with pytest.raises(MISMATCH) as err:
        comm.broadcast(x, root=0 if world.rank == 0 else 1)
    _table(err, "root=0", "root=1")


def test_a_matching_call_still_works(fast: Any) -> None:
    world, comm = fast
    for _ in range(3):
        got = comm.all_reduce(np.ones(8, np.float32))
        assert (got == world.world_size).all()


def test_mismatched_allocations_raise_everywhere(fast: Any) -> None:
    world, _ = fast
    if world.world_size == 1:
        pytest.skip("needs two ranks to disagree")
    before = world.heap_stats()
    with pytest.raises(ShmemError, match=r"rank 0 in its call \d+: World.empty\(shape=\(1000,\)"):
        world.empty(1000 if world.rank == 0 else 2000, "float32")
    assert world.heap_stats() == before  # nothing was allocated anywhere
    # the same size at different alignments (shmem_align) would land at different offsets
    with pytest.raises(ShmemError, match=r"rank 0 in its call \d+: .*alignment=4096\): 64 bytes"):
        world.empty(8, "int64", alignment=4096 if world.rank == 0 else None)
    assert world.heap_stats() == before
    with world.zeros(8, "int64") as ok:  # and the heap is still in step
        ok.put((world.rank + 1) % world.world_size, np.full(8, world.rank, np.int64))
        world.barrier()
        assert ok.local().tolist() == [(world.rank - 1) % world.world_size] * 8
        world.barrier()


@pytest.fixture
def small_scratch() -> Iterator[Any]:
    """Defaults, but a scratch capped at 64 KiB: larger family calls go through MPI even on
    one node (as every family call does across nodes)."""
    world = shmem.init(
        heap_nbytes="32MiB",
        signal_timeout_s=5.0,
        collectives_scratch_nbytes="64KiB",
        collectives_scratch_max_nbytes="64KiB",
    )
    comm = collectives.Communicator(world)
    try:
        yield world, comm
    finally:
        comm._closed = True
        world._abandon()
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


# (collective of rank 0, what differs): every other rank calls the collective as agreed
FAMILY_CASES = [
    ("all_gather", "count"),
    ("all_gather", "dtype"),
    ("all_to_all", "count"),
    ("broadcast", "count"),
    ("broadcast", "root"),
    ("all_gather", "collective"),
]


def _family_call(comm: Any, world: Any, name: str, kind: str, n: int) -> Any:
    odd = world.rank == 0
    p = world.world_size
    count = n * p
    if odd and kind == "count":
        count += p
    x = np.full(count, world.rank + 1, np.float64 if (odd and kind == "dtype") else np.float32)
    if odd and kind == "collective":
        return comm.all_to_all(x)
    if name == "broadcast":
        return comm.broadcast(x, root=1 if (odd and kind == "root") else 0)
    return getattr(comm, name)(x)


@pytest.mark.parametrize("n", [4, 20000], ids=["signed-block", "signatures-first"])
@pytest.mark.parametrize(("name", "kind"), FAMILY_CASES)
def test_mismatched_family_over_mpi_raises_everywhere(
    small_scratch: Any, name: str, kind: str, n: int
) -> None:
    """Across nodes, or beyond the scratch, the family is one MPI exchange: the call
    signatures travel with it (behind each small block, or all-gathered before a large
    one), so a differing call raises on every rank instead of MPI's truncation or stale
    bytes. The small size runs over MPI only across nodes."""
    world, comm = small_scratch
    if world.world_size == 1:
        pytest.skip("needs two ranks to disagree")
    if world.num_nodes == 1 and n * world.world_size * 4 <= comm.scratch_capacity:
        pytest.skip("one node: a call this small is node-local (the flags' signatures)")
    with pytest.raises(MISMATCH) as err:
        _family_call(comm, world, name, kind, n)
    _table(err)


@pytest.mark.parametrize("n", [4, 20000])
@pytest.mark.parametrize("name", ["all_gather", "all_to_all", "broadcast"])
def test_matching_family_over_mpi_still_works(small_scratch: Any, name: str, n: int) -> None:
    world, comm = small_scratch
    p = world.world_size
    for _ in range(2):
        x = np.arange(n * p, dtype=np.float32) + 1000 * world.rank
        got = np.asarray(
            comm.broadcast(x.copy(), root=p - 1) if name == "broadcast" else getattr(comm, name)(x)
        )
        if name == "all_gather":
            want = np.concatenate([np.arange(n * p, dtype=np.float32) + 1000 * r for r in range(p)])
        elif name == "all_to_all":
            want = np.concatenate(
                [
                    (np.arange(n * p, dtype=np.float32) + 1000 * r)[
                        world.rank * n : (world.rank + 1) * n
                    ]
                    for r in range(p)
                ]
            )
        else:
            want = np.arange(n * p, dtype=np.float32) + 1000 * (p - 1)
        np.testing.assert_array_equal(got, want)


TEAM_CASES = [
    ("all_reduce", "count"),
    ("all_reduce", "op"),
    ("all_gather", "dtype"),
    ("all_to_all", "count"),
    ("broadcast", "root"),
    ("collect", "dtype"),
    ("alltoalls", "count"),
    ("all_gather", "collective"),
]


@pytest.mark.parametrize(("name", "kind"), TEAM_CASES)
def test_mismatched_team_collectives_raise_everywhere(fast: Any, name: str, kind: str) -> None:
    """A team's collectives are MPI exchanges on the team's communicator: with the defaults
    they compare the members' call signatures too (before, a differing count was MPI's
    truncation or stale data, and a differing op went unseen)."""
    world, _ = fast
    if world.world_size < 2:
        pytest.skip("needs two ranks to disagree")
    # the members in reverse: a team other than the world runs the team collectives
    team = world.team_world.split_strided(world.world_size - 1, -1, world.world_size)
    comm = collectives.Communicator(team)
    odd = team.my_pe == 0
    x = np.ones(4 * team.n_pes + (team.n_pes if odd and kind == "count" else 0), np.float32)
    if odd and kind == "dtype":
        x = x.astype(np.float64)
    try:
        with pytest.raises(MISMATCH) as err:
            if odd and kind == "collective":
                comm.all_to_all(x)
            elif name == "all_reduce":
                comm.all_reduce(x, op="max" if (odd and kind == "op") else "sum")
            elif name == "broadcast":
                comm.broadcast(x, root=1 if (odd and kind == "root") else 0)
            elif name == "alltoalls":
                comm.alltoalls(x, 2 if (odd and kind == "count") else 1)
            else:
                getattr(comm, name)(x)
        _table(err)
        assert [line.member for line in err.value.calls] == list(range(team.n_pes))
    finally:
        comm._closed = True


@pytest.mark.parametrize("kind", ["numpy", "symmetric", "team_shared"])
def test_back_to_back_broadcasts_with_changing_roots_are_not_a_mismatch(
    fast: Any, kind: str
) -> None:
    """A broadcast's readers do not wait for each other: a fast reader starts the next call
    while a slow one still checks the previous call's signatures. The next call's signature
    must not land in the slot being checked (it did: a false CollectiveMismatchError at 3+
    ranks, 5 runs in 5)."""
    world, comm = fast
    p, r = world.world_size, world.rank
    if kind == "team_shared":
        comm = collectives.Communicator(world.team_shared)
        p, r = comm.world_size, comm.rank
    sym = world.zeros(8, "int64") if kind == "symmetric" else None
    try:
        for i in range(300):
            root = i % p
            mine = np.full(8, i * 10 + r if r == root else -1, np.int64)
            if sym is not None:
                sym.local()[:] = mine
                got = np.asarray(comm.broadcast(sym, root=root, out=np.empty(8, np.int64)))
            else:
                got = comm.broadcast(mine, root=root)
            assert got.tolist() == [i * 10 + root] * 8, (i, got.tolist())
    finally:
        if kind == "team_shared":
            comm.close()
        if sym is not None:
            world.barrier()
            sym.close()


def _small_call(comm: Any, name: str, x: Any) -> Any:
    if name == "broadcast":
        return comm.broadcast(x.copy(), root=comm.world_size - 1)
    return getattr(comm, name)(x)


@pytest.mark.parametrize("other", ["count", "dtype", "collective", "all_reduce"])
@pytest.mark.parametrize("name", ["all_gather", "all_to_all", "broadcast", "reduce_scatter"])
def test_a_replayed_small_call_across_nodes_meets_a_mismatch(
    fast: Any, name: str, other: str
) -> None:
    """Small family calls across nodes replay a cached persistent all-gather
    (``collectives.cross_plan``): a matching call makes the plan, the next replays it with
    the same result; then rank 0 in another call (another count or dtype: a plan of its own;
    another collective: the general path or another communicator's exchange) raises on
    every rank, where MPI alone would mix or hang."""
    from collectives.cross_plan import CrossPlan

    world, comm = fast
    if world.num_nodes == 1:
        pytest.skip("needs several nodes (SHMEM_HEAP_NODE_SPLIT)")
    p, r = world.world_size, world.rank
    x = np.arange(4 * p, dtype=np.float32) * (r + 1)
    first = np.asarray(_small_call(comm, name, x)).copy()
    ch = comm.host_channel
    planned = name != "reduce_scatter" or len(ch.local_peers) == 1 or not ch.uniform_nodes
    plans = [v for v in ch.plans.values() if isinstance(v, CrossPlan)]
    assert len(plans) == (1 if planned else 0), ch.plans
    second = np.asarray(_small_call(comm, name, x))  # the replay
    np.testing.assert_array_equal(first, second)
    if name == "all_gather":
        want = np.concatenate([np.arange(4 * p, dtype=np.float32) * (q + 1) for q in range(p)])
        np.testing.assert_array_equal(second, want)
    with pytest.raises(MISMATCH) as err:
        if r == 0 and other == "count":
            _small_call(comm, name, np.ones(8 * p, np.float32))
        elif r == 0 and other == "dtype":
            _small_call(comm, name, np.ones(4 * p, np.float64))
        elif r == 0 and other == "collective":
            _small_call(comm, "all_gather" if name != "all_gather" else "all_to_all", x)
        elif r == 0:
            comm.all_reduce(x)
        else:
            _small_call(comm, name, x)
    _table(err)


def test_an_allocation_against_a_world_barrier_raises_on_the_allocating_rank() -> None:
    """``World.barrier`` checks no signature (it stays a sub-microsecond barrier), but after
    every heap call a rank's heap word says "a barrier" until its next one: a peer's
    allocation that meets the barrier raises (nothing allocated) instead of reading the
    word of the rank's call before last, which, of the same size, let it allocate alone
    and the heaps diverge. The barrier ranks never send a line ("not seen yet"), and the
    allocating rank's count of heap calls has moved on without them: its World refuses
    further heap calls (out of step) instead of pairing them wrongly."""
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=1.0)
    try:
        p, r = world.world_size, world.rank
        if p == 1:
            pytest.skip("needs two ranks to disagree")
        odd = r == p - 1
        first, second = world.empty(16, "float32"), world.empty(16, "float32")
        before = world.heap_stats()
        if odd:
            with pytest.raises(CollectiveMismatchError) as err:
                world.empty(16, "float32")  # the same size as the heap call before last
            lines = err.value.calls
            assert [line.seen for line in lines] == [False] * (p - 1) + [True]
            assert lines[-1].text == "World.empty(shape=(16,), dtype=float32): 64 bytes"
            assert all(line.waited_s >= 1.0 for line in lines[:-1])
            assert "not seen yet (waited 1." in str(err.value)
            assert "the World is out of step" in str(err.value)
            assert world.heap_stats() == before  # nothing was allocated
            with pytest.raises(ShmemStateError, match="out of step"):
                world.empty(4, "int8")
        else:
            world.barrier()
            assert world.heap_stats() == before
        del first, second
    finally:
        world._abandon()
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()
