"""A shared work queue: ranks take task numbers from a counter on rank 0 with fetch-add.

Each task is taken exactly once, whoever is fastest takes more: the idea behind the dynamic
tile scheduler of the attention kernels.

    python -m launch -n 4 examples/02_work_queue.py
"""

from __future__ import annotations

import time

import numpy as np

import shmem

NUM_TASKS = 200


def main() -> None:
    with (
        shmem.init() as world,
        world.zeros(1, "int64") as counter,
        world.zeros(NUM_TASKS, "int32") as owner,
    ):
        mine = []
        while (task := counter.atomic_fetch_add(0, 0, 1)) < NUM_TASKS:
            time.sleep(0.0002 * (1 + world.rank % 2))  # odd ranks are slower
            mine.append(task)
            owner.put(0, np.array([world.rank + 1], np.int32), offset=task * 4)
        counts = world.comm.gather(len(mine), root=0)
        world.barrier()
        if counts is not None:  # rank 0
            assert (owner.to_numpy() > 0).all(), "every task was taken"  # either backend
            assert sum(counts) == NUM_TASKS, "and taken exactly once"
            print(f"work queue ok: {NUM_TASKS} tasks, taken per rank: {counts}")


if __name__ == "__main__":
    main()
