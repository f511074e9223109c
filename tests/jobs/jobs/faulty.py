"""A job that misbehaves on rank 1 on request (fault injection for the launcher tests).

usage: faulty.py MODE EVENT_FILE, MODE one of ok, raise, exit3, kill, hang, thread,
thread_exit0, oexit7, segv, peer, world_kill (rank 1 is killed after every rank made a
World: MPI shared-memory segments are live), gexit0 / gexit6 (every rank makes a World and
rank 1 ends the job with ``shmem.global_exit(0 or 6)`` while the others wait in a barrier).
Rank 1 writes the time of the event into EVENT_FILE just before it; the other ranks wait
in a barrier that rank 1 never reaches. In ``peer`` rank 1 tells the others it failed, and
they raise ``PeerFailedError`` at once, while rank 1 takes 0.3 s to ``sys.exit(5)`` (as a
failing collective warns its peers before its own exception unwinds).
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
    if mode == "world_kill":
        import shmem

        world = shmem.init(heap_nbytes="16MiB")
        world.barrier()
        mode = "kill"
    if mode in ("gexit0", "gexit6"):
        import shmem

        world = shmem.init(heap_nbytes="16MiB")
        world.barrier()
        if comm.Get_rank() == 1:
            with open(event_file, "w") as fh:
                fh.write(repr(time.time()))
            time.sleep(0.2)  # the others are in the barrier below by now
            shmem.global_exit(int(mode[5:]))
        world.barrier(timeout=3600)  # never left: rank 1 ended the job
        print(f"rank {comm.Get_rank()} NOT ENDED")
    if mode == "peer" and comm.Get_rank() != 1:
        from shmem.errors import PeerFailedError

        comm.recv(source=1)
        raise PeerFailedError("a peer failed: rank 1", failed_rank=1)
    if comm.Get_rank() == 1 and mode != "ok":
        with open(event_file, "w") as fh:
            fh.write(repr(time.time()))
        if mode == "raise":
            raise ValueError("injected failure")
        if mode == "exit3":
            sys.exit(3)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "oexit7":
            os._exit(7)
        if mode == "segv":
            import ctypes

            ctypes.string_at(0)  # a NULL read: SIGSEGV
        if mode == "peer":
            for r in range(comm.Get_size()):
                if r != 1:
                    comm.send("failed", dest=r)
            time.sleep(0.3)
            sys.exit(5)
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
