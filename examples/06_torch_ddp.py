"""Train a torch model with DistributedDataParallel on the ``symheap`` backend.

The one change from a gloo script is the backend's name: torch's ``env://`` variables come
from the launcher, the gradient all-reduces run on the symmetric heap (deterministic: every
rank gets bitwise the same averaged gradient), and a failing rank ends the job at once,
named. The last part runs attention over a sequence sharded across the ranks, with autograd.

    python -m launch -n 4 examples/06_torch_ddp.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from collectives.torch_backend import sequence_parallel_attention


def main() -> None:
    dist.init_process_group("symheap")  # registered by torch's backend autoload
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    for step in range(20):
        x = torch.randn(32, 16, generator=data)
        loss = (net(x) - x @ target).square().mean()
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here, overlapped with the backward
        opt.step()
        if step % 10 == 0 and rank == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    # every rank holds bitwise the same weights
    digest = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(digest) for _ in range(size)]
    dist.all_gather(every, digest)
    assert all(torch.equal(d, digest) for d in every), "weights differ between ranks"

    # attention of each rank's 64 tokens over all size * 64 tokens, causal, with gradients
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(64, 4, 32, generator=g, requires_grad=True) for _ in range(3))
    out = sequence_parallel_attention(q, k, v, causal=True)
    torch.autograd.backward(out.square().sum())  # collective: every rank runs its backward
    assert q.grad is not None and q.grad.shape == q.shape
    if rank == 0:
        print(f"ddp ok: {size} ranks, identical weights; sequence-parallel attention ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
