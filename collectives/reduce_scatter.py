"""Reduce-scatter: rank ``r`` gets shard ``r`` (``shard_bounds(count, P)``) of the all-reduce,
reduced in rank order (bitwise equal to the same elements of a one-shot all-reduce)."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer

from .allreduce import all_reduce
from .allreduce_plans import shard_plan
from .channel import Channel
from .cross import reduce_scatter_across
from .cross_plan import cross_plan
from .family import exchange, over_mpi
from .operand import Array, Operand, prepare
from .ops import ReduceOp, accumulate_dtype, check_op, reduce_into
from .schedule import shard_of

__all__ = ["reduce_scatter"]


def reduce_scatter(
    ch: Channel, x: SHMEMBuffer | Array, op: ReduceOp | str, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    where = "Communicator.reduce_scatter"
    size, rank = ch.world_size, ch.rank

    def validate(xin: Operand) -> None:
        check_op(op, xin.dtype, where)

    def count_of(n: int) -> int:
        a, b = shard_of(n, size, rank)
        return b - a

    xin, ret, dst = prepare(ch, where, x, out, count_of, (str(op),), validate)
    op = str(op)
    acc = accumulate_dtype(xin.dtype, ch.float32_accumulate)
    a, b = shard_of(xin.count, size, rank)
    if ch.num_nodes > 1 and (len(ch.local_peers) == 1 or not ch.uniform_nodes):
        # across nodes, where the all-reduce reduces in rank order (one rank per node, or
        # nodes of different sizes): straight to my shard over MPI, bitwise the same
        small = cross_plan(ch, "reduce_scatter", xin, op, acc)
        if small is not None:  # small: one persistent signed all-gather, the same order
            small.run(ch, xin.array, xin.shmem, dst, False)
            return ret
        src = xin.array
        over_mpi(
            ch, where, lambda: reduce_scatter_across(ch, ch.comm, src, dst, op, acc, size, where)
        )
        return ret
    if not ch.fits_scratch(xin):
        # across nodes (hierarchical: node partials in node order), or too large for the
        # scratch (in pieces): the all-reduce, then my shard
        whole = xin.shmem if xin.shmem is not None else xin.array
        full = all_reduce(ch, whole, op, None, "auto", call="reduce_scatter")
        np.copyto(dst, np.asarray(full).reshape(-1)[a:b])
        return ret
    ch.stats.count("reduce_scatter")
    plan = shard_plan(ch, xin, op, acc, (a, b))
    if plan is not None:  # small: a cached plan, replayed (the Communicator's fast path)
        aside = xin.shmem is not None and bool(np.may_share_memory(dst, xin.array))
        plan.run(ch, xin.array, xin.shmem, dst, aside)
        return ret
    sources: list[Array] = []

    def read(r: int, src: Array, target: Array) -> None:
        sources.append(src[a:b])
        if len(sources) == len(ch.local_peers):
            reduce_into(target, sources, op, acc, avg_count=size)

    exchange(ch, where, xin, dst, read)
    return ret
