"""A cached broadcast beyond one chunk (``collectives.family.STAGE_CHUNK``): the root stages
its input chunk by chunk after ``READY`` and counts the chunks in ``PROG``; every reader,
in C or in Python, copies only what ``PROG`` counts. Here the root is made slow (its
staging replaced by one that sleeps between chunks, as a descheduled rank would), or one
side runs the Python replay while the other runs C: the result is the root's input of this
call on every rank, every call."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from collectives.channel import Flag
from collectives.family import STAGE_CHUNK
from shmem.errors import PeerFailedError

pytestmark = pytest.mark.mpi

N = (3 * STAGE_CHUNK + 40) // 4  # int32: four chunks, the last one short


def slow_publish(plan: Any, fail_after: int = -1) -> Any:
    """A root's publish that raises READY first and stages its chunks 20 ms apart (and
    raises after ``fail_after`` of them, where given)."""

    def publish(ch: Any, s: int, x: Any, shm: Any, shares: bool = False) -> None:
        ch.wait_peers(Flag.DONE, s - 1, plan.where)
        if ch.sig_seq == s - 1:
            ch.check_signatures(None, plan.where, s - 1)
        mine, k = ch.my_flags, STAGE_CHUNK // 4
        mine[Flag.PROG] = 0
        mine[Flag.SRC] = plan.stage_word
        mine[Flag.READY] = s
        src = x if shm is None else shm.local().reshape(-1)
        for c in range(plan.chunks):
            if c == fail_after:
                raise RuntimeError("the root failed while staging")
            time.sleep(0.02)
            plan.stage[c * k : (c + 1) * k] = src[c * k : (c + 1) * k]
            mine[Flag.PROG] = c + 1

    return publish


@contextmanager
def planned_broadcast() -> Iterator[tuple[Any, Any, int, np.ndarray[Any, Any]]]:
    """(world, communicator, root, out) after a first broadcast of N int32 from the last
    rank (which makes the plan); the world finalized after."""
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    root = world.world_size - 1
    try:
        out = np.zeros(N, np.int32)
        comm.broadcast(np.zeros(N, np.int32), root=root, out=out)
        yield world, comm, root, out
    finally:
        world.barrier()
        comm.close()
        world.finalize()


@pytest.mark.parametrize("python", ["slow_root", "root", "readers"])
def test_every_reader_gets_the_chunks_of_this_call(python: str) -> None:
    with planned_broadcast() as (world, comm, root, out):
        r = world.rank
        ch = comm.host_channel
        planned = world.num_nodes == 1 and ch is not None
        if planned and ch is not None:
            plan = ch.plans[("broadcast", N, np.dtype(np.int32), root)]
            assert plan.chunks == 4
            if (python == "readers") == (r != root):  # this rank replays in Python
                plan.fast = None
            if python == "slow_root" and r == root:
                plan.publish = slow_publish(plan)
        with world.zeros(N, "int32") as sym:
            for i in range(4):
                want = np.arange(N, dtype=np.int32) * (i + 2) - i
                sym.local()[...] = want if r == root else -1
                x: Any = sym if i % 2 else (want.copy() if r == root else np.full(N, -1, np.int32))
                got = comm.broadcast(x, root=root, out=out)
                assert np.array_equal(got, want), (python, i, r)
        if planned and ch is not None and ch.plans:
            assert ("broadcast", N, np.dtype(np.int32), root) in ch.plans


def test_a_root_that_fails_while_staging_stops_every_reader() -> None:
    """The root raised READY and staged one chunk, then failed: it retracts its flags
    (``PROG`` too) and raises ``ABORT``, so every reader stops with ``PeerFailedError``
    within the deadline instead of waiting for chunks that never come."""
    with planned_broadcast() as (world, comm, root, out):
        r = world.rank
        ch = comm.host_channel
        if world.num_nodes > 1 or ch is None or world.world_size == 1:
            pytest.skip("a node-local broadcast with readers")
        plan = ch.plans[("broadcast", N, np.dtype(np.int32), root)]
        x = np.arange(N, dtype=np.int32)
        if r == root:
            plan.fast = None
            plan.publish = slow_publish(plan, fail_after=1)
            with pytest.raises(RuntimeError, match="failed while staging"):
                comm.broadcast(x, root=root, out=out)
        else:
            t0 = time.monotonic()
            with pytest.raises(PeerFailedError):
                comm.broadcast(np.zeros(N, np.int32), root=root, out=out)
            assert time.monotonic() - t0 < 10.0
            assert ch.my_flags[Flag.DONE] < ch.seq  # no reader completed the call
