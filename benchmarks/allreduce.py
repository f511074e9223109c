"""All-reduce against mpi4py ``comm.Allreduce`` (buffer API), interleaved in the same run.

    python -m launch -n 2 benchmarks/allreduce.py --out results/allreduce.jsonl

For every size (8 B to 64 MiB) and dtype (float32, bfloat16), blocks of iterations of three
contenders alternate: ours with a symmetric input (a SHMEMBuffer: zero-copy), ours with a
numpy input (copied into scratch), and MPI. MPI has no bfloat16: its bfloat16 figure is what a
user would do, upcast to float32, ``Allreduce``, round back.

Figures (nccl-tests definitions): latency per call, the max over ranks, median/p10/p90 over
blocks; ``algbw = nbytes / t``; ``busbw = algbw * 2 (P - 1) / P``. ``ratio = busbw / MPI's
busbw`` (above 1: faster than MPI). One JSON line per (size, dtype, input), and a PNG plot
of the ratios.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from harness import append_jsonl, git_sha, stats_us, timed_max_over_ranks
from mpi4py import MPI

import collectives
import shmem

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="64MiB")
    ap.add_argument("--step", type=int, default=4, help="size multiplier between points")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", type=Path, default=Path("results/allreduce.jsonl"))
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args()
    lo, hi = shmem.parse_size(args.min_bytes), shmem.parse_size(args.max_bytes)
    with (
        shmem.init(
            heap_nbytes=max(512 << 20, 6 * hi), collectives_scratch_max_nbytes=max(64 << 20, 3 * hi)
        ) as world,
        collectives.Communicator(world) as comm,
    ):
        mpi = world.comm
        p = world.world_size
        common = {
            "bench": "allreduce",
            "git_sha": git_sha(),
            "backend": world.backend,
            "world_size": p,
            "num_nodes": world.num_nodes,
            "node_split": world.config.heap.node_split,
            "op": "sum",
        }
        records = []
        for name in args.dtypes.split(","):
            dt = DTYPES[name]
            sizes = []
            nbytes = max(lo, dt.itemsize)
            while nbytes < hi:
                sizes.append(nbytes)
                nbytes *= args.step
            sizes.append(hi)  # the largest size is always measured
            for nbytes in sizes:
                n = nbytes // dt.itemsize
                rng = np.random.default_rng(world.rank)
                host = rng.standard_normal(n).astype(dt)
                sym = world.empty(n, name)
                sym.local()[...] = host
                out = np.empty(n, dt)
                f32_in, f32_out = np.empty(n, np.float32), np.empty(n, np.float32)

                def ours_sym(sym: Any = sym, out: Any = out) -> None:
                    comm.all_reduce(sym, out=out)

                def ours_np(host: Any = host, out: Any = out) -> None:
                    comm.all_reduce(host, out=out)

                def mpi_ref(
                    host: Any = host,
                    out: Any = out,
                    f32_in: Any = f32_in,
                    f32_out: Any = f32_out,
                    dt: Any = dt,
                ) -> None:
                    if dt == np.float32:
                        mpi.Allreduce(host, out, op=MPI.SUM)
                    else:  # what a user would do without bfloat16 in MPI
                        np.copyto(f32_in, host, casting="unsafe")
                        mpi.Allreduce(f32_in, f32_out, op=MPI.SUM)
                        np.copyto(out, f32_out, casting="unsafe")

                iters = int(max(3, min(2000, (32 << 20) / max(nbytes, 1) / 4)))
                samples: dict[str, list[float]] = {"symmetric": [], "numpy": [], "mpi": []}
                for fn in (ours_sym, ours_np, mpi_ref):  # warm up (scratch growth, caches)
                    fn()
                for _ in range(args.blocks):
                    samples["symmetric"].append(timed_max_over_ranks(ours_sym, iters, mpi))
                    samples["numpy"].append(timed_max_over_ranks(ours_np, iters, mpi))
                    samples["mpi"].append(timed_max_over_ranks(mpi_ref, iters, mpi))
                algo = comm.table.choose(nbytes, p, world.num_nodes)
                mpi_t = float(np.median(samples["mpi"]))
                for kind in ("symmetric", "numpy"):
                    t = float(np.median(samples[kind]))
                    algbw = nbytes / t / 1e9
                    busbw = algbw * 2 * (p - 1) / p if p > 1 else algbw
                    mpi_algbw = nbytes / mpi_t / 1e9
                    rec = {
                        **common,
                        "dtype": name,
                        "nbytes": nbytes,
                        "count": n,
                        "input": kind,
                        "algorithm": algo,
                        "ours": stats_us(samples[kind]),
                        "mpi": stats_us(samples["mpi"]),
                        "algbw_GBps": algbw,
                        "busbw_GBps": busbw,
                        "mpi_busbw_GBps": mpi_algbw * 2 * (p - 1) / p if p > 1 else mpi_algbw,
                        "ratio": mpi_t / t,
                    }
                    records.append(rec)
                    if world.rank == 0:
                        print(
                            f"{name:9} {nbytes:>10} {kind:9} {algo:12} "
                            f"{rec['ours']['median_us']:>10.1f} us {busbw:7.2f} GB/s  "
                            f"MPI {rec['mpi']['median_us']:>10.1f} us  x{rec['ratio']:.2f}",
                            flush=True,
                        )
                sym.close()
        if world.rank == 0:
            append_jsonl(args.out, records)
            png = args.png or args.out.with_suffix(".png")
            try:
                from plot import plot_ratio

                plot_ratio(args.out, png)
                print(f"wrote {args.out} and {png}")
            except ImportError as exc:
                print(f"wrote {args.out}; no plot ({exc}): pip install '.[bench]'")


if __name__ == "__main__":
    main()
