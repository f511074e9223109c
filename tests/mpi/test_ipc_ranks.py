"""IPC between the ranks of a job: rank 0 exports, the descriptor travels with mpi4py."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from shmem import ipc

pytestmark = pytest.mark.mpi


def test_rank_to_rank_writes_both_ways() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = ipc.allocate(size * 8, "int64") if rank == 0 else None
    desc = ipc.export(buf).to_bytes() if buf is not None else None
    desc = comm.bcast(desc, root=0)
    if buf is not None:
        buf.array[...] = -1
    comm.Barrier()
    with ipc.import_(desc) as mine:
        mine.array[rank * 8 : (rank + 1) * 8] = rank  # every rank writes its slot
        comm.Barrier()
        expected = np.repeat(np.arange(size), 8)
        np.testing.assert_array_equal(mine.array, expected)  # and sees everyone's
        comm.Barrier()
    if buf is not None:
        buf.close()
