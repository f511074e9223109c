"""Average gradients across ranks with a deterministic all-reduce on symmetric memory.

The gradient lives in a SHMEMBuffer, so the all-reduce reads every rank's copy in place
(zero-copy); bfloat16 is accumulated in float32 and rounded once, in rank order, so every rank
gets bitwise the same average, run after run.

    python -m launch -n 4 examples/04_allreduce.py
"""

from __future__ import annotations

import hashlib

import numpy as np

import collectives
import shmem

N = 61440  # divisible by 1 to 6 ranks: reduce-scatter shards all-gather evenly


def main() -> None:
    with (
        shmem.init() as world,
        collectives.Communicator(world) as comm,
        world.empty(N, "bfloat16") as grad,
    ):
        rng = np.random.default_rng(world.rank)
        # a put to this rank's own copy: host memory or a GPU's, the same call
        grad.put(world.rank, rng.standard_normal(N).astype(grad.dtype))
        comm.all_reduce(grad, op="avg", out=grad)  # in place, zero-copy
        avg = grad.to_numpy()  # numpy on either backend (a copy from a GPU)
        digests = world.comm.allgather(hashlib.sha256(avg.tobytes()).hexdigest())
        assert len(set(digests)) == 1, "every rank holds the same average"
        with world.empty(N, "float32") as wide:
            wide.put(world.rank, avg.astype(np.float32))
            chunk = comm.reduce_scatter(wide, op="max")
            gathered = comm.all_gather(chunk)
            assert gathered.shape[0] == N
        if world.rank == 0:
            print(
                f"all-reduce ok: {world.world_size} ranks averaged {N} bfloat16 values; "
                f"algorithms used {comm.stats.algorithms}"
            )


if __name__ == "__main__":
    main()
