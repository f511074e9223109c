"""The flight recorder at every rank count (issue 33): the cached replay (C, where built)
records its calls as the general path does, the same numbers on every rank, and a call that
fails is recorded failed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import shmem
from collectives.replay import replay_status
from shmem import World, flight
from shmem.errors import SignalTimeoutError

pytestmark = pytest.mark.mpi


def _mine(rec: flight.FlightRecorder, stream: int, after: int) -> list[Any]:
    """The calls on ``stream`` since record ``after`` (not the stream's marker)."""
    records = rec.log().records
    return [r for r in records if r.stream == stream and r.number >= after and r.seq]


@pytest.fixture
def plain_world() -> Any:
    """A World without the CI config's argument checks (so the cached replays run)."""
    world = shmem.init(heap_nbytes="16MiB")
    try:
        yield world
    finally:
        world.finalize()


def _c_runs(comm: collectives.Communicator) -> bool:
    """Whether the C replay ran calls on every rank (it records those itself: the whole
    call, or its start where it hands the call to the Python replay)."""
    plans = comm._engine.ch.plans.values()  # type: ignore[attr-defined]
    runs = sum(sum(p.fast.answers()) for p in plans if getattr(p, "fast", None) is not None)
    return all(comm.world.comm.allgather(runs > 0))


def test_every_call_is_recorded_once_with_the_same_numbers_on_every_rank(
    plain_world: World,
) -> None:
    world = plain_world
    rec = flight.recorder()
    comm = collectives.Communicator(world)
    try:
        start = rec.log().recorded
        n = world.world_size
        x = np.arange(8 * n, dtype=np.float32)
        for _ in range(5):  # the first is the general path, then the cached replay
            comm.all_reduce(x)
        comm.reduce_scatter(x)
        comm.all_gather(np.ones(3, np.int64))
        comm.broadcast(x, root=0)
        comm.all_to_all(x)
        comm.all_reduce(np.ones(300_000, np.float64))  # too big for a cached plan (2 MiB)
        comm.barrier()
        calls = _mine(rec, comm.stream, start)
        got = [(r.op, r.seq, r.state, r.nbytes, r.dtype) for r in calls]
        want = [("all_reduce", i, "done", x.nbytes, "float32") for i in range(1, 6)]
        want += [
            ("reduce_scatter", 6, "done", x.nbytes, "float32"),
            ("all_gather", 7, "done", 24, "int64"),
            ("broadcast", 8, "done", x.nbytes, "float32"),
            ("all_to_all", 9, "done", x.nbytes, "float32"),
            ("all_reduce", 10, "done", 2_400_000, "float64"),
            ("barrier", 11, "done", 0, ""),
        ]
        # (agreed: a rank that alone failed would leave the others waiting on its verdict)
        assert all(world.comm.allgather(got == want)), got
        assert all(r.t_end >= r.t_start - 0.01 > 0 for r in calls)  # (C: the coarse clock)
        if replay_status() == "C" and world.num_nodes == 1:
            assert _c_runs(comm)  # the C replay wrote some of these records
        # the same calls on every rank: the launcher compares them across ranks
        assert world.comm.allgather(got) == [got] * n
        world.barrier()
        world_calls = _mine(rec, 0, start)
        assert [r.op for r in world_calls][-1:] == ["barrier"]
    finally:
        comm.close()


def test_the_recorder_switched_off_records_nothing_and_the_results_stay_exact(
    plain_world: World,
) -> None:
    world = plain_world
    rec = flight.recorder()
    comm = collectives.Communicator(world)
    x = np.full(8, world.rank + 1, np.int32)
    want = np.full(8, sum(range(1, world.world_size + 1)), np.int32)
    try:
        comm.all_reduce(x)
        rec.enabled = False
        before = rec.log().recorded
        for _ in range(3):
            assert np.array_equal(comm.all_reduce(x), want)
        assert rec.log().recorded == before
    finally:
        rec.enabled = True
        comm.close()
    if replay_status() == "C":  # the C replay's own records, back on
        comm = collectives.Communicator(world)
        try:
            for _ in range(3):
                assert np.array_equal(comm.all_reduce(x), want)
            assert [r.state for r in _mine(rec, comm.stream, before)] == ["done"] * 3
            assert world.num_nodes > 1 or _c_runs(comm)
        finally:
            comm.close()


def test_a_call_that_times_out_is_recorded_failed() -> None:
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=0.5)
    try:
        if world.world_size == 1:
            pytest.skip("needs a peer that does not come")
        rec = flight.recorder()
        comm = collectives.Communicator(world)
        x = np.ones(4, np.float32)
        comm.all_reduce(x)
        comm.all_reduce(x)  # cached
        seen: tuple[object, ...] = ()
        if world.rank == 0:
            with pytest.raises(SignalTimeoutError):
                comm.all_reduce(x)  # the others never come
            last = rec.log().records[-1]
            seen = (last.op, last.state, last.stream == comm.stream, last.seq)
            seen += (last.t_end > last.t_start,)
        seen = MPI.COMM_WORLD.bcast(seen, root=0)  # (every rank gives the same verdict)
        assert seen == ("all_reduce", "failed", True, 3, True), seen
    finally:
        world._abandon()  # the communicator is out of step on purpose
