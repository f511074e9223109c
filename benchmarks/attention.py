"""Host attention throughput against numpy's float32 matmul rate, measured in the same run.

    python benchmarks/attention.py --out results/attention.jsonl

FLOPs: ``4 * B * H * S^2 * D`` counted on unmasked pairs only (causal: about half). The peer
is numpy's float32 matmul (``[S, D] @ [D, S]`` and ``[S, S] @ [S, D]`` shapes, the same FLOP
count) on the same number of worker threads, timed in the same run; ``ratio`` is our TFLOP/s
over that rate. torch's CPU ``scaled_dot_product_attention`` is timed too when torch is
importable (optional).
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from harness import append_jsonl, git_sha, median_seconds
from threadpoolctl import threadpool_limits

from collectives.mha import attention
from shmem import CPU


def matmul_rate(s: int, d: int, workers: int, repeat: int) -> float:
    """FLOP/s of float32 matmuls of attention's shapes, one BLAS thread per worker."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((s, d)).astype(np.float32)
    k = rng.standard_normal((s, d)).astype(np.float32)
    p = rng.standard_normal((s, s)).astype(np.float32)

    def one(_: int) -> None:
        np.matmul(q, k.T)
        np.matmul(p, k)

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        t = median_seconds(lambda: list(pool.map(one, range(workers))), repeat)
    return workers * 4 * s * s * d / t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", default="1024,4096")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("results/attention.jsonl"))
    args = ap.parse_args()
    workers = CPU().attributes.cores or 1
    d, h = args.head_dim, args.heads
    records = []
    for s in (int(x) for x in args.seq.split(",")):
        rng = np.random.default_rng(1)
        q = rng.standard_normal((1, s, h, d)).astype(np.float32)
        k = rng.standard_normal((1, s, h, d)).astype(np.float32)
        v = rng.standard_normal((1, s, h, d)).astype(np.float32)
        peak = matmul_rate(s, d, workers, args.repeat)
        for causal in (False, True):

            def run(q: Any = q, k: Any = k, v: Any = v, causal: bool = causal) -> None:
                attention(q, k, v, causal=causal, block_m=args.block_m, block_n=args.block_n)

            t = median_seconds(run, args.repeat)
            pairs = s * (s + 1) // 2 if causal else s * s
            flops = 4 * h * pairs * d
            rec: dict[str, Any] = {
                "bench": "attention",
                "git_sha": git_sha(),
                "backend": "host",
                "workers": workers,
                "seq": s,
                "heads": h,
                "head_dim": d,
                "causal": causal,
                "dtype": "float32",
                "block_m": args.block_m,
                "block_n": args.block_n,
                "seconds": t,
                "tflops": flops / t / 1e12,
                "matmul_tflops": peak / 1e12,
                "ratio": flops / t / peak,
            }
            try:
                import torch

                tq, tk, tv = (
                    torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))
                    for a in (q, k, v)
                )

                def sdpa(tq: Any = tq, tk: Any = tk, tv: Any = tv, c: bool = causal) -> object:
                    return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=c)

                tt = median_seconds(sdpa, args.repeat)
                rec["torch_seconds"] = tt
                rec["torch_ratio"] = tt / t
            except ImportError:
                pass
            records.append(rec)
            extra = f"  torch x{rec['torch_ratio']:.2f}" if "torch_ratio" in rec else ""
            print(
                f"S={s:6} causal={causal!s:5} {t * 1e3:9.1f} ms {rec['tflops'] * 1e3:7.1f} "
                f"GFLOP/s  matmul {peak / 1e9:7.1f} GFLOP/s  ratio {rec['ratio']:.2f}{extra}",
                flush=True,
            )
    append_jsonl(args.out, records)


if __name__ == "__main__":
    main()
