"""The soak's long form as a matrix of jobs (docs/reliability.md, "Soak"): each seed a job of
``--seconds`` through the launcher, at a rank count and node split, on MPICH and/or Open MPI;
one markdown row per job (appended to ``--out`` as it finishes), and a summary.

    python scripts/soak_matrix.py --seeds 1-10 --ranks 2,3,4 --split rank --seconds 300 \\
        --mpi mpich --out docs/results/soak_mpich.md
    .venv-openmpi/bin/python scripts/soak_matrix.py --seeds 11-20 --mpi openmpi ...

The rank count cycles over ``--ranks`` from seed to seed (seeds 1, 2, 3 at 2, 3, 4 ranks...),
and so does the split over ``--split`` (``node``, ``rank`` or a number of ranks per node).
A job passes when it exits 0 and rank 0 prints ``soak ok``. Exit status: the number of jobs
that failed (0: all passed).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_OK = re.compile(r"soak ok: (\d+) operations in (\d+) s .*RSS \+([\d.]+) MiB")


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _env(split: str) -> dict[str, str]:
    """The job's environment: the launcher adds Open MPI's own settings (launch/command.py:
    across simulated nodes its TCP transport, where the sm one grows RMA targets)."""
    return {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split, "SHMEM_BACKEND": "host"}


def run_job(ranks: int, split: str, seed: int, seconds: float, log_dir: Path) -> tuple[bool, str]:
    """One soak job; (passed, what it said: the ok line's figures, or the failure's tail)."""
    cmd = [
        sys.executable,
        "-m",
        "launch",
        "-n",
        str(ranks),
        "--timeout",
        str(int(seconds * 2 + 120)),
    ]
    cmd += ["--log-dir", str(log_dir), "scripts/soak.py", "--seconds", str(seconds)]
    cmd += ["--seed", str(seed)]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=_env(split),
        capture_output=True,
        text=True,
        timeout=seconds * 2 + 300,
        check=False,
    )
    found = _OK.search(proc.stdout)
    if proc.returncode == 0 and found:
        ops, took, rss = found.groups()
        return True, f"{ops} operations in {took} s, RSS +{rss} MiB (rank 0)"
    tail = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "root cause" in ln]
    return False, f"exit {proc.returncode}: " + (tail[0] if tail else proc.stderr[-300:]).strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 1,4,7")
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--split", default="rank", help="node, rank or N, comma-separated")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--mpi", default="mpich", choices=["mpich", "openmpi"])
    ap.add_argument("--out", type=Path, default=None, help="markdown file to append rows to")
    ap.add_argument("--log-dir", type=Path, default=Path("logs/soak"))
    args = ap.parse_args()
    import mpi4py

    mpi4py.rc.initialize = False  # (only which MPI this interpreter's mpi4py runs on)
    from mpi4py import MPI

    vendor = "mpich" if MPI.get_vendor()[0] == "MPICH" else "openmpi"
    if args.mpi != vendor:
        ap.error(f"--mpi {args.mpi}: this interpreter's mpi4py runs on {vendor} (use its venv)")
    ranks = [int(r) for r in args.ranks.split(",")]
    splits = args.split.split(",")
    rows = []
    failed = 0
    for i, seed in enumerate(_seeds(args.seeds)):
        n, split = ranks[i % len(ranks)], splits[i % len(splits)]
        start = time.strftime("%Y-%m-%d %H:%M")
        ok, said = run_job(n, split, seed, args.seconds, args.log_dir / f"{args.mpi}-{seed}")
        failed += not ok
        verdict = "ok" if ok else "FAILED"
        row = f"| {start} | {args.mpi} | {n} | {split} | {seed} | {verdict} | {said} |"
        rows.append(row)
        print(row, flush=True)
        if args.out is not None:
            new = not args.out.exists()
            with args.out.open("a") as f:
                if new:
                    f.write("| started | MPI | ranks | split | seed | result | figures |\n")
                    f.write("|---|---|---|---|---|---|---|\n")
                f.write(row + "\n")
    print(f"{len(rows) - failed} of {len(rows)} soak jobs passed", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
