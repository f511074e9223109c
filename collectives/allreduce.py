"""All-reduce: one-shot, two-shot and hierarchical, all in fixed rank order.

``out = ((x_0 op x_1) op x_2) ... op x_{P-1}`` elementwise on every rank, accumulated in
float32 for float16/bfloat16/float8 (``[collectives] float32_accumulate`` for float32) and
rounded once. One-shot and two-shot evaluate exactly that expression for every element, so
they agree bitwise with each other and across ranks. Hierarchical evaluates it node by node,
``(node_0 partial) op (node_1 partial) ...`` with each partial in local-rank order: bitwise
identical on every rank, though it may differ from one-shot in the last bit for floats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmem.dtypes import dtype_name

from .communicator import DONE, READY, SHARD, Communicator, Operand, output_array
from .ops import check_op, reduce_into
from .schedule import shard_bounds, shard_of

__all__ = ["all_reduce"]

_ALIGN = 64


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def all_reduce(comm: Communicator, x: Any, op: str, out: Any, algorithm: str) -> Any:
    where = "Communicator.all_reduce"
    error: Exception | None = None
    xin: Operand | None = None
    ret: Any = None
    dst: np.ndarray[Any, Any] | None = None
    record: tuple[Any, ...] = ("all_reduce", "invalid")
    try:
        xin = Operand(x, where, "x")
        check_op(op, xin.dtype, where)
        ret, dst = output_array(comm, out, xin.count, xin.dtype, where, xin)
        record = ("all_reduce", xin.count, dtype_name(xin.dtype), op, algorithm)
    except (ValueError, TypeError) as exc:
        error = exc
    comm.check(where, record, error)
    assert xin is not None and dst is not None
    n, isz = xin.count, xin.dtype.itemsize
    algo = comm.choose(algorithm, n * isz, where)
    if n == 0:
        return ret
    acc = comm.accumulate_dtype(xin.dtype)
    staged = xin.shmem is None
    in_place = np.shares_memory(dst, xin.array)
    parts = 1 if algo == "one_shot" else len(comm.local_peers)

    def need(count: int) -> int:
        # the same on every rank whatever kind of x it passed (staging space is reserved
        # either way), so every rank cuts the same pieces and grows scratch together
        shard = 0 if algo == "one_shot" else -(-count // parts) * isz
        return _round_up(count * isz) + shard

    piece = n
    cap = comm.scratch_capacity
    while need(piece) > cap and piece > 1:
        piece = max(1, piece // 2)
    run = {"one_shot": _one_shot, "two_shot": _two_shot, "hierarchical": _hierarchical}[algo]
    for lo in range(0, n, piece):
        hi = min(lo + piece, n)
        run(comm, xin, dst, lo, hi, op, acc, staged, in_place, need(hi - lo))
    return ret


def _inputs(
    comm: Communicator, xin: Operand, lo: int, hi: int, s: int, scratch_bytes: int
) -> list[np.ndarray[Any, Any]]:
    """Publish my piece ``[lo, hi)``, wait for every node-local rank's, and return them in
    local-rank (= rank) order. Callers have waited ``DONE >= s - 1`` already."""
    comm.publish(s, xin, scratch_bytes, lo, hi)
    comm._wait_peers(READY, s, "all_reduce")
    return [comm.peer_input(r, hi - lo, xin.dtype) for r in comm.local_peers]


def _one_shot(
    comm: Communicator,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    op: str,
    acc: np.dtype[Any],
    staged: bool,
    in_place: bool,
    nbytes: int,
) -> None:
    s = comm._next_call()
    comm._wait_peers(DONE, s - 1, "all_reduce")  # peers finished reading my scratch
    inputs = _inputs(comm, xin, lo, hi, s, nbytes)
    # zero-copy and in place: peers still read my x, so reduce aside and write after DONE
    target = np.empty(hi - lo, dst.dtype) if (in_place and not staged) else dst[lo:hi]
    reduce_into(target, inputs, op, acc, avg_count=comm.world_size)
    comm._post(DONE, s)
    if not staged:  # the caller owns x again once every peer has read it
        comm._wait_peers(DONE, s, "all_reduce")
        if target is not dst[lo:hi] and not np.shares_memory(target, dst):
            np.copyto(dst[lo:hi], target)


def _two_shot(
    comm: Communicator,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    op: str,
    acc: np.dtype[Any],
    staged: bool,
    in_place: bool,
    nbytes: int,
) -> None:
    s = comm._next_call()
    count, dtype = hi - lo, xin.dtype
    parts = len(comm.local_peers)
    comm._wait_peers(DONE, s - 1, "all_reduce")
    inputs = _inputs(comm, xin, lo, hi, s, nbytes)
    # reduce-scatter: I own shard `local_index`, reduced in rank order into my scratch
    base = _round_up(count * dtype.itemsize)  # my shard sits after the staging area
    a, b = shard_of(count, parts, comm.local_index)
    mine = comm.scratch(nbytes)[base : base + (b - a) * dtype.itemsize].view(dtype)
    reduce_into(mine, [inp[a:b] for inp in inputs], op, acc, avg_count=comm.world_size)
    comm._post(SHARD, s)
    comm._wait_peers(SHARD, s, "all_reduce")  # every shard done: no one reads inputs any more
    # all-gather: every owner's shard into my output
    for q, (qa, qb) in zip(comm.local_peers, shard_bounds(count, parts), strict=True):
        src = comm.peer_scratch(q)[base : base + (qb - qa) * dtype.itemsize].view(dtype)
        np.copyto(dst[lo + qa : lo + qb], src)
    comm._post(DONE, s)


def _hierarchical(
    comm: Communicator,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    op: str,
    acc: np.dtype[Any],
    staged: bool,
    in_place: bool,
    nbytes: int,
) -> None:
    from mpi4py import MPI

    s = comm._next_call()
    count, dtype = hi - lo, xin.dtype
    cross = comm.cross
    if not comm.uniform_nodes:  # every rank reduces everything, in rank order, over MPI
        mine = np.ascontiguousarray(xin.array[lo:hi], dtype=acc)
        every = np.empty((comm.world_size, count), dtype=acc)
        comm.mpi_wait(
            cross.Iallgather([mine.view(np.uint8), MPI.BYTE], [every.view(np.uint8), MPI.BYTE]),
            "all_reduce",
        )
        reduce_into(dst[lo:hi], list(every), op, acc, avg_count=comm.world_size)
        comm._post(DONE, s)
        return
    parts = len(comm.local_peers)
    comm._wait_peers(DONE, s - 1, "all_reduce")
    inputs = _inputs(comm, xin, lo, hi, s, nbytes)
    # intra-node reduce-scatter: my node's partial of shard `local_index` (no rounding yet)
    a, b = shard_of(count, parts, comm.local_index)
    partial = np.empty(b - a, dtype=acc)
    partial_op = "sum" if op == "avg" else op
    reduce_into(partial, [inp[a:b] for inp in inputs], partial_op, acc)
    # between nodes: the same shard's partials from every node, reduced in node order
    nodes = np.empty((cross.Get_size(), b - a), dtype=acc)
    comm.mpi_wait(
        cross.Iallgather([partial.view(np.uint8), MPI.BYTE], [nodes.view(np.uint8), MPI.BYTE]),
        "all_reduce",
    )
    base = _round_up(count * dtype.itemsize)  # my shard sits after the staging area
    mine = comm.scratch(nbytes)[base : base + (b - a) * dtype.itemsize].view(dtype)
    reduce_into(mine, list(nodes), op, acc, avg_count=comm.world_size)
    comm._post(SHARD, s)
    comm._wait_peers(SHARD, s, "all_reduce")
    # intra-node all-gather
    for q, (qa, qb) in zip(comm.local_peers, shard_bounds(count, parts), strict=True):
        src = comm.peer_scratch(q)[base : base + (qb - qa) * dtype.itemsize].view(dtype)
        np.copyto(dst[lo + qa : lo + qb], src)
    comm._post(DONE, s)
