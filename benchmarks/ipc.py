"""IPC export + import latency, and reading imported memory against local memory (same run).

    cd benchmarks && python ipc.py --out ../results/ipc.jsonl

* ``export_import``: ``ipc.export`` then ``ipc.import_`` of a 4 KiB buffer and ``close``,
  through the Unix-socket service in this process; median/p10/p90 of 1000.
* ``read``: ``sum`` over a 256 MiB buffer imported from a child process (memfd, mapped here)
  against the same over an ordinary local numpy array, interleaved; bandwidth =
  nbytes / time, and the ratio imported / local.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import append_jsonl, git_sha, stats_us

from shmem import ipc

EXPORTER = """
import sys
import numpy as np
from shmem import ipc
b = ipc.allocate(int(sys.argv[1]) // 8, "float64")
b.array[...] = 1.0
print(ipc.export(b), flush=True)
sys.stdin.readline()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("../results/ipc.jsonl"))
    args = ap.parse_args()
    common: dict[str, Any] = {"git_sha": git_sha(), "backend": "host"}
    records = []
    # export + import latency
    buf = ipc.allocate(512, "float64")
    samples = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        imported = ipc.import_(ipc.export(buf))
        imported.close()
        samples.append(time.perf_counter() - t0)
    buf.close()
    records.append({"bench": "ipc_export_import", **common, "nbytes": 4096, **stats_us(samples)})
    print(
        f"export+import: median {records[-1]['median_us']:.1f} us "
        f"(p10 {records[-1]['p10_us']:.1f}, p90 {records[-1]['p90_us']:.1f})"
    )
    # read bandwidth: imported from another process vs local
    nbytes = args.mib << 20
    child = subprocess.Popen(
        [sys.executable, "-c", EXPORTER, str(nbytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    remote = ipc.import_(child.stdout.readline().strip())
    local = np.ones(nbytes // 8, np.float64)
    t_imp: list[float] = []
    t_loc: list[float] = []
    for _ in range(7):
        for arr, out in ((remote.array, t_imp), (local, t_loc)):
            t0 = time.perf_counter()
            total = float(arr.sum())
            out.append(time.perf_counter() - t0)
            assert total == nbytes // 8
    remote.close()
    child.stdin.write("\n")
    child.stdin.flush()
    child.wait(timeout=30)
    bw_imp, bw_loc = nbytes / float(np.median(t_imp)) / 1e9, nbytes / float(np.median(t_loc)) / 1e9
    records.append(
        {
            "bench": "ipc_read",
            **common,
            "nbytes": nbytes,
            "imported_GBps": bw_imp,
            "local_GBps": bw_loc,
            "ratio": bw_imp / bw_loc,
            "imported": stats_us(t_imp),
            "local": stats_us(t_loc),
        }
    )
    print(
        f"read {args.mib} MiB: imported {bw_imp:.2f} GB/s, local {bw_loc:.2f} GB/s, "
        f"ratio {bw_imp / bw_loc:.2f}"
    )
    append_jsonl(args.out, records)


if __name__ == "__main__":
    main()
