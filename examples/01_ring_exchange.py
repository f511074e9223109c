"""Symmetric heap basics: every rank writes to its right neighbour and signals it.

python -m launch -n 4 examples/01_ring_exchange.py
"""

from __future__ import annotations

import numpy as np

import shmem


def main() -> None:
    with shmem.init() as world:
        right = (world.rank + 1) % world.world_size
        left = (world.rank - 1) % world.world_size
        with world.zeros((4, 1024), "bfloat16") as x:
            # one-sided write into the right neighbour's copy, then raise its slot 0
            x.put(right, np.full((4, 1024), world.rank, dtype=x.dtype), signal=(0, 1))
            world.wait_until(0, "ge", 1)  # our left neighbour's data has landed
            got = np.asarray(x.local())  # numpy on the host backend, a copy from a GPU
            assert (got == left).all(), f"rank {world.rank}: expected {left}"
            world.barrier()
            if world.rank == 0:
                print(f"ring exchange ok: {world.world_size} ranks, {x.nbytes} bytes each")


if __name__ == "__main__":
    main()
