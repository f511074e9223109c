"""Every rank prints many lines, some written in pieces, all interleaved."""

from __future__ import annotations

import sys
import time

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
for i in range(200):
    if i % 10 == 0:  # a line written in three pieces, with pauses between them
        sys.stdout.write(f"rank {rank} ")
        sys.stdout.flush()
        time.sleep(0.002)
        sys.stdout.write(f"line {i}")
        sys.stdout.flush()
        time.sleep(0.002)
        sys.stdout.write("\n")
        sys.stdout.flush()
    else:
        print(f"rank {rank} line {i}", flush=True)
sys.stdout.write(f"rank {rank} last line without newline")
