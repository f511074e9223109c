"""The headline ratios in under three minutes, against a committed baseline (``./dev bench``).

    ./dev bench --quick            # measure, print, write results/quick.json
    ./dev bench --compare          # measure, and name every ratio below its baseline band
    ./dev bench --baseline         # measure 5 times, write benchmarks/baseline.json

Three jobs of 2 ranks through the launcher, each against its peer in the same run, blocks
interleaved (:func:`harness.interleaved`), medians over blocks of the slowest rank:

* ``node``: the all-reduce in the forms users write it (numpy in, numpy ``out=``; symmetric
  in, new array; symmetric in, symmetric ``out=``; in place on a symmetric buffer) at 8 B,
  4 KiB, 1 MiB and 16 MiB against ``MPI.Allreduce`` of the same size; the barrier
  (``World.barrier``) against ``MPI_Barrier``; the signal ping-pong against 8-byte
  ``Send``/``Recv`` (:func:`signal_latency.pingpong`);
* ``cross``: every rank its own node (``SHMEM_HEAP_NODE_SPLIT=rank``, MPI's network path:
  ``MPIR_CVAR_NOLOCAL=1`` / ``OMPI_MCA_btl=tcp,self``): the all-reduce of numpy and symmetric
  inputs at 4 KiB, 256 KiB and 4 MiB against ``MPI.Allreduce``;
* ``torch`` (where torch is installed): ``dist.all_reduce`` on the symheap backend at 8 KiB
  and 16 MiB against gloo's (:func:`torch_backend._contenders`).

Every ratio is the peer's time / ours (above 1: faster than the peer). Timings drift with the
machine; the baseline keeps each ratio's spread over 5 runs, and ``--compare`` names a ratio
only below its band: the lowest of the 5 runs less :data:`MARGIN` of their median. Not run in
CI (its machines are noisy); run it before and after a change on a hot path
(``tests/README.md``). In-place calls are timed on zeros, which stay finite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = HERE / "baseline.json"
MARGIN = 0.10  # of the baseline's median: how far below its lowest run a ratio may fall
NODE_SIZES = (8, 4 << 10, 1 << 20, 16 << 20)
CROSS_SIZES = (4 << 10, 256 << 10, 4 << 20)
TORCH_SIZES = (8 << 10, 16 << 20)
NETWORK = {"MPIR_CVAR_NOLOCAL": "1", "OMPI_MCA_btl": "tcp,self"}


def _iters(nbytes: int) -> int:
    """Calls per timed block: about 2 ms of MPI at 2 ranks here, 3 at least."""
    return int(max(3, min(400, (8 << 20) / max(nbytes, 64) / 8)))


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def _allreduce_forms(
    world: Any, comm: Any, nbytes: int, forms: tuple[str, ...]
) -> dict[str, Callable[[], object]]:
    """The contenders at ``nbytes`` of float32: our forms and MPI's ``Allreduce``."""
    from mpi4py import MPI

    n = max(1, nbytes // 4)
    base = (np.arange(n, dtype=np.float32) % 13) + world.rank
    host, out = base.copy(), np.empty(n, np.float32)
    sym = world.zeros(n, "float32")
    sym.local()[...] = base
    sym_out = world.zeros(n, "float32")
    in_place = world.zeros(n, "float32")  # zeros: a sum in place stays finite
    mpi_out = np.empty(n, np.float32)
    every: dict[str, Callable[[], object]] = {
        "numpy_out": lambda: comm.all_reduce(host, out=out),
        "sym_new": lambda: comm.all_reduce(sym),
        "sym_out": lambda: comm.all_reduce(sym, out=sym_out),
        "in_place": lambda: comm.all_reduce(in_place, out=in_place),
        "numpy_new": lambda: comm.all_reduce(host),
    }
    fns = {k: every[k] for k in forms}
    fns["mpi"] = lambda: world.comm.Allreduce(host, mpi_out, op=MPI.SUM)
    return fns


def _measure(fns: dict[str, Callable[[], object]], nbytes: int, blocks: int, mpi: Any) -> Any:
    from harness import interleaved

    samples = interleaved(fns, blocks, _iters(nbytes), mpi)
    return {k: float(np.median(v)) for k, v in samples.items()}


def part_node(blocks: int) -> dict[str, float]:
    """The ``node`` job (inside the launcher)."""
    from signal_latency import pingpong

    import collectives
    import shmem

    ratios: dict[str, float] = {}
    with shmem.init() as world, collectives.Communicator(world) as comm:
        forms = ("numpy_out", "sym_new", "sym_out", "in_place")
        for nbytes in NODE_SIZES:
            t = _measure(_allreduce_forms(world, comm, nbytes, forms), nbytes, blocks, world.comm)
            for form in forms:
                ratios[f"allreduce.{form}.{_size(nbytes)}"] = t["mpi"] / t[form]
        t = _measure({"ours": world.barrier, "mpi": world.comm.Barrier}, 0, blocks, world.comm)
        ratios["barrier"] = t["mpi"] / t["ours"]
        pp = pingpong(world, world.comm, 400, blocks)
        ratios["pingpong"] = pp["mpi"]["median_us"] / pp["ours"]["median_us"]
    return ratios


def part_cross(blocks: int) -> dict[str, float]:
    """The ``cross`` job: every rank its own node."""
    import collectives
    import shmem

    ratios: dict[str, float] = {}
    with shmem.init() as world, collectives.Communicator(world) as comm:
        for nbytes in CROSS_SIZES:
            fns = _allreduce_forms(world, comm, nbytes, ("numpy_new", "sym_new"))
            t = _measure(fns, nbytes, blocks, world.comm)
            ratios[f"cross.numpy.{_size(nbytes)}"] = t["mpi"] / t["numpy_new"]
            ratios[f"cross.sym.{_size(nbytes)}"] = t["mpi"] / t["sym_new"]
    return ratios


def part_torch(blocks: int) -> dict[str, float]:
    """The ``torch`` job: the symheap backend against gloo."""
    import torch
    import torch.distributed as dist
    from torch_backend import _contenders

    import shmem

    torch.set_num_threads(1)
    dist.init_process_group("symheap")
    gloo = dist.new_group(backend="gloo")
    mpi = shmem.get_world().comm
    ratios: dict[str, float] = {}
    for nbytes in TORCH_SIZES:
        n = max(nbytes // 4 // 2 * 2, 2)
        fns = _contenders("all_reduce", n, gloo)
        t = _measure({"ours": fns["ours"], "gloo": fns["gloo"]}, nbytes, blocks, mpi)
        ratios[f"torch.all_reduce.{_size(nbytes)}"] = t["gloo"] / t["ours"]
    dist.destroy_process_group()
    return ratios


PARTS = {"node": part_node, "cross": part_cross, "torch": part_torch}


def _job(part: str, blocks: int, out: Path, timeout: int) -> dict[str, float]:
    """Run one part under the launcher at 2 ranks; its ratios (rank 0 writes them)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    if part == "cross":
        env.update(NETWORK, SHMEM_HEAP_NODE_SPLIT="rank")
    cmd = [sys.executable, "-m", "launch", "-n", "2", "--timeout", str(timeout)]
    cmd += [str(HERE / "quick.py"), "--part", part, "--blocks", str(blocks), "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench: the {part} job failed:\n{proc.stdout}{proc.stderr}")
    return dict(json.loads(out.read_text()))


def measure(blocks: int, workdir: Path, timeout: int) -> dict[str, float]:
    """Every part once: ``{ratio name: value}``."""
    import importlib.util

    ratios: dict[str, float] = {}
    parts = ["node", "cross"] + (["torch"] if importlib.util.find_spec("torch") else [])
    for part in parts:
        ratios.update(_job(part, blocks, workdir / f"quick-{part}.json", timeout))
    return ratios


def bands(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each ratio's median and spread over ``runs``."""
    names = sorted(set().union(*runs))
    return {
        k: {
            "median": statistics.median(r[k] for r in runs if k in r),
            "lo": min(r[k] for r in runs if k in r),
            "hi": max(r[k] for r in runs if k in r),
            "runs": sum(k in r for r in runs),
        }
        for k in names
    }


def below(ratios: dict[str, float], baseline: dict[str, dict[str, float]]) -> list[str]:
    """The ratios below their baseline band, one line each (none: the baseline holds)."""
    lines = []
    for k, band in sorted(baseline.items()):
        if k not in ratios:
            lines.append(f"{k}: not measured (baseline {band['median']:.2f})")
            continue
        floor = band["lo"] - MARGIN * band["median"]
        if ratios[k] < floor:
            lines.append(
                f"{k}: {ratios[k]:.2f} below its band (baseline median {band['median']:.2f}, "
                f"lowest {band['lo']:.2f}, floor {floor:.2f})"
            )
    return lines


def _table(ratios: dict[str, float], baseline: dict[str, dict[str, float]]) -> str:
    rows = [f"{'ratio':28} {'now':>7} {'baseline':>9} {'band':>13}"]
    for k in sorted(ratios):
        b = baseline.get(k)
        ref = f"{b['median']:9.2f} {b['lo']:6.2f}-{b['hi']:<6.2f}" if b else f"{'-':>9}"
        rows.append(f"{k:28} {ratios[k]:7.2f} {ref}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=sorted(PARTS), help="(inside the launcher) one job")
    ap.add_argument("--json", type=Path, help="(with --part) where rank 0 writes its ratios")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="measure once (the default)")
    ap.add_argument("--compare", action="store_true", help="name ratios below the baseline")
    ap.add_argument("--baseline", action="store_true", help="measure 5 times, write it")
    ap.add_argument("--runs", type=int, default=5, help="runs of --baseline")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "quick.json")
    ap.add_argument("--baseline-file", type=Path, default=BASELINE, help="(tests: another)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per job")
    args = ap.parse_args()
    if args.part:
        ratios = PARTS[args.part](args.blocks)
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            args.json.write_text(json.dumps(ratios))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.baseline:
        runs = [measure(args.blocks, args.out.parent, args.timeout) for _ in range(args.runs)]
        band = bands(runs)
        doc = {"machine": os.uname().nodename, "cores": os.cpu_count(), "ratios": band}
        args.baseline_file.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(_table(runs[-1], band))
        print(
            f"bench: wrote {args.baseline_file} ({args.runs} runs, {time.monotonic() - t0:.0f} s)"
        )
        return 0
    ratios = measure(args.blocks, args.out.parent, args.timeout)
    args.out.write_text(json.dumps(ratios, indent=1, sort_keys=True) + "\n")
    baseline: dict[str, dict[str, float]] = {}
    if args.baseline_file.exists():
        baseline = json.loads(args.baseline_file.read_text())["ratios"]
    print(_table(ratios, baseline))
    print(f"bench: wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    if not args.compare:
        return 0
    if not baseline:
        print(f"bench: no baseline at {args.baseline_file} (./dev bench --baseline)")
        return 2
    bad = below(ratios, baseline)
    for line in bad:
        print(f"bench: BELOW BAND {line}")
    print("bench: every ratio within its band" if not bad else f"bench: {len(bad)} below")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
