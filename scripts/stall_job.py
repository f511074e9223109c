"""A job in which rank 1 stops making progress at its 21st collective call (the stall tests).

usage: stall_job.py MODE WHERE EVENT_FILE (run by scripts/faults.py --stalls and the
jobs tier, tests/jobs/test_stalls.py)

MODE: ``stop`` (rank 1 sends itself SIGSTOP), ``spin`` (an endless pure-Python loop),
``sleep`` (blocked in C: ``time.sleep``), ``lock`` (a deadlock on a ``threading.Lock``).
WHERE: ``all_reduce`` (a loop of small all-reduces), ``barrier`` (World.barrier).
Every rank's signal timeout is 3 s; rank 1 writes the time into EVENT_FILE as it stalls.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

import collectives
import shmem


def stall(mode: str, event_file: str) -> None:
    with open(event_file, "w") as fh:
        fh.write(repr(time.time()))
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "spin":
        n = 0
        while True:
            n += 1
    elif mode == "sleep":
        time.sleep(600)
    elif mode == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # a deadlock: never returns
    raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    mode, where, event_file = sys.argv[1:4]
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=3.0)
    comm = collectives.Communicator(world)
    x = np.ones(8, np.float32)
    for call in range(1, 41):
        if world.rank == 1 and call == 21:
            stall(mode, event_file)
        if where == "all_reduce":
            comm.all_reduce(x)
        elif where == "barrier":
            world.barrier()
        else:
            raise SystemExit(f"unknown place {where!r}")
    comm.close()
    world.finalize()


if __name__ == "__main__":
    main()
