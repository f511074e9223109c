"""Reduce-scatter: rank ``r`` gets shard ``r`` (``shard_bounds(count, P)``) of the all-reduce,
reduced in rank order (bitwise equal to the same elements of a one-shot all-reduce)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmem import SHMEMBuffer

from . import pipeline
from .allreduce import all_reduce
from .allreduce_plans import shard_plan
from .channel import Channel
from .cross import reduce_scatter_across
from .cross_plan import cross_plan
from .operand import Array, Operand
from .ops import ReduceOp, accumulate_dtype, check_op, reduce_into
from .schedule import shard_of

__all__ = ["ReduceScatter", "reduce_scatter"]


class ReduceScatter(pipeline.Call):
    """The reduce-scatter's steps of the pipeline (:mod:`collectives.pipeline`). Across
    nodes where the all-reduce reduces in rank order (one rank per node, or nodes of
    different sizes) it goes straight to my shard over MPI, bitwise the same; across
    uniform nodes (hierarchical: node partials in node order) or beyond the scratch (in
    pieces) it is the all-reduce, then my shard."""

    kind = "reduce_scatter"

    def __init__(self, ch: Channel, op: ReduceOp | str) -> None:
        super().__init__(ch, (str(op),))
        self.given_op, self.op = op, str(op)
        self.float32_accumulate = ch.float32_accumulate
        self.acc: np.dtype[Any] = self.float32_accumulate  # (validate: the input's)
        self.shard = (0, 0)

    def out_count(self, n: int) -> int:
        a, b = shard_of(n, self.size, self.rank)
        return b - a

    def validate(self, xin: Operand) -> None:
        check_op(self.given_op, xin.dtype, self.where)
        self.acc = accumulate_dtype(xin.dtype, self.float32_accumulate)
        self.shard = self.unread = shard_of(xin.count, self.size, self.rank)

    def route(self, ch: Channel, xin: Operand) -> str:
        if ch.num_nodes > 1 and (len(ch.local_peers) == 1 or not ch.uniform_nodes):
            return pipeline.ACROSS
        return pipeline.ON_NODE if ch.fits_scratch(xin) else pipeline.DELEGATED

    def cached(self, ch: Channel, xin: Operand, route: str) -> pipeline.Plan | None:
        if route == pipeline.ACROSS:
            return cross_plan(ch, self.kind, xin, self.op, self.acc)
        if route == pipeline.ON_NODE:
            return shard_plan(ch, xin, self.op, self.acc, self.shard)
        return None

    def across(self, ch: Channel, xin: Operand, dst: Array) -> None:
        reduce_scatter_across(ch, ch.comm, xin.array, dst, self.op, self.acc, self.size, self.where)

    def combine(self, ranks: list[int], inputs: list[Array], target: Array) -> None:
        a, b = self.shard
        reduce_into(target, [src[a:b] for src in inputs], self.op, self.acc, avg_count=self.size)

    def delegate(self, ch: Channel, xin: Operand, dst: Array) -> None:
        whole = xin.shmem if xin.shmem is not None else xin.array
        full = all_reduce(ch, whole, self.op, None, "auto", call=self.kind)
        a, b = self.shard
        np.copyto(dst, np.asarray(full).reshape(-1)[a:b])


def reduce_scatter(
    ch: Channel, x: SHMEMBuffer | Array, op: ReduceOp | str, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    """``out`` = my shard of ``x`` reduced over every rank with ``op``, in rank order."""
    return pipeline.perform(ch, ReduceScatter(ch, op), x, out)
