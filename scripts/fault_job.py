"""One cell of the fault matrix (scripts/faults.py): rank 1 fails in a chosen way and place.

usage: python -m launch -n N scripts/fault_job.py KIND WHERE THREAD EVENT_FILE

KIND: raise, exit (sys.exit(5)), oexit (os._exit(7)), kill (SIGKILL), segv (a NULL read).
WHERE: init (before shmem.init), barrier, allreduce (inside an 8 MiB all-reduce), forward /
backward (inside sequence-parallel attention, in its guarded region), wait (while the others
wait on its signal), ipc (inside an IPC import).
THREAD: main, or thread (a worker thread of rank 1 fails while its main thread is inside the
operation).

Rank 1 writes the time of the fault into EVENT_FILE just before it happens.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

EXPECTED_EXIT = {"raise": 1, "exit": 5, "oexit": 7, "kill": 128 + 9, "segv": 128 + 11}


def fault(kind: str, event: str) -> None:
    with open(event, "w") as fh:
        fh.write(repr(time.time()))
    if kind == "raise":
        raise RuntimeError("injected fault")
    if kind == "exit":
        sys.exit(5)
    if kind == "oexit":
        os._exit(7)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segv":
        ctypes.string_at(0)
    raise SystemExit(f"fault_job: unknown kind {kind!r}")


def inject(owner: Any, name: str, kind: str, in_thread: bool, event: str) -> None:
    """Make ``owner.name``'s first call on this rank fault (or start a thread that does)."""
    original: Callable[..., Any] = getattr(owner, name)
    fired = [False]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not fired[0]:
            fired[0] = True
            if in_thread:
                threading.Thread(target=fault, args=(kind, event), daemon=True).start()
                time.sleep(0.05)  # the thread's fault lands while this call runs
            else:
                fault(kind, event)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def main() -> None:
    kind, where, thread, event = sys.argv[1:5]
    in_thread = thread == "thread"
    from mpi4py import MPI

    me = MPI.COMM_WORLD.Get_rank()
    if where == "init" and me == 1:
        if in_thread:
            threading.Thread(target=fault, args=(kind, event), daemon=True).start()
            time.sleep(30)  # the thread's fault ends the rank
        fault(kind, event)
    import collectives
    import shmem
    import shmem.ipc
    from collectives.mha import _units

    world = shmem.init(heap_nbytes="64MiB", signal_timeout_s=20.0)
    comm = collectives.Communicator(world)
    if me == 1:
        targets: dict[str, tuple[Any, str]] = {
            "barrier": (shmem.SignalPad, "barrier"),
            "allreduce": (collectives.allreduce, "reduce_into"),
            "forward": (_units, "ready"),  # inside the guarded region, on every rank
            "wait": (shmem.SignalPad, "signal"),
            "ipc": (shmem.ipc, "import_"),
        }
        if where in targets:
            inject(*targets[where], kind, in_thread, event)
    if where == "barrier":
        world.barrier()
    elif where == "allreduce":
        comm.all_reduce(np.ones(2 << 20, np.float32))
    elif where in ("forward", "backward"):
        from collectives.mha import (
            sequence_parallel_attention,
            sequence_parallel_attention_backward,
        )

        rng = np.random.default_rng(world.rank)
        q, k, v = (rng.standard_normal((256, 2, 32)).astype(np.float32) for _ in range(3))
        out, lse = sequence_parallel_attention(comm, q, k, v, causal=True, return_lse=True)
        if where == "backward":
            if me == 1:
                inject(_units, "ready", kind, in_thread, event)
            sequence_parallel_attention_backward(
                comm, np.ones_like(out), q, k, v, out, lse, causal=True
            )
    elif where == "wait":
        if me == 1:
            world.signal(0, 0, 1)
        if me == 0:
            world.wait_until(0, "ge", 1)
    elif where == "ipc":
        buf = shmem.ipc.allocate(16, "uint8")
        descs = world.comm.allgather(str(shmem.ipc.export(buf)))
        with shmem.ipc.import_(descs[(me + 1) % world.world_size]):
            pass
        world.barrier()
        buf.close()
    world.barrier()
    comm.close()
    world.finalize()


if __name__ == "__main__":
    main()
