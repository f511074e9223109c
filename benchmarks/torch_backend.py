"""torch.distributed on the ``symheap`` backend against gloo, interleaved in the same job.

    python -m launch -n 2 benchmarks/torch_backend.py --out results/torch_backend.jsonl

Collectives: for each collective (all_reduce, broadcast, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single, barrier) and size (``nbytes`` = each rank's input,
float32, 4 KiB to 64 MiB by default), blocks of back-to-back calls on the default group
(symheap) and on a gloo group of the same ranks take turns, on the same tensors; latency =
the slowest rank's block mean, median over blocks; ``ratio`` = gloo's time / ours (above 1:
faster than gloo). The all-reduce rows also time the Communicator call the backend makes,
on the same memory: ``overhead_us`` = ours - that, the cost of torch's dispatch and ours.

DDP: the step time (forward, backward with DDP's bucketed all-reduces, SGD step) of a
~25M-parameter MLP (1024 -> 4096 -> 4096 -> 1024, batch 32) and of a small transformer (2
encoder layers, d_model 256, 4 heads, sequence 128, batch 8), each wrapped once in DDP over
symheap and once over gloo, blocks of steps alternating; ``ratio`` = gloo's step / ours.
Attention (``--attention`` tokens, causal, 4 heads, head_dim 128, float32, forward +
backward): the differentiable ``sequence_parallel_attention`` sharded over every rank, our
single-process attention (the same kernel) on rank 0 alone, and torch's
``scaled_dot_product_attention`` on rank 0 alone, one compute thread per rank;
``ratio`` = SDPA's time / ours on one rank, ``parallel_efficiency`` = one rank's time / (P x
the sharded time). One JSON line per measurement; ``--png`` draws the ratios (plot.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from harness import append_jsonl, git_sha, interleaved, size_steps, stats_us

import collectives.torch_backend  # noqa: F401  (registers "symheap")
import shmem

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "barrier",
)


def _contenders(name: str, n: int, gloo: Any) -> dict[str, Callable[[], object]]:
    p, rank = dist.get_world_size(), dist.get_rank()
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    if name == "all_reduce":
        # the sums stay finite: each call adds up the same input again
        def run(group: Any) -> Callable[[], object]:
            y = x.clone()
            return lambda: dist.all_reduce(y.copy_(x), group=group)

        comm = dist.distributed_c10d._get_default_group().comm  # type: ignore[attr-defined]
        a, direct = x.numpy(), x.clone().numpy()

        def bare() -> None:  # the backend's Communicator call, on the same memory
            np.copyto(direct, a)
            comm.all_reduce(direct, "sum", out=direct)

        return {"ours": run(None), "gloo": run(gloo), "direct": bare}
    outs = {
        "all_gather_into_tensor": torch.empty(n * p),
        "reduce_scatter_tensor": torch.empty(n // p),
        "all_to_all_single": torch.empty(n),
    }
    calls: dict[str, Callable[[Any], object]] = {
        "broadcast": lambda g: dist.broadcast(x, 0, group=g),
        "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(outs[name], x, group=g),
        "reduce_scatter_tensor": lambda g: dist.reduce_scatter_tensor(outs[name], x, group=g),
        "all_to_all_single": lambda g: dist.all_to_all_single(outs[name], x, group=g),
        "barrier": lambda g: dist.barrier(group=g),
    }
    call = calls[name]
    return {"ours": lambda: call(None), "gloo": lambda: call(gloo)}


def _model(kind: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(dist.get_rank())
    if kind == "mlp":
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096),
            torch.nn.ReLU(),
            torch.nn.Linear(4096, 4096),
            torch.nn.ReLU(),
            torch.nn.Linear(4096, 1024),
        )
        return model, torch.randn(32, 1024, generator=gen)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(
        8, 128, 256, generator=gen
    )


def _ddp_step(kind: str, group: Any) -> tuple[Callable[[], object], int]:
    model, batch = _model(kind)
    net = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        net(batch).square().mean().backward()
        opt.step()

    return step, sum(p.numel() for p in model.parameters())


def _attention(total: int, heads: int, dim: int) -> dict[str, Callable[[], object]]:
    """Forward + backward of causal attention over ``total`` tokens: ours sharded over every
    rank (one compute thread each), and on rank 0 alone our single-process attention (the
    same kernel, one thread) and torch's SDPA, on the same shapes; the other ranks wait in
    the timed barrier while rank 0 runs alone."""
    from collectives.mha import attention, attention_backward
    from collectives.torch_backend import sequence_parallel_attention

    p, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(rank)
    bounds = np.linspace(0, total, p + 1).astype(int)
    rows = int(bounds[rank + 1] - bounds[rank])
    mine = [torch.randn(rows, heads, dim, generator=gen, requires_grad=True) for _ in range(3)]
    whole = [torch.randn(1, total, heads, dim, generator=gen).numpy() for _ in range(3)]
    sdpa_in = [torch.from_numpy(a[0]).transpose(0, 1).contiguous().requires_grad_() for a in whole]

    def sharded() -> None:
        out = sequence_parallel_attention(*mine, causal=True, threads=1)
        torch.autograd.backward(out.sum())

    def alone() -> None:
        if rank == 0:
            q, k, v = whole
            out, lse = attention(q, k, v, causal=True, workers=1, return_lse=True)
            attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)

    def sdpa() -> None:
        if rank == 0:
            q, k, v = sdpa_in
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.backward(out.sum())

    return {"ours": sharded, "ours_1rank": alone, "sdpa_1rank": sdpa}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", default="4KiB")
    ap.add_argument("--max-bytes", default="64MiB")
    ap.add_argument("--step", type=int, default=4, help="size multiplier between points")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--ddp", default="mlp,transformer", help="models ('' for none)")
    ap.add_argument("--ddp-steps", type=int, default=3, help="steps per block")
    ap.add_argument(
        "--attention", type=int, default=2048, help="tokens of the attention run (0: none)"
    )
    ap.add_argument("--out", type=Path, default=Path("results/torch_backend.jsonl"))
    ap.add_argument("--png", type=Path, help="also draw the ratios here")
    args = ap.parse_args()
    lo, hi = shmem.parse_size(args.min_bytes), shmem.parse_size(args.max_bytes)
    torch.set_num_threads(1)  # one core per rank, as the ranks share the machine
    dist.init_process_group("symheap")
    gloo = dist.new_group(backend="gloo")
    p, rank = dist.get_world_size(), dist.get_rank()
    world = shmem.get_world()
    mpi = world.comm  # the timings' barrier and max over ranks
    common = {
        "bench": "torch_backend",
        "git_sha": git_sha(),
        "world_size": p,
        "num_nodes": world.num_nodes,
        "node_split": world.config.heap.node_split,
        "torch": torch.__version__,
        "peer": "gloo",
    }
    records: list[dict[str, Any]] = []

    def report(rec: dict[str, Any]) -> None:
        records.append(rec)
        if rank == 0:
            extra = f"  overhead {rec['overhead_us']:.1f} us" if "overhead_us" in rec else ""
            print(
                f"{rec['collective']:24} {rec['nbytes']:>9} {rec['ours']['median_us']:>10.1f} us"
                f"  gloo {rec['gloo']['median_us']:>10.1f} us  x{rec['ratio']:.2f}{extra}",
                flush=True,
            )

    for name in (c for c in args.collectives.split(",") if c):
        for nbytes in [0] if name == "barrier" else size_steps(lo, hi, args.step):
            n = max(nbytes // 4 // p * p, p)
            fns = _contenders(name, n, gloo)
            iters = int(max(3, min(300, (16 << 20) / max(n * 4, 1) / 2)))
            samples = interleaved(fns, args.blocks, iters, mpi)
            ours, theirs = (float(np.median(samples[k])) for k in ("ours", "gloo"))
            rec = {
                **common,
                "collective": name,
                "dtype": "float32",
                "nbytes": 0 if name == "barrier" else n * 4,
                "ours": stats_us(samples["ours"]),
                "gloo": stats_us(samples["gloo"]),
                "ratio": theirs / ours,
            }
            if "direct" in samples:
                rec["direct"] = stats_us(samples["direct"])
                rec["overhead_us"] = (ours - float(np.median(samples["direct"]))) * 1e6
            report(rec)
    for kind in (k for k in args.ddp.split(",") if k):
        ours_step, nparams = _ddp_step(kind, None)
        gloo_step, _ = _ddp_step(kind, gloo)
        samples = interleaved(
            {"ours": ours_step, "gloo": gloo_step}, args.blocks, args.ddp_steps, mpi
        )
        ours, theirs = (float(np.median(samples[k])) for k in ("ours", "gloo"))
        report(
            {
                **common,
                "collective": f"ddp_step_{kind}",
                "dtype": "float32",
                "nbytes": nparams * 4,
                "params": nparams,
                "ours": stats_us(samples["ours"]),
                "gloo": stats_us(samples["gloo"]),
                "ratio": theirs / ours,
            }
        )
    if args.attention:
        heads, dim = 4, 128
        samples = interleaved(_attention(args.attention, heads, dim), args.blocks, 1, mpi)
        t = {k: float(np.median(v)) for k, v in samples.items()}
        report(
            {
                **common,
                "collective": "attention_fwd_bwd",
                "dtype": "float32",
                "nbytes": 0,
                "tokens": args.attention,
                "heads": heads,
                "head_dim": dim,
                "causal": True,
                "ours": stats_us(samples["ours"]),
                "ours_1rank": stats_us(samples["ours_1rank"]),
                "sdpa_1rank": stats_us(samples["sdpa_1rank"]),
                "gloo": stats_us(samples["sdpa_1rank"]),  # the peer's column: SDPA alone
                "tokens_per_s": args.attention / t["ours"],
                "tokens_per_s_1rank": args.attention / t["ours_1rank"],
                "sdpa_tokens_per_s": args.attention / t["sdpa_1rank"],
                "ratio": t["sdpa_1rank"] / t["ours_1rank"],  # one rank: ours against SDPA
                "parallel_efficiency": t["ours_1rank"] / (p * t["ours"]),
            }
        )
    dist.destroy_process_group()
    if rank == 0:
        append_jsonl(args.out, records)
        print(f"wrote {args.out}")
        if args.png:
            from plot import plot_torch

            plot_torch(args.out, args.png)
            print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
