"""Attention forward on one GPU against torch's scaled_dot_product_attention (flash backend)
on the same inputs, in the same run.

    python benchmarks/gpu_attention.py --out results/gpu_attention.jsonl

bfloat16, batch 1, 16 heads, head_dim 128, S = 4K-32K, causal and not (defaults). Both are
timed with CUDA events on the same stream (median of ``--repeat`` calls, after a warm-up).
FLOPs: ``4 * B * H * S * S * D`` for full attention (two matmuls of ``2 S^2 D`` each), half of
that when causal. Reported per point: our time and TFLOP/s, torch's, and ``ratio`` = torch's
time / ours (above 1: we are faster; the target is 0.5). Reported, not asserted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from harness import append_jsonl


def flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    full = 4.0 * b * h * s * s * d
    return full / 2 if causal else full


def timed(torch: Any, fn: Any, repeat: int) -> float:
    """Median seconds per call (CUDA events on the current stream)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return float(times[len(times) // 2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="4096,8192,16384,32768")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--schedulers", default="queued,static")
    ap.add_argument("--out", type=Path, default=Path("results/gpu_attention.jsonl"))
    args = ap.parse_args()

    import torch

    from collectives.mha import attention

    # our kernels on torch's current stream where it speaks __cuda_stream__ (else on our
    # own stream, waited for in the call): the same events time both
    current = torch.cuda.current_stream()
    stream = current if hasattr(current, "__cuda_stream__") else None
    b, h, d = args.batch, args.heads, args.dim
    for s in (int(x) for x in args.seqs.split(",")):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            sdpa = _sdpa(torch, q, k, v, causal)
            t_torch = timed(torch, sdpa, args.repeat)
            for scheduler in args.schedulers.split(","):
                ours = _ours(attention, q, k, v, causal, scheduler, stream)
                t0 = time.perf_counter()
                out = ours()
                torch.cuda.synchronize()
                first = time.perf_counter() - t0  # includes the kernel's first compile
                err = (out.float() - sdpa().transpose(1, 2).float()).abs().max().item()
                t_ours = timed(torch, ours, args.repeat)
                f = flops(b, h, s, d, causal)
                row = {
                    "bench": "gpu_attention",
                    "device": torch.cuda.get_device_name(),
                    "dtype": "bfloat16",
                    "batch": b,
                    "heads": h,
                    "head_dim": d,
                    "seq": s,
                    "causal": causal,
                    "scheduler": scheduler,
                    "on_torch_stream": stream is not None,
                    "ours_s": t_ours,
                    "torch_flash_s": t_torch,
                    "ours_tflops": f / t_ours / 1e12,
                    "torch_tflops": f / t_torch / 1e12,
                    "ratio": t_torch / t_ours,
                    "max_abs_diff_vs_torch": err,
                    "first_call_s": first,
                }
                append_jsonl(args.out, [row])
                print(
                    f"S={s:6d} causal={causal!s:5} {scheduler:7} ours {t_ours * 1e3:8.3f} ms "
                    f"({row['ours_tflops']:6.1f} TFLOP/s)  torch flash {t_torch * 1e3:8.3f} ms "
                    f"({row['torch_tflops']:6.1f})  ratio {row['ratio']:.2f}  max|diff| {err:.3g}",
                    flush=True,
                )


def _sdpa(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> Any:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # torch's [b, h, s, d] views

    def run() -> Any:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    return run


def _ours(attention: Any, q: Any, k: Any, v: Any, causal: bool, scheduler: str, stream: Any) -> Any:
    def run() -> Any:
        return attention(q, k, v, causal=causal, scheduler=scheduler, stream=stream)

    return run


if __name__ == "__main__":
    main()
