"""The benchmarks' shared harness: timing, statistics, and JSON-lines records with the git sha.

Every benchmark writes one JSON line per measurement (``append_jsonl``), each carrying the
commit it measured (``git_sha``), and reports median/p10/p90 (``stats_us``) next to the peer's
figure from the same run. Timings on shared machines vary run to run: compare only within one
run, as ratios.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "append_jsonl",
    "git_sha",
    "interleaved",
    "median_seconds",
    "size_steps",
    "stats_us",
    "timed_max_over_ranks",
]


@cache
def git_sha() -> str:
    """The short sha of the checked-out commit, or ``"unknown"`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def stats_us(samples: Iterable[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile of ``samples`` (seconds), in microseconds."""
    a = np.asarray(list(samples), dtype=np.float64) * 1e6
    return {
        "median_us": float(np.median(a)),
        "p10_us": float(np.percentile(a, 10)),
        "p90_us": float(np.percentile(a, 90)),
    }


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def cuda_median_seconds(stream: Any, fn: Callable[[], object], repeat: int) -> float:
    """Median seconds per call of ``fn`` on a cuda.core ``stream``: CUDA events around each
    call, after one warm-up call."""
    from cuda.core import EventOptions

    fn()
    stream.sync()
    times = []
    for _ in range(repeat):
        start = stream.record(options=EventOptions(timing_enabled=True))
        fn()
        end = stream.record(options=EventOptions(timing_enabled=True))
        end.sync()
        times.append((end - start) / 1e3)
    return float(np.median(times))


def timed_max_over_ranks(fn: Callable[[], object], iters: int, comm: Any) -> float:
    """Seconds per call of ``fn`` over ``iters`` back-to-back calls, the slowest rank's
    (collective over ``comm``, an mpi4py communicator; ranks start together)."""
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    local = (time.perf_counter() - t0) / iters
    return float(comm.allreduce(local, op=MPI.MAX))


def interleaved(
    fns: Mapping[str, Callable[[], object]], blocks: int, iters: int, comm: Any
) -> dict[str, list[float]]:
    """Per contender, ``blocks`` samples of :func:`timed_max_over_ranks` (``iters`` calls),
    the contenders taking turns block by block and each leading in turn, after one warm-up
    call each (plans, scratch growth, caches)."""
    samples: dict[str, list[float]] = {key: [] for key in fns}
    for fn in fns.values():
        fn()
    order = list(fns)
    for block in range(blocks):
        for key in order[block % len(order) :] + order[: block % len(order)]:
            samples[key].append(timed_max_over_ranks(fns[key], iters, comm))
    return samples


def size_steps(lo: int, hi: int, step: int) -> list[int]:
    """``lo``, ``lo * step``, ... below ``hi``, then ``hi``."""
    sizes, nbytes = [], lo
    while nbytes < hi:
        sizes.append(nbytes)
        nbytes *= step
    return [*sizes, hi]


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append one JSON line per record to ``path`` (its folder is created); each record gets
    the ``git_sha`` of the measured commit unless it has one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for rec in records:
            fh.write(json.dumps({"git_sha": git_sha(), **rec}) + "\n")
