"""A job whose last rank makes another call than the others (tests/jobs/test_mismatch_jobs.py):
every rank raises CollectiveMismatchError, uncaught, and the launcher reports the job.

    python -m launch -n 3 --log-dir logs tests/jobs/jobs/mismatched.py CASE

CASE: ``collective`` (an all-reduce against a broadcast), ``count`` (all-reduces of 16 and 17
elements), ``cached`` (the others' all-reduce replays a cached plan), ``barrier`` (a barrier
against an all-reduce), ``allocation`` (World.empty of 16 and 17 elements), ``attention``
(sequence-parallel attention against an all-reduce)."""

from __future__ import annotations

import sys

import numpy as np

import collectives
import shmem
from collectives.mha import sequence_parallel_attention

case = sys.argv[1]
with shmem.init(signal_timeout_s=20.0) as world:
    comm = collectives.Communicator(world)
    comm.all_reduce(np.ones(4, np.float32))  # call 1, matched
    if case == "cached":
        comm.all_reduce(np.ones(16, np.float32))  # call 2: the plan is made
    odd = world.rank == world.world_size - 1
    x = np.ones(17 if (odd and case in ("count", "cached")) else 16, np.float32)
    if case == "allocation":
        world.empty(17 if odd else 16, "float32")
    elif not odd or case in ("count", "cached"):
        if case == "attention":
            q = np.zeros((4, 2, 8), np.float32)
            sequence_parallel_attention(comm, q, q, q)
        else:
            comm.all_reduce(x)
    elif case == "barrier":
        comm.barrier()
    elif case == "attention":
        comm.all_reduce(x)
    else:
        comm.broadcast(x, root=0)
