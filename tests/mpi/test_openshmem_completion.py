"""Routines whose OpenSHMEM 1.5 definition includes a completion (issue 29), checked by what a
neighbour sees right after them, many rounds each, at 1-4 ranks, on one node and on the RMA
path (``SHMEM_HEAP_NODE_SPLIT=rank``, where non-blocking puts are MPI requests).

* ``shmem_barrier_all`` (:meth:`World.barrier`): a quiet of the default context, then a sync
  of the world: every earlier ``put_nbi``, ``get_nbi``, ``put_signal_nbi`` and non-blocking
  AMO is complete when any rank leaves it.
* memory management (``shmem_malloc``/``shmem_free``: :meth:`World.empty`,
  :meth:`SHMEMBuffer.close`) implies a ``shmem_barrier_all``.
* ``shmem_ctx_destroy`` (:meth:`Context.close`) quiets its context; ``shmem_clear_lock``
  quiets the default context before the lock passes on; ``shmem_finalize`` completes
  pending communication.
* ``shmem_fence`` orders: a put after it is never seen before one before it.
* ``shmem_sync_all`` (:meth:`World.sync_all`) completes and makes visible earlier stores
  (blocking puts), and is the barrier without the quiet.
"""

from __future__ import annotations

import numpy as np
import pytest

import shmem
from shmem import World

pytestmark = pytest.mark.mpi

ROUNDS = 40
N = 4096  # large enough that an MPI request is still in flight on the RMA path


def _ring(world: World) -> tuple[int, int]:
    return (world.rank + 1) % world.world_size, (world.rank - 1) % world.world_size


def _payload(rnd: int, rank: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
    return np.arange(N, dtype=np.int64) + rnd * 1_000_000 + rank * 10_000


def test_barrier_completes_put_nbi_and_put_signal_nbi(world: World) -> None:
    right, left = _ring(world)
    missing: list[tuple[object, ...]] = []
    with world.zeros(N, "int64") as x, world.zeros(1, "uint64") as sig:
        for rnd in range(1, ROUNDS + 1):
            x.put_nbi(right, _payload(rnd, world.rank))
            x.put_signal_nbi(right, _payload(rnd, world.rank)[:8], sig, rnd, "set")
            world.barrier()
            if world.default_context.pending:
                missing.append((rnd, "pending", world.default_context.pending))
            if int(sig.local()[0]) != rnd:
                missing.append((rnd, "signal", int(sig.local()[0])))
            if not np.array_equal(x.local(), _payload(rnd, left)):
                missing.append((rnd, "data"))
            world.barrier()
    assert not missing, missing[:5]


def test_barrier_completes_get_nbi_and_nonblocking_atomics(world: World) -> None:
    right, _ = _ring(world)
    with world.zeros(N, "int64") as x, world.zeros(1, "int64") as counter:
        x.local()[:] = _payload(7, world.rank)
        world.barrier()
        for rnd in range(1, ROUNDS + 1):
            got = x.get_nbi(right, np.empty(N, np.int64))
            fetched = counter.atomic_nbi(right, 0, "fetch_add", 1)
            world.barrier()
            assert world.default_context.pending == 0, rnd
            np.testing.assert_array_equal(got, _payload(7, right))
            assert fetched.done and fetched.value == rnd - 1, (rnd, fetched)
            assert int(counter.local()[0]) == rnd  # the left neighbour's add has landed
            world.barrier()


def test_allocation_and_free_complete_the_default_context(world: World) -> None:
    right, left = _ring(world)
    with world.zeros(N, "int64") as x:
        for rnd in range(1, ROUNDS // 4 + 1):
            x.put_nbi(right, _payload(rnd, world.rank))
            y = world.zeros(8, "int64")  # shmem_malloc: a barrier_all
            assert world.default_context.pending == 0
            assert np.array_equal(x.local(), _payload(rnd, left)), rnd
            world.barrier()
            x.put_nbi(right, _payload(rnd + 100, world.rank))
            y.close()  # shmem_free: a barrier_all
            assert world.default_context.pending == 0
            assert np.array_equal(x.local(), _payload(rnd + 100, left)), rnd
            world.barrier()


def test_context_destroy_completes_its_operations(world: World) -> None:
    right, left = _ring(world)
    with world.zeros(N, "int64") as x:
        for rnd in range(1, ROUNDS // 2 + 1):
            ctx = world.create_context()
            x.put_nbi(right, _payload(rnd, world.rank), ctx=ctx)
            ctx.close()
            assert ctx.pending == 0
            world.sync_all()  # no quiet of its own: the close completed the put
            assert np.array_equal(x.local(), _payload(rnd, left)), rnd
            world.sync_all()


def test_clear_lock_completes_the_critical_sections_puts(world: World) -> None:
    """Each rank in turn, under the lock, reads the log at rank 0, appends its entry with
    put_nbi and releases: the next holder sees every earlier entry."""
    with world.zeros(1, "int64") as lock, world.zeros(world.world_size * 8, "int64") as log:
        for rnd in range(1, 4):
            with lock.lock():
                entries = int((log.get(0) != 0).sum()) // 8  # what earlier holders wrote
                entry = np.full(8, rnd * 100 + world.rank + 1, np.int64)
                log.put_nbi(0, entry, offset=entries * 8 * 8)
            world.barrier()
            if world.rank == 0:
                got = log.local().reshape(world.world_size, 8)
                assert (got != 0).all(), got
                assert sorted(got[:, 0] % 100) == list(range(1, world.world_size + 1))
            world.barrier()
            log.local()[:] = 0
            world.barrier()


def test_fence_orders_a_later_put_after_an_earlier_one(world: World) -> None:
    right, left = _ring(world)
    with world.zeros(N, "int64") as x, world.zeros(1, "uint64") as flag:
        for rnd in range(1, ROUNDS + 1):
            x.put_nbi(right, _payload(rnd, world.rank))
            world.fence()
            flag.put_nbi(right, np.array([rnd], np.uint64))
            flag.wait_until("ge", rnd)
            assert np.array_equal(x.local(), _payload(rnd, left)), rnd
            world.barrier()


def test_sync_all_makes_blocking_puts_visible(world: World) -> None:
    right, left = _ring(world)
    with world.zeros(N, "int64") as x:
        for rnd in range(1, ROUNDS + 1):
            x.put(right, _payload(rnd, world.rank))
            world.sync_all()
            assert np.array_equal(x.local(), _payload(rnd, left)), rnd
            world.sync_all()


def test_finalize_completes_pending_fetches() -> None:
    """After finalize a fetched value issued just before it is there (the request
    completed); the target's word holds every rank's add (checked in a new World)."""
    w = shmem.init(heap_nbytes="16MiB")
    right = (w.rank + 1) % w.world_size
    counter = w.zeros(1, "int64")
    w.barrier()
    fetched = counter.atomic_nbi(right, 0, "fetch_add", 5)
    with w.create_context() as ctx:  # a second context, left open until finalize
        pass
    other = w.create_context()
    x = w.zeros(N, "int64")
    x.put_nbi(right, _payload(3, w.rank), ctx=other)
    w.finalize()
    assert fetched.done and fetched.value == 0
    assert other.pending == 0 and ctx.closed
