"""The fault matrix: rank 1 fails in each way and place; the launcher must name it, with its
own exit code, and end the job at once. Prints one table row per case.

    python scripts/faults.py                       # every case once at 2, 3 and 4 ranks
    python scripts/faults.py --runs 50 --kinds kill,segv,oexit --where barrier --ranks 2,3,4

Columns: case, ranks, runs, right rank (%), right exit code (%), slowest end after the fault
(seconds, from the fault's timestamp to the launcher's exit). Exit status 1 when any run
named the wrong rank or code. Not part of CI (it runs hundreds of jobs); the CI tests
(tests/jobs/test_launcher.py) run one job of each kind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from fault_job import EXPECTED_EXIT  # noqa: E402

KINDS = ("raise", "exit", "oexit", "kill", "segv")
WHERE = ("init", "barrier", "allreduce", "forward", "backward", "wait", "ipc")
THREADS = ("main", "thread")


def one_run(
    kind: str, where: str, thread: str, ranks: int, split: str = "node"
) -> tuple[bool, bool, float, str]:
    """``(right rank, right exit code, seconds from fault to end, stderr)``."""
    with tempfile.TemporaryDirectory() as tmp:
        event = Path(tmp) / "event"
        cmd = [
            sys.executable,
            "-m",
            "launch",
            "-n",
            str(ranks),
            "--timeout",
            "60",
            str(ROOT / "scripts" / "fault_job.py"),
            kind,
            where,
            thread,
            str(event),
        ]
        env = {**os.environ, "SHMEM_BACKEND": "host", "SHMEM_HEAP_NODE_SPLIT": split}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
        )
        end = time.time()
        fault_at = float(event.read_text()) if event.exists() else end
    named = re.search(rf"root cause: rank 1 of {ranks}\b", proc.stderr) is not None
    return named, proc.returncode == EXPECTED_EXIT[kind], end - fault_at, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--where", default=",".join(WHERE))
    parser.add_argument("--threads", default=",".join(THREADS))
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--split", default="node", help='heap.node_split: "node" or "rank" (RMA)')
    parser.add_argument("--show-failures", action="store_true")
    args = parser.parse_args(argv)
    bad = 0
    print("| case | ranks | runs | right rank | right exit code | slowest end (s) |")
    print("|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for where in args.where.split(","):
            for thread in args.threads.split(","):
                if kind == "exit" and thread == "thread":
                    continue  # SystemExit ends only its own thread, as in plain Python
                for ranks in (int(n) for n in args.ranks.split(",")):
                    rank_ok = code_ok = 0
                    slowest = 0.0
                    for _ in range(args.runs):
                        named, code, took, err = one_run(kind, where, thread, ranks, args.split)
                        rank_ok += named
                        code_ok += code
                        slowest = max(slowest, took)
                        if args.show_failures and not (named and code):
                            print(err[-2000:], file=sys.stderr)
                    bad += (args.runs - rank_ok) + (args.runs - code_ok)
                    print(
                        f"| {kind} {where} {thread} | {ranks} | {args.runs} | "
                        f"{100 * rank_ok / args.runs:.0f}% | {100 * code_ok / args.runs:.0f}% | "
                        f"{slowest:.2f} |",
                        flush=True,
                    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
