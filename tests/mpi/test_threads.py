"""Thread levels (OpenSHMEM's ``shmem_init_thread`` / ``shmem_query_thread``; issue 29):
what a World provides, and several threads of every rank issuing RMA, atomics, waits and
collectives at once (``ThreadLevel.MULTIPLE``), at 1-4 ranks, on one node and on the RMA
path."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from shmem import ThreadLevel, World
from shmem.errors import ArgumentError
from shmem.threads import mpi_level, provided_level

pytestmark = pytest.mark.mpi

THREADS = 4
ROUNDS = 25


def _in_threads(body: Callable[[int], None], count: int = THREADS) -> None:
    """Run ``body(t)`` in ``count`` threads; re-raise the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def run(t: int) -> None:
        try:
            start.wait(timeout=60)
            body(t)
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def test_the_level_provided_never_exceeds_mpis() -> None:
    from mpi4py import MPI

    mpi = mpi_level(MPI)
    assert provided_level(None, mpi) == mpi
    assert provided_level(ThreadLevel.FUNNELED, ThreadLevel.MULTIPLE) == ThreadLevel.FUNNELED
    assert provided_level(ThreadLevel.MULTIPLE, ThreadLevel.SERIALIZED) == ThreadLevel.SERIALIZED
    assert ThreadLevel.parse("Serialized", "t") is ThreadLevel.SERIALIZED
    assert ThreadLevel.parse(3, "t") is ThreadLevel.MULTIPLE
    for bad in ("many", 4, True, None):
        with pytest.raises(ArgumentError, match=r"init: invalid thread_level \(got"):
            ThreadLevel.parse(bad, "init")
    with pytest.raises(ArgumentError, match="invalid thread_level"):
        shmem.init(thread_level="threads")
    for asked in ThreadLevel:
        with shmem.init(heap_nbytes="8MiB", thread_level=asked) as w:
            assert w.thread_level == min(asked, mpi)
    with shmem.init(heap_nbytes="8MiB") as w:
        assert w.thread_level == mpi  # none asked for: the most MPI allows


@pytest.fixture
def multiple(world: World) -> World:
    if world.thread_level < ThreadLevel.MULTIPLE:
        pytest.skip(f"MPI provides {world.thread_level.name} here, not MULTIPLE")
    return world


def test_threads_issue_rma_and_atomics_on_their_own_contexts(multiple: World) -> None:
    w = multiple
    right = (w.rank + 1) % w.world_size
    n = 512
    with (
        w.zeros((THREADS, n), "int64") as x,
        w.zeros(THREADS, "int64") as tickets,
        w.zeros(1, "int64") as shared,
    ):
        fetched: dict[int, list[int]] = {t: [] for t in range(THREADS)}

        def body(t: int) -> None:
            with w.create_context() as ctx:
                for rnd in range(1, ROUNDS + 1):
                    x.put_nbi(right, np.full(n, rnd * 100 + t, np.int64), offset=t * n * 8, ctx=ctx)
                    f = tickets.atomic_nbi(right, t, "fetch_add", 1, ctx=ctx)
                    fetched[t].append(shared.atomic_fetch_add(0, 0, 1))  # blocking, shared word
                    got = x.get_nbi(right, np.empty(n, np.int64), offset=t * n * 8, ctx=ctx)
                    ctx.quiet()
                    assert f.value == rnd - 1, (t, rnd, f)
                    assert got[0] in (rnd * 100 + t, (rnd - 1) * 100 + t) or rnd == 1, got[0]

        _in_threads(body)
        w.barrier()
        for t in range(THREADS):
            assert (x.local()[t] == ROUNDS * 100 + t).all(), t
        assert tickets.local().tolist() == [ROUNDS] * THREADS  # from the left neighbour
        w.barrier()
        # every ticket of rank 0's shared word was drawn exactly once, by some thread of some rank
        drawn = sorted(v for vs in w.comm.allgather(fetched) for ts in vs.values() for v in ts)
        assert drawn == list(range(THREADS * ROUNDS * w.world_size))
        w.barrier()


def test_threads_share_the_default_context(multiple: World) -> None:
    """Every thread starts puts on the one default context while others quiet it: none is lost
    (the list is swapped under its lock), and the barrier completes them all."""
    w = multiple
    right, left = (w.rank + 1) % w.world_size, (w.rank - 1) % w.world_size
    n = 256
    with w.zeros((THREADS, ROUNDS, n), "int32") as x:

        def body(t: int) -> None:
            for rnd in range(ROUNDS):
                off = (t * ROUNDS + rnd) * n * 4
                x.put_nbi(right, np.full(n, w.rank * 1000 + t * 100 + rnd, np.int32), offset=off)
                if rnd % 3 == t % 3:
                    w.quiet()

        _in_threads(body)
        w.barrier()
        assert w.default_context.pending == 0
        want = left * 1000 + np.arange(THREADS)[:, None] * 100 + np.arange(ROUNDS)[None, :]
        np.testing.assert_array_equal(x.local()[:, :, 0], want)
        assert (x.local() == x.local()[:, :, :1]).all()
        w.barrier()


def test_threads_signal_and_wait_each_other_across_ranks(multiple: World) -> None:
    """Thread t of every rank puts with a signal to thread t's slot on the right neighbour and
    waits for its own slot: a ring per thread, all rings at once."""
    w = multiple
    right = (w.rank + 1) % w.world_size
    with w.zeros((THREADS, 64), "float64") as x, w.zeros(THREADS, "uint64") as sig:

        def body(t: int) -> None:
            for rnd in range(1, ROUNDS + 1):
                x.put_signal(
                    right, np.full(64, rnd + t / 10, np.float64), sig, rnd, "set",
                    sig_index=t, offset=t * 64 * 8,
                )  # fmt: skip
                sig.signal_wait_until("ge", rnd, index=t)
                # the left neighbour's thread t may be a round ahead: values only grow
                assert (x.local()[t] >= rnd + t / 10).all()

        _in_threads(body)
        w.barrier()
        assert sig.local().tolist() == [ROUNDS] * THREADS
        w.barrier()


def test_threads_run_collectives_on_their_own_teams(multiple: World) -> None:
    """Each thread all-reduces on a Communicator of its own team (made in the main thread,
    collectively), all of them at once; every result is the rank-order sum."""
    w = multiple
    teams: list[Any] = []
    comms = []
    for _ in range(THREADS):
        team = w.team_world.split_strided(0, 1, w.world_size)
        assert team is not None
        teams.append(team)
        comms.append(collectives.Communicator(team))
    try:

        def body(t: int) -> None:
            comm = comms[t]
            for rnd in range(ROUNDS):
                x = np.full(1000, w.rank + 1 + t * 10 + rnd, np.float32)
                got = comm.all_reduce(x)
                want = sum(r + 1 + t * 10 + rnd for r in range(w.world_size))
                assert (np.asarray(got) == want).all(), (t, rnd)
                comm.barrier()

        _in_threads(body)
    finally:
        for comm in comms:
            comm.close()
        for team in teams:
            team.destroy()
    w.barrier()
