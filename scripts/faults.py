"""The fault matrix: rank 1 fails in each way and place; the launcher must name it, with its
own exit code, and end the job at once. Prints one table row per case.

    python scripts/faults.py                       # every case once at 2, 3 and 4 ranks
    python scripts/faults.py --runs 50 --kinds kill,segv,oexit --where barrier --ranks 2,3,4

Columns: case, ranks, runs, right rank (%), right exit code (%), slowest end after the fault
(seconds, from the fault's timestamp to the launcher's exit). Exit status 1 when any run
named the wrong rank or code. Not part of CI (it runs hundreds of jobs); the CI tests
(tests/jobs/test_launcher.py) run one job of each kind.

    python scripts/faults.py --stalls               # the stall cells (issue 33)

The stall cells: rank 1 stops making progress at its 21st call (SIGSTOP, a Python loop, a
sleep in C, a lock deadlock) inside an all-reduce or a barrier, with a 3 s signal timeout
(scripts/stall_job.py). Columns: case, ranks, node split, runs, rank 1 named as the stalled
root cause (%), what it was doing reported (%), slowest report after the stall (seconds).
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


STALLS = ("stop", "spin", "sleep", "lock")
STALL_WHERE = ("all_reduce", "barrier")
STALL_STATE = {"stop": "stopped", "spin": "running", "sleep": "sleeping", "lock": "sleeping"}


def one_stall(mode: str, where: str, ranks: int, split: str) -> tuple[bool, bool, float, str]:
    """``(rank 1 named as stalled, its state reported, seconds from stall to end, stderr)``."""
    with tempfile.TemporaryDirectory() as tmp:
        event = Path(tmp) / "event"
        cmd = [sys.executable, "-m", "launch", "-n", str(ranks), "--timeout", "60"]
        cmd += [str(ROOT / "scripts" / "stall_job.py"), mode, where, str(event)]
        env = {**os.environ, "SHMEM_BACKEND": "host", "SHMEM_HEAP_NODE_SPLIT": split}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
        )
        end = time.time()
        stalled_at = float(event.read_text()) if event.exists() else end
    named = re.search(rf"root cause: rank 1 of {ranks} .* stalled: ", proc.stderr) is not None
    state = f"what rank 1 was doing: {STALL_STATE[mode]}" in proc.stderr
    return named, state, end - stalled_at, proc.stderr


def stall_matrix(runs: int, ranks: list[int], show: bool) -> int:
    """Print the stall cells' table; the number of runs that named the wrong rank."""
    bad = 0
    print("| stall | ranks | node split | runs | rank named | state reported | slowest (s) |")
    print("|---|---|---|---|---|---|---|")
    for where in STALL_WHERE:
        for mode in STALLS:
            for n in ranks:
                for split in ("node", "rank"):
                    ok = told = 0
                    slowest = 0.0
                    for _ in range(runs):
                        named, state, took, err = one_stall(mode, where, n, split)
                        ok += named
                        told += state
                        slowest = max(slowest, took)
                        if show and not (named and state):
                            print(err[-2000:], file=sys.stderr)
                    bad += runs - ok
                    print(
                        f"| {mode} in {where} | {n} | {split} | {runs} | "
                        f"{100 * ok / runs:.0f}% | {100 * told / runs:.0f}% | {slowest:.1f} |",
                        flush=True,
                    )
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--where", default=",".join(WHERE))
    parser.add_argument("--threads", default=",".join(THREADS))
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--split", default="node", help='heap.node_split: "node" or "rank" (RMA)')
    parser.add_argument("--show-failures", action="store_true")
    parser.add_argument("--stalls", action="store_true", help="the stall cells instead")
    args = parser.parse_args(argv)
    if args.stalls:
        counts = [int(n) for n in args.ranks.split(",")]
        return 1 if stall_matrix(args.runs, counts, args.show_failures) else 0
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
