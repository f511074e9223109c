"""A job in which rank 1 stops making progress at one of its calls (the stall tests).

usage: stall_job.py MODE WHERE EVENT_FILE [--at N] [--signal-timeout S] (run by
scripts/faults.py --stalls and the jobs tier, tests/jobs/test_stalls.py)

MODE: ``stop`` (rank 1 sends itself SIGSTOP), ``spin`` (an endless pure-Python loop),
``sleep`` (blocked in C: ``time.sleep``), ``lock`` (a deadlock on a ``threading.Lock``).
WHERE, what every rank calls 40 times (rank 1 stalls before its call number ``--at``,
default 21):

* ``all_reduce``: a small all-reduce (the cached replay);
* ``family``: reduce-scatter, all-gather, broadcast and all-to-all in turn;
* ``barrier``: ``World.barrier``;
* ``wait_until``: rank 1 signals every other rank, which waits with ``World.wait_until``
  naming no peer (the flight recorder must find rank 1);
* ``attention``: sequence-parallel attention (4 rows per rank);
* ``team``: a Communicator of the team of ranks 0 and 1 (its collectives are MPI calls; the
  other ranks wait in ``World.barrier`` at the end);
* ``mpi``: the user's own ``MPI.COMM_WORLD.Barrier()``: nothing has a deadline, only the
  launcher's ``--stall-timeout`` ends the job.

Every rank's signal timeout is ``--signal-timeout`` (3 s); rank 1 writes the time into
EVENT_FILE as it stalls.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import numpy as np
from mpi4py import MPI

import collectives
import shmem
from collectives.mha import sequence_parallel_attention

PLACES = ("all_reduce", "family", "barrier", "wait_until", "attention", "team", "mpi")


def stall(mode: str, event_file: str) -> None:
    with open(event_file, "w") as fh:
        fh.write(repr(time.time()))
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)  # continued (Open MPI sends SIGCONT before its kill): still stalled
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
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("stop", "spin", "sleep", "lock"))
    parser.add_argument("where", choices=PLACES)
    parser.add_argument("event_file")
    parser.add_argument("--at", type=int, default=21)
    parser.add_argument("--signal-timeout", type=float, default=3.0)
    args = parser.parse_args()
    world = shmem.init(heap_nbytes="16MiB", signal_timeout_s=args.signal_timeout)
    if args.where == "team":  # ranks 0 and 1 only (the others get no team)
        team = world.team_world.split_strided(0, 1, 2)
        comm = collectives.Communicator(team) if team is not None else None
    else:
        comm = collectives.Communicator(world)
    x = np.ones(8 * world.world_size, np.float32)
    q = np.ones((4, 1, 8), np.float32)
    for call in range(1, 41):
        if world.rank == 1 and call == args.at:
            stall(args.mode, args.event_file)
        if args.where == "team":
            if comm is not None:
                comm.all_reduce(x)
            continue
        assert comm is not None
        if args.where == "all_reduce":
            comm.all_reduce(x)
        elif args.where == "family":
            (comm.reduce_scatter, comm.all_gather, comm.broadcast, comm.all_to_all)[call % 4](x)
        elif args.where == "barrier":
            world.barrier()
        elif args.where == "wait_until":
            if world.rank == 1:
                for r in range(world.world_size):
                    if r != 1:
                        world.signal(r, 0, call)
            else:
                world.wait_until(0, "ge", call)
        elif args.where == "attention":
            sequence_parallel_attention(comm, q, q, q)
        else:
            MPI.COMM_WORLD.Barrier()
    world.barrier()
    if comm is not None:
        comm.close()
    world.finalize()


if __name__ == "__main__":
    main()
