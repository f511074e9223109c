"""A job that misbehaves on rank 1 on request (fault injection for the launcher tests).

usage: faulty.py MODE EVENT_FILE, MODE one of ok, raise, exit3, kill, hang, thread,
thread_exit0.
Rank 1 writes the time of the event into EVENT_FILE just before it; the other ranks wait
in a barrier that rank 1 never reaches.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from mpi4py import MPI


def main() -> None:
    mode, event_file = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.Get_rank() == 1 and mode != "ok":
        with open(event_file, "w") as fh:
            fh.write(repr(time.time()))
        if mode == "raise":
            raise ValueError("injected failure")
        if mode == "exit3":
            sys.exit(3)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "hang":
            time.sleep(3600)
        if mode == "thread":

            def boom() -> None:
                raise RuntimeError("injected failure in a thread")

            threading.Thread(target=boom).start()
            time.sleep(3600)
    if mode == "thread_exit0":  # SystemExit(0) ends only its thread, as in plain Python
        t = threading.Thread(target=sys.exit, args=(0,))
        t.start()
        t.join()
    comm.Barrier()
    print(f"rank {comm.Get_rank()} finished")


if __name__ == "__main__":
    main()
