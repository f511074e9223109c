"""The fault matrix: rank 1 fails in each way and place; the launcher must name it, with its
own exit code, and end the job at once. Prints one table row per case.

    python scripts/faults.py                       # every case once at 2, 3 and 4 ranks
    python scripts/faults.py --runs 50 --kinds kill,segv,oexit --where barrier --ranks 2,3,4

Columns: case, ranks, runs, right rank (%), right exit code (%), slowest end after the fault
(seconds, from the fault's timestamp to the launcher's exit). Exit status 1 when any run
named the wrong rank or code. Not part of CI (it runs hundreds of jobs); the CI tests
(tests/jobs/test_launcher.py) run one job of each kind.

    python scripts/faults.py --stalls               # the stall cells (issue 33)
    python scripts/faults.py --stalls --mpi openmpi --where all_reduce,mpi --ranks 3

The stall cells: rank 1 stops making progress at its 21st call (SIGSTOP, a Python loop, a
sleep in C, a lock deadlock) inside an all-reduce, the family, a barrier, a wait that names
no peer, sequence-parallel attention or a team's collective, with a 3 s signal timeout; or,
with nothing that has a deadline, before its first all-reduce (``first``: the others wait 60
s) or while the others are in the user's own MPI_Barrier (``mpi``): those end at the
launcher's ``--stall-timeout 2`` (scripts/stall_job.py). Columns: case, ranks, node split,
runs, rank 1 named as the stalled root cause (%; for ``mpi``: the report says no rank is
behind and shows every rank's stack), what it was doing reported (%), right exit code (%),
slowest report after the stall (seconds).
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
STALL_WHERE = ("all_reduce", "family", "barrier", "wait_until", "attention", "team", "first", "mpi")
STALL_STATE = {"stop": "stopped", "spin": "running", "sleep": "sleeping", "lock": "sleeping"}
_NO_DEADLINE = {  # the cells only the stall timeout ends: the job's arguments
    "first": ("all_reduce", "--at", "1", "--signal-timeout", "60"),
    "mpi": ("mpi",),
}


def one_stall(
    mode: str, where: str, ranks: int, split: str, mpi: str = "auto", stall_timeout: float = 0
) -> tuple[bool, bool, bool, float, str]:
    """``(rank 1 named as stalled, its state reported, right exit code, seconds from the
    stall to the end, stderr)``."""
    with tempfile.TemporaryDirectory() as tmp:
        event = Path(tmp) / "event"
        cmd = [sys.executable, "-m", "launch", "-n", str(ranks), "--timeout", "60"]
        cmd += ["--mpi", mpi]
        job = _NO_DEADLINE.get(where, (where,))
        if where in _NO_DEADLINE:
            cmd += ["--stall-timeout", "2"]
        elif stall_timeout:  # for the waits inside MPI calls that have no deadline
            cmd += ["--stall-timeout", str(stall_timeout)]
        cmd += [str(ROOT / "scripts" / "stall_job.py"), mode, job[0], str(event), *job[1:]]
        env = {**os.environ, "SHMEM_BACKEND": "host", "SHMEM_HEAP_NODE_SPLIT": split}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
        )
        end = time.time()
        stalled_at = float(event.read_text()) if event.exists() else end
    if where == "mpi":  # nobody is behind: every rank's state and stack are the report
        named = "no rank is behind the others" in proc.stderr
        asked = ranks - (mode == "stop")  # (a stopped process cannot dump its stacks)
        named = named and proc.stderr.count("its Python stacks (rank.") >= asked
    else:
        named = re.search(rf"root cause: rank 1 of {ranks} .* stalled: ", proc.stderr) is not None
    state = f"what rank 1 was doing: {STALL_STATE[mode]}" in proc.stderr
    # (a wait inside an MPI call with no deadline ends at the stall timeout, if one is given)
    codes = {125} if where in _NO_DEADLINE else {1, 125} if stall_timeout else {1}
    code = proc.returncode in codes
    return named, state, code, end - stalled_at, proc.stderr


def stall_matrix(
    runs: int,
    ranks: list[int],
    show: bool,
    where: list[str],
    mpi: str,
    splits: list[str],
    stall_timeout: float = 0,
) -> int:
    """Print the stall cells' table; the number of runs that named the wrong rank."""
    bad = 0
    print(
        "| stall | ranks | node split | runs | rank named | state reported | exit code | "
        "slowest (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for place in where:
        for mode in STALLS:
            for n in ranks:
                for split in splits:
                    ok = told = right = 0
                    slowest = 0.0
                    for _ in range(runs):
                        named, state, code, took, err = one_stall(
                            mode, place, n, split, mpi, stall_timeout
                        )
                        ok += named
                        told += state
                        right += code
                        slowest = max(slowest, took)
                        if show and not (named and state and code):
                            print(err[-2000:], file=sys.stderr)
                    bad += runs - min(ok, right)
                    print(
                        f"| {mode} in {place} | {n} | {split} | {runs} | "
                        f"{100 * ok / runs:.0f}% | {100 * told / runs:.0f}% | "
                        f"{100 * right / runs:.0f}% | {slowest:.1f} |",
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
    parser.add_argument(
        "--split", default="node", help='heap.node_split: "node", "rank" (RMA) or "both"'
    )
    parser.add_argument("--mpi", default="auto", help="python -m launch --mpi (the stall cells)")
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=0,
        help="the stall cells: python -m launch --stall-timeout S for every cell",
    )
    parser.add_argument("--show-failures", action="store_true")
    parser.add_argument("--stalls", action="store_true", help="the stall cells instead")
    args = parser.parse_args(argv)
    if args.stalls:
        counts = [int(n) for n in args.ranks.split(",")]
        places = args.where.split(",") if args.where != ",".join(WHERE) else list(STALL_WHERE)
        splits = ["node", "rank"] if args.split == "both" else [args.split]
        bad = stall_matrix(
            args.runs, counts, args.show_failures, places, args.mpi, splits, args.stall_timeout
        )
        return 1 if bad else 0
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
