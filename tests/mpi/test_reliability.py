"""Reliability holes (issue 15, points 5, 6 and 9), each test written to fail first."""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import shmem
from shmem import World
from shmem.errors import (
    ArgumentError,
    CollectiveArgumentError,
    PeerFailedError,
    ShmemStateError,
    SignalTimeoutError,
)

pytestmark = pytest.mark.mpi


# -- point 5: the debug checks keep the deadline --------------------------------------------


def test_symmetry_check_times_out_instead_of_blocking() -> None:
    """With check_symmetry on, a rank that never allocates used to leave the others in a
    blocking MPI all-gather until the launcher's timeout."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=0.5, heap_check_symmetry=True)
    try:
        if world.world_size == 1:
            pytest.skip("needs a missing peer")
        start = time.monotonic()
        if world.rank != 0:
            with pytest.raises(SignalTimeoutError, match=r"World.empty: rank \d+ timed out"):
                world.empty(4, "float32")
            assert time.monotonic() - start < 5
            with pytest.raises(ShmemStateError, match="out of step"):
                world.empty(4, "float32")  # the World is unusable after that
        else:
            time.sleep(1.0)  # rank 0 arrives late: after the others gave up
            with contextlib.suppress(shmem.ShmemError):
                world.empty(4, "float32")
        MPI.COMM_WORLD.Barrier()
    finally:
        world._abandon()  # the heaps are out of step on purpose


def test_argument_check_times_out_instead_of_blocking() -> None:
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=0.5, collectives_check_args=True)
    try:
        comm = collectives.Communicator(world)
        if world.world_size == 1:
            comm.close()
            pytest.skip("needs a missing peer")
        if world.rank != 0:
            start = time.monotonic()
            with pytest.raises(SignalTimeoutError, match=r"all_reduce: rank \d+ timed out"):
                comm.all_reduce(np.ones(4, np.float32))
            assert time.monotonic() - start < 5
        else:
            time.sleep(1.0)
            start = time.monotonic()
            # the others gave up: this rank is told (a peer's abort) or times out, never hangs
            with pytest.raises((PeerFailedError, SignalTimeoutError)):
                comm.all_reduce(np.ones(4, np.float32))
            assert time.monotonic() - start < 5
        MPI.COMM_WORLD.Barrier()
        comm._closed = True  # out of step on purpose
    finally:
        world._abandon()


# -- point 6: no poisoned or half-done collective -------------------------------------------


def test_a_read_only_out_is_refused_before_any_flag(world: World) -> None:
    with collectives.Communicator(world) as comm:
        out = np.zeros((2, 2), np.float32)
        out.flags.writeable = False
        with pytest.raises(CollectiveArgumentError, match="out must be writeable"):
            comm.all_reduce(np.ones((2, 2), np.float32), out=out)
        got = comm.all_reduce(np.ones(4, np.float32))  # still in step
        assert (got == world.world_size).all()


def test_a_failed_call_stops_late_peers_and_the_communicator() -> None:
    """A rank whose call timed out warns its peers: a late peer raises PeerFailedError
    instead of completing the abandoned call against stale input; the communicator then
    refuses further calls."""
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=0.5, collectives_check_args=False)
    try:
        comm = collectives.Communicator(world)
        if world.world_size == 1 or world.num_nodes > 1:
            comm.close()
            pytest.skip("needs 2+ ranks on one node")
        x = np.full(4, world.rank + 1.0, np.float32)
        if world.rank == 0:
            time.sleep(1.5)  # late: the others have given up
            with pytest.raises(PeerFailedError, match=r"rank \d+ failed"):
                comm.all_reduce(x)
        else:
            with pytest.raises(SignalTimeoutError):
                comm.all_reduce(x)
        with pytest.raises(ShmemStateError, match="a previous call failed"):
            comm.all_reduce(x)
        world.comm.Barrier()
        comm._closed = True
    finally:
        world.finalize()


# -- point 9: small holes -------------------------------------------------------------------


def test_nan_timeouts_are_refused(world: World) -> None:
    with pytest.raises(ArgumentError, match="invalid timeout"):
        world.wait_until(0, "ge", 1, timeout=math.nan)
    with world.zeros(1, "int64") as x, pytest.raises(ArgumentError, match="invalid timeout"):
        x.wait_until("ge", 1, timeout=math.nan)


def test_a_bad_signal_slot_is_an_argument_error(world: World) -> None:
    with world.zeros(2, "int32") as x:
        with pytest.raises(ArgumentError, match="invalid signal"):
            x.put(world.rank, np.zeros(2, np.int32), signal=("a", 1))  # type: ignore[arg-type]
        world.barrier()


def test_none_is_not_a_dtype(world: World) -> None:
    with pytest.raises(ArgumentError, match=r"World.empty: unsupported dtype \(got None"):
        world.empty(4, None)  # type: ignore[arg-type]


def test_a_wait_timeout_says_who_could_have_written(world: World) -> None:
    with pytest.raises(SignalTimeoutError, match="no writer named"):
        world.wait_until(0, "ge", 1, timeout=0.01)
    world.barrier()
