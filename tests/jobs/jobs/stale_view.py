"""Keeps zero-copy views of the heap across finalize() and touches them afterwards: that must
not crash the process (issue 15, point 9)."""

from __future__ import annotations

import numpy as np

import shmem


def main() -> None:
    world = shmem.init(heap_nbytes="16MiB")
    x = world.zeros(1024, "float64")
    mine = x.local()
    right = x.peer((world.rank + 1) % world.world_size)
    mine[...] = 1.0
    world.barrier()
    world.finalize()
    # every view outlived the heap: reading and writing them must not fault
    total = float(np.asarray(mine).sum())
    mine[:4] = 2.0
    if right is not None:
        total += float(np.asarray(right).sum())
    print(f"stale views ok: read {total:g} after finalize")


if __name__ == "__main__":
    main()
