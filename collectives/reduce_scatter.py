"""Reduce-scatter: rank ``r`` gets shard ``r`` (``shard_bounds(count, P)``) of the all-reduce,
reduced in rank order (bitwise equal to the same elements of a one-shot all-reduce)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .communicator import Communicator, Operand
from .family import exchange, prepare
from .ops import reduce_into
from .schedule import shard_of

__all__ = ["reduce_scatter"]


def reduce_scatter(comm: Communicator, x: Any, op: str, out: Any) -> Any:
    where = "Communicator.reduce_scatter"
    size, rank = comm.world_size, comm.rank

    def validate(xin: Operand) -> None:
        comm.check_op(op, xin.dtype, where)

    def count_of(n: int) -> int:
        a, b = shard_of(n, size, rank)
        return b - a

    xin, ret, dst = prepare(comm, where, x, out, count_of, (op,), validate)
    acc = comm.accumulate_dtype(xin.dtype)
    a, b = shard_of(xin.count, size, rank)
    if comm.num_nodes > 1 or xin.count * xin.dtype.itemsize > comm.scratch_capacity:
        # across nodes (hierarchical), or too large for the scratch (in pieces): the
        # all-reduce, then my shard
        full = comm.all_reduce(xin.obj if xin.shmem is not None else xin.array, op=op)
        np.copyto(dst, np.asarray(full).reshape(-1)[a:b])
        return ret
    comm.stats.count("reduce_scatter")
    sources: list[np.ndarray[Any, Any]] = []

    def read(r: int, src: np.ndarray[Any, Any], target: np.ndarray[Any, Any]) -> None:
        sources.append(src[a:b])
        if len(sources) == len(comm.local_peers):
            reduce_into(target, sources, op, acc, avg_count=size)

    exchange(comm, where, xin, dst, read)
    return ret
