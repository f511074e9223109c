"""Sequence-parallel attention on torch tensors, with its backward wired into autograd.

>>> out = sequence_parallel_attention(q, k, v, causal=True)   # doctest: +SKIP
>>> out.sum().backward()                                       # q.grad, k.grad, v.grad

Each rank of the process group passes its shard of one long sequence (``[rows, heads,
head_dim]``; ``k``/``v`` may have fewer heads: GQA) and gets attention of its queries over
the whole sequence; ``backward`` runs :func:`collectives.mha.sequence_parallel_attention_backward`
on the same group (collective: every rank calls backward, as with DDP). Every schedule and
mask of :class:`collectives.mha.SequenceParallelOptions` applies (keywords or ``options=``).
CPU tensors of float32, float16 or bfloat16 run the host kernels zero-copy; CUDA tensors (on
the nvshmem backend) run the GPU kernels on the same call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from shmem.errors import CollectiveArgumentError

from ._tensors import as_array

__all__ = ["sequence_parallel_attention"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _group(group: Any, where: str) -> Any:
    from .group import ProcessGroupSymheap

    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupSymheap):
        raise CollectiveArgumentError(
            f"{where}: the group's backend is {pg.name()!r} (expected a 'symheap' group: "
            "dist.init_process_group('symheap') or dist.new_group(..., backend='symheap'))"
        )
    return pg


def _array(t: torch.Tensor) -> Any:
    """A tensor as the kernels take it: a numpy view on the host, the tensor on a GPU."""
    t = t.detach()
    return t.contiguous() if t.is_cuda else as_array(t.contiguous())


def _tensor(a: Any, like: torch.Tensor) -> torch.Tensor:
    """A kernel's result as a tensor of ``like``'s dtype and device."""
    if isinstance(a, torch.Tensor):
        return a.to(like.dtype)
    a = np.ascontiguousarray(a)
    if like.dtype == torch.bfloat16 and a.dtype.itemsize == 2 and a.dtype.kind == "V":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a).to(like.dtype)


class _SequenceParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pg: Any, opts: Any
    ) -> torch.Tensor:
        from collectives.mha import sequence_parallel_attention as forward

        args = (_array(q), _array(k), _array(v))
        # in the group's order: DDP's bucket all-reduces may be queued on the same comm
        out, lse = pg.run_in_order(lambda: forward(pg.comm, *args, options=opts, return_lse=True))
        o = _tensor(out, q)
        lse_t = lse if isinstance(lse, torch.Tensor) else torch.from_numpy(np.asarray(lse))
        ctx.save_for_backward(q, k, v, o, lse_t)
        ctx.pg, ctx.opts = pg, opts
        return o

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        from collectives.mha import sequence_parallel_attention_backward as backward

        q, k, v, o, lse = ctx.saved_tensors
        pg = ctx.pg
        args = (_array(dout.to(q.dtype)), _array(q), _array(k), _array(v), _array(o))
        lse_a = lse if lse.is_cuda else lse.numpy()
        dq, dk, dv = pg.run_in_order(lambda: backward(pg.comm, *args, lse_a, options=ctx.opts))
        return _tensor(dq, q), _tensor(dk, k), _tensor(dv, v), None, None


def sequence_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Any = None,
    options: Any = None,
    **overrides: Any,
) -> torch.Tensor:
    """Attention of this rank's queries over the sequence sharded across ``group``
    (collective; differentiable).

    Parameters
    ----------
    q, k, v : torch.Tensor
        This rank's rows ``[rows, heads, head_dim]``, float32, float16 or bfloat16, on the
        CPU (or CUDA tensors on the nvshmem backend). ``ring`` and ``dynamic`` schedules:
        rank ``r`` holds the ``r``-th contiguous shard; ``zigzag``: see
        :func:`collectives.mha.zigzag_shard`.
    group : ProcessGroup, optional
        A ``symheap`` process group (default: the default group).
    options : collectives.mha.SequenceParallelOptions, optional
        The schedule, mask and tuning (default: ``SequenceParallelOptions()``).
    **overrides
        Its fields as keywords (``causal=True``, ``schedule="ring"``, ...).

    Returns
    -------
    torch.Tensor
        ``[rows, heads, head_dim]`` of ``q``'s dtype and device; ``backward`` gives
        ``q``, ``k`` and ``v`` their gradients (dK/dV summed over each KV head's query heads).

    Raises
    ------
    CollectiveArgumentError
        When ``q``, ``k`` or ``v`` is not a 3-d float32, float16 or bfloat16 tensor, when
        ``options`` is not a ``SequenceParallelOptions``, when an override names no field of
        it, or when ``group`` (or the default group) is not a ``symheap`` group.
    """
    import dataclasses

    from collectives.mha import SequenceParallelOptions

    where = "torch_backend.sequence_parallel_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES or t.dim() != 3:
            raise CollectiveArgumentError(
                f"{where}: invalid {name} (got {getattr(t, 'dtype', type(t).__name__)} of shape "
                f"{tuple(getattr(t, 'shape', ()))}; expected a [rows, heads, head_dim] tensor of "
                "float32, float16 or bfloat16)"
            )
    if options is not None and not isinstance(options, SequenceParallelOptions):
        raise CollectiveArgumentError(
            f"{where}: invalid options (got {type(options).__name__}; expected a "
            "collectives.mha.SequenceParallelOptions or None)"
        )
    try:
        opts = dataclasses.replace(options or SequenceParallelOptions(), **overrides)
    except TypeError as exc:
        raise CollectiveArgumentError(f"{where}: {exc}") from None
    out: torch.Tensor = _SequenceParallelAttention.apply(  # type: ignore[no-untyped-call]
        q, k, v, _group(group, where), opts
    )
    return out
