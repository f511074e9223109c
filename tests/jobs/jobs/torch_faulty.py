"""A torch job on the symheap backend that misbehaves on rank 1 (issue 31's failure cases).

usage: torch_faulty.py MODE EVENT_FILE [TIMEOUT_S], MODE one of env, ok, raise, kill, hang. Every
rank all-reduces in a loop; at call 5 rank 1 raises ``ValueError`` (raise), kills itself
with SIGKILL (kill) or sleeps for 60 s (hang), writing the time into EVENT_FILE just before.
TIMEOUT_S (optional) is passed to ``init_process_group(timeout=...)``. ``env`` prints the
variables torch's ``env://`` init reads.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    mode, event_file = sys.argv[1], sys.argv[2]
    if mode == "env":  # what torch's env:// init reads, as the launcher set it
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
        print("ENV", *(os.environ[k] for k in (*names, "MASTER_PORT")))
        return
    timeout = datetime.timedelta(seconds=float(sys.argv[3])) if len(sys.argv) > 3 else None
    dist.init_process_group("symheap", timeout=timeout)
    rank = dist.get_rank()
    x = torch.ones(1000)
    for call in range(10):
        if call == 5 and rank == 1 and mode != "ok":
            with open(event_file, "w") as fh:
                fh.write(repr(time.time()))
            if mode == "raise":
                raise ValueError("injected failure in the training loop")
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "hang":
                time.sleep(60)
        y = x.clone()
        dist.all_reduce(y)
    dist.destroy_process_group()
    print(f"rank {rank} done: {float(y[0])}")


if __name__ == "__main__":
    main()
