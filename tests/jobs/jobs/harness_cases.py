"""Cases for the MPI test harness itself (run by tests/jobs/test_harness.py, not by CI's MPI
steps: the file name does not match test_*.py)."""

from __future__ import annotations

import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi


def test_fails_on_rank_1_only() -> None:
    assert MPI.COMM_WORLD.Get_rank() != 1, "rank 1 disagrees"


def test_runs_in_step_afterwards() -> None:
    # every rank reaches this test together: a collective pairs up correctly
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()


def test_rank_1_fails_before_a_collective() -> None:
    if MPI.COMM_WORLD.Get_rank() == 1:
        raise RuntimeError("rank 1 gave up before the collective")
    MPI.COMM_WORLD.Barrier()  # the other ranks wait here for rank 1, forever
