"""All-reduce: one-shot, two-shot and hierarchical, all in fixed rank order.

``out = ((x_0 op x_1) op x_2) ... op x_{P-1}`` elementwise on every rank, accumulated in
float32 for float16/bfloat16/float8 (``[collectives] float32_accumulate`` for float32) and
rounded once. One-shot and two-shot evaluate exactly that expression for every element, so
they agree bitwise with each other and across ranks. Hierarchical evaluates it node by node,
``(node_0 partial) op (node_1 partial) ...`` with each partial in local-rank order: bitwise
identical on every rank, though it may differ from one-shot in the last bit for floats.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from shmem import SHMEMBuffer
from shmem.errors import (
    CollectiveArgumentError,
    CollectiveMismatchError,
    PeerFailedError,
)

from . import signed
from .allreduce_plans import (
    NODE_PLAN_NBYTES,
    SHARE_MIN,
    AcrossPlan,
    NodesPlan,
    tiny_plan,
    whole_gather_limit,
)
from .channel import OFFSET_MASK, Channel, Flag
from .cross import CROSS_RS_MIN_NBYTES, reduce_across
from .operand import Array, Operand, prepare
from .ops import STREAM_MIN, ReduceOp, accumulate_dtype, check_op, reduce_into
from .replay import cached_plan, replay_status, round_up
from .schedule import ALGORITHMS, Algorithm, AlgorithmTable, shard_of
from .shards import gather_shards, reduce_shards, results_of

if TYPE_CHECKING:
    from mpi4py import MPI

# replay_status: documented here (README), at home in collectives.replay
__all__ = ["all_reduce", "choose", "replay_status"]

log = logging.getLogger(__name__)
DONE, READY, SRC = Flag.DONE, Flag.READY, Flag.SRC


def choose(ch: Channel, algorithm: Algorithm | str, nbytes: int, where: str) -> str:
    """The algorithm to run: the table's for ``"auto"``, else the one asked for (off-node
    peers have no peer views, so several nodes always take ``hierarchical``)."""
    if algorithm == "auto":
        algo = ch.table.choose(nbytes, ch.world_size, ch.num_nodes)
    elif isinstance(algorithm, str) and algorithm in ALGORITHMS:
        algo = str(algorithm)
    else:
        raise CollectiveArgumentError(
            f"{where}: unknown algorithm (got {algorithm!r}; expected 'auto' or one of "
            f"{list(ALGORITHMS)})"
        )
    if algo != "hierarchical" and ch.num_nodes > 1:
        algo = "hierarchical"
    elif algo == "one_shot" and algorithm == "auto" and staged_two_shot(ch, nbytes):
        algo = "two_shot"
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: %d bytes on %d ranks -> %s", where, nbytes, ch.world_size, algo)
    ch.stats.count(algo)
    return algo


# Two ranks on one node, numpy inputs on both, above the cached plan (NODE_PLAN_NBYTES) and
# below STREAM_MIN (from there one-shot's stage is written with streaming stores): one-shot
# stages every byte on each rank and reduces all of them, two-shot stages half and reduces
# half, one round more. 2 ranks, float32, the two in one job, one-shot -> two-shot x MPI:
# 4 / 8 / 12 MiB 0.92-1.13 -> 1.13-1.38, 1.04-1.35 -> 1.20-1.64, 1.02-1.29 -> 1.18-1.41
# (Open MPI 0.88 -> 1.08, 1.24 -> 1.36, 1.28 -> 1.39); an input new every call 4 / 8 MiB
# 0.99 -> 1.07, 1.04 -> 1.16; 16 MiB 1.12-1.40 -> 1.16-1.31 (docs/benchmarks.md, "eleventh
# pass": less where each has its own scratch). A symmetric input stays on one-shot (4 MiB
# 5.5 -> 1.7: its peers read it where it is).
STAGED_TWO_SHOT = (NODE_PLAN_NBYTES, STREAM_MIN)
# the calls of a size in a row that every rank staged before two-shot: 2, so that a program
# alternating numpy and symmetric inputs of one size keeps one-shot for both (with 1 every
# numpy call would run one-shot and every symmetric one two-shot, the worst of each)
STAGED_CALLS = 2
MAX_STAGED_SIZES = 64  # the sizes remembered (beyond, forgotten all at once)


def staged_two_shot(ch: Channel, nbytes: int) -> bool:
    """Whether an ``"auto"`` all-reduce of ``nbytes`` runs two-shot where the table says
    one-shot: on a node of 2 ranks (not crowded), in :data:`STAGED_TWO_SHOT`, where every rank
    staged its input in the last :data:`STAGED_CALLS` calls of that size, and the table is the
    measured one (no
    ``[collectives] algorithm`` or ``one_shot_max_nbytes`` in the config). Every rank decides
    from the same ``SRC`` words (:func:`remember_staged`), so all choose alike with nothing
    exchanged."""
    low, high = STAGED_TWO_SHOT
    return (
        low < nbytes < high
        and ch.table.forced == "auto"
        and ch.table.rows == AlgorithmTable.rows
        and ch.world_size == 2
        and ch.num_nodes == 1
        and not ch.table.crowded
        and ch.all_staged.get(nbytes, 0) >= STAGED_CALLS
    )


def remember_staged(ch: Channel, nbytes: int, words: list[int]) -> None:
    """After ``READY``: count this call of ``nbytes`` if every rank staged its input (its
    ``SRC`` word my scratch's offset: the heap is symmetric), else start again from 0, for
    :func:`staged_two_shot`."""
    low, high = STAGED_TWO_SHOT
    if not low < nbytes < high or ch.world_size != 2:
        return
    if nbytes not in ch.all_staged and len(ch.all_staged) >= MAX_STAGED_SIZES:
        ch.all_staged.clear()
    offset = ch.scratch_buf.offset
    staged = all(w >= 0 and w & OFFSET_MASK == offset for w in words)
    ch.all_staged[nbytes] = ch.all_staged.get(nbytes, 0) + 1 if staged else 0


def all_reduce(
    ch: Channel,
    x: SHMEMBuffer | Array,
    op: ReduceOp | str,
    out: SHMEMBuffer | Array | None,
    algorithm: Algorithm | str,
    call: str = "all_reduce",
) -> SHMEMBuffer | Array:
    """``out = x_0 op x_1 ... op x_{P-1}`` (see the module). ``call``: the collective the
    signature names (a reduce-scatter across nodes runs as this all-reduce: a rank in a real
    all-reduce against it is still a mismatch; its plans are cached apart)."""
    where = "Communicator.all_reduce"
    algo = ""

    def validate(xin: Operand) -> tuple[object, ...]:
        nonlocal algo
        check_op(op, xin.dtype, where)
        # the algorithm that runs is part of the call ("auto" resolved): ranks that would
        # run different protocols differ in their signatures
        algo = choose(ch, algorithm, xin.count * xin.dtype.itemsize, where)
        return (algo,)

    xin, ret, dst = prepare(ch, where, x, out, lambda n: n, (str(op),), validate, name=call)
    op = str(op)
    n, isz = xin.count, xin.dtype.itemsize
    if n == 0:
        return ret
    acc = accumulate_dtype(xin.dtype, ch.float32_accumulate)
    staged = xin.shmem is None
    in_place = np.may_share_memory(dst, xin.array)
    exact = in_place and _same_elements(dst, xin.array)
    if in_place and not staged and algo == "one_shot" and (n * isz <= SHARE_MIN or not exact):
        # in place on a symmetric buffer, small or out overlapping x elsewhere than element
        # for element: the peers would read x while the result overwrites it. Staged (one
        # copy into my scratch, which they read instead), the result goes straight into x,
        # with no wait for their DONE. (Larger and exactly x: the call shares the work
        # shard by shard, collectives.shards; a symmetric out elsewhere keeps one-shot: 2
        # ranks, 1 / 4 / 16 MiB, float32, shards 1.53 / 1.62 / 2.03x MPI against
        # one-shot's 1.49 / 2.38 / 2.03x.)
        xin, staged = Operand(xin.array, where, "x"), True
    shares = exact and not staged and algo != "hierarchical"  # (SRC's SHARES bit)
    parts = len(ch.local_peers)

    def need(count: int) -> int:
        # the same on every rank whatever kind of x it passed (staging and shard space are
        # reserved either way), so every rank cuts the same pieces and grows scratch together
        return round_up(count * isz) + -(-count // parts) * isz

    piece = n
    cap = ch.scratch_capacity
    uses_scratch = not (algo == "hierarchical" and ch.num_nodes > 1 and not ch.uniform_nodes)
    if uses_scratch and need(n) > cap:
        while need(piece) > cap and piece > 1:
            piece = max(1, piece // 2)
    pieces = [(lo, min(lo + piece, n)) for lo in range(0, n, piece)]
    if across_plan_fits(ch, algo, call, n * isz):  # a cached plan the fast path replays
        key = (n, xin.dtype, op)
        plan = cached_plan(ch, key, lambda: AcrossPlan(ch, n, xin.dtype, op, acc, pieces), acc)
        plan.run(ch, xin.array, None, dst, in_place)
        return ret
    run = {"one_shot": _one_shot, "two_shot": _two_shot, "hierarchical": _hierarchical}[algo]
    for lo, hi in pieces:
        run(ch, xin, dst, lo, hi, op, acc, staged, in_place, need(hi - lo), shares)
    return ret


def _same_elements(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Whether ``a`` and ``b`` are views of the same elements, element for element."""
    return bool(
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def across_plan_fits(ch: Channel, algo: str, call: str, nbytes: int) -> bool:
    """Whether a call runs from an :class:`AcrossPlan`: a large all-reduce (not a
    reduce-scatter's) across uniform nodes of one rank each, debug checks off."""
    return (
        algo == "hierarchical"
        and call == "all_reduce"
        and ch.cross is not None
        and ch.uniform_nodes
        and len(ch.local_peers) == 1
        and nbytes > whole_gather_limit(ch)  # (below: NodesPlan, one round)
        and not ch.check_args
    )


def _inputs(
    ch: Channel,
    xin: Operand,
    lo: int,
    hi: int,
    s: int,
    scratch_bytes: int,
    shares: bool = False,
    unread: tuple[int, int] = (0, 0),
    timed: bool = True,
) -> list[np.ndarray[Any, Any]]:
    """Publish my piece ``[lo, hi)`` (``shares``: in place, :data:`channel.SHARES`;
    ``unread``: the elements no peer reads, not staged; ``timed``: whether the time to my
    ``DONE`` is the node's own, :meth:`Channel.publish`), wait for every node-local rank's,
    and return them in local-rank (= rank) order, mine my own array where it was not all
    staged. Callers have waited ``DONE >= s - 1`` already."""
    ch.publish(s, xin, scratch_bytes, lo, hi, shares, unread, timed)
    ch.wait_peers(READY, s, "all_reduce")
    inputs = [ch.peer_input(r, hi - lo, xin.dtype) for r in ch.local_peers]
    if xin.shmem is None and unread[1] > unread[0]:
        inputs[ch.local_index] = xin.array[lo:hi]
    return inputs


class _Plan:
    """What a repeated one-shot call of one shape needs, made once: the peers' flag views,
    and their inputs (valid while they publish at the same offsets)."""

    def __init__(self, ch: Channel, count: int, dtype: np.dtype[Any]) -> None:
        self.count, self.dtype = count, dtype
        self.scratch = ch.scratch_buf  # (cached_plan's key check)
        self.closed = False
        self.offsets: list[int] = []
        self.inputs: list[np.ndarray[Any, Any]] = []
        self.flags = [ch.peer_flags[r] for r in ch.local_peers if r != ch.rank]

    def sources(self, ch: Channel) -> list[np.ndarray[Any, Any]]:
        offsets = [
            ch.my_flags[SRC] if r == ch.rank else ch.peer_flags[r][SRC] for r in ch.local_peers
        ]
        if offsets != self.offsets:
            ch.check_tags(offsets, ch.local_peers, "all_reduce", ch.seq)
            self.offsets = offsets
            self.inputs = [ch.peer_input(r, self.count, self.dtype) for r in ch.local_peers]
        return self.inputs

    def close(self) -> None:
        self.closed = True


def _one_shot(
    ch: Channel,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    op: str,
    acc: np.dtype[Any],
    staged: bool,
    in_place: bool,
    nbytes: int,
    shares: bool,
) -> None:
    count = hi - lo
    if lo == 0 and hi == xin.count:
        tiny = tiny_plan(ch, count, xin.dtype, op, acc)
        if tiny is not None:
            tiny.run(ch, xin.array, xin.shmem, dst, in_place)
            return
    plan: _Plan = cached_plan(ch, (count, xin.dtype), lambda: _Plan(ch, count, xin.dtype))
    s = ch.begin("all_reduce")  # peers finished reading my scratch
    ch.publish(s, xin, nbytes, lo, hi, shares)
    if any(f[READY] < s for f in plan.flags):
        ch.wait_peers(READY, s, "all_reduce")
    else:
        ch.world.heap.fence()
        ch.check_ready(None, "all_reduce", s)
    inputs = plan.sources(ch)
    if lo == 0:  # (a call's first piece: calls are counted, not pieces)
        remember_staged(ch, xin.count * xin.dtype.itemsize, plan.offsets)
    results = results_of(plan.offsets)
    if results is not None:  # a rank in place: every rank reduces its shard, once
        reduce_shards(
            ch, s, inputs, dst, lo, round_up(count * xin.dtype.itemsize), op, acc, results
        )
        return
    # (no rank in place unstaged here: all_reduce stages or shares every such x)
    reduce_into(dst[lo:hi], inputs, op, acc, avg_count=ch.world_size)
    ch.post(DONE, s)
    if not staged:  # the caller owns x again once every peer has read it
        ch.wait_peers(DONE, s, "all_reduce")


def _two_shot(
    ch: Channel,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    op: str,
    acc: np.dtype[Any],
    staged: bool,
    in_place: bool,
    nbytes: int,
    shares: bool,
) -> None:
    s = ch.begin("all_reduce")
    # no peer reads my shard of the input: a numpy one stages only the rest
    mine = shard_of(hi - lo, len(ch.local_peers), ch.local_index)
    inputs = _inputs(ch, xin, lo, hi, s, nbytes, shares, mine)
    words = [
        int(ch.my_flags[SRC] if r == ch.rank else ch.peer_flags[r][SRC]) for r in ch.local_peers
    ]
    if lo == 0:  # (a call's first piece: calls are counted, not pieces)
        remember_staged(ch, xin.count * xin.dtype.itemsize, words)
    base = round_up((hi - lo) * xin.dtype.itemsize)
    reduce_shards(ch, s, inputs, dst, lo, base, op, acc, results_of(words))


def _hierarchical(
    ch: Channel,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    op: str,
    acc: np.dtype[Any],
    staged: bool,
    in_place: bool,
    nbytes: int,
    shares: bool,
) -> None:
    count, dtype = hi - lo, xin.dtype
    if lo == 0 and hi == xin.count:
        small = tiny_plan(ch, count, dtype, op, acc)
        if isinstance(small, NodesPlan):
            small.run(ch, xin.array, xin.shmem, dst, in_place)
            return
    cross = ch.cross
    # large vectors cross nodes as a reduce-scatter + all-gather (collectives.cross): the
    # same per-element operations in the same order as the single all-gather below
    large = cross is not None and count * dtype.itemsize >= CROSS_RS_MIN_NBYTES
    rank_order = cross is not None and not ch.uniform_nodes  # every rank reduces everything
    parts = len(ch.local_peers)
    a, b = shard_of(count, parts, ch.local_index)  # my shard of the node's reduce-scatter
    sent = 0 if large else (count if rank_order else b - a) * acc.itemsize

    def abandon(exc: BaseException) -> None:
        if cross is not None:  # the other nodes wait in the exchange: tell them, at once
            signed.abandon_gather(ch, cross, sent, "all_reduce", exc)

    s = ch.begin("all_reduce", abandon)  # node-local peers are done with the last call
    if rank_order:  # in rank order, over MPI
        cross = cast("MPI.Intracomm", cross)
        if large:
            src = xin.array[lo:hi]
            reduce_across(ch, cross, src, dst[lo:hi], op, acc, ch.world_size, "all_reduce")
            ch.post(DONE, s)
            return
        block = signed.signed_block(count * acc.itemsize, ch.signature)
        np.copyto(block[: count * acc.itemsize].view(acc), xin.array[lo:hi], casting="unsafe")
        every = signed.gather_rows(ch, cross, block, "all_reduce", "member").view(acc)
        reduce_into(dst[lo:hi], list(every), op, acc, avg_count=ch.world_size)
        ch.post(DONE, s)
        return
    if large and parts == 1:  # one rank per node: my input is my node's partial, exactly
        reduce_across(
            ch, cast("MPI.Intracomm", cross), xin.array[lo:hi], dst[lo:hi], op, acc,
            ch.world_size, "all_reduce",
        )  # fmt: skip
        ch.post(DONE, s)
        return
    # intra-node reduce-scatter: my node's partial of shard `local_index` (no rounding yet)
    try:
        # (untimed: the exchange between nodes comes before my DONE)
        inputs = _inputs(ch, xin, lo, hi, s, nbytes, timed=False)
    except (CollectiveMismatchError, PeerFailedError) as exc:
        abandon(exc)
        raise
    block = signed.signed_block((b - a) * acc.itemsize, ch.signature)  # the signature behind
    partial = block[: (b - a) * acc.itemsize].view(acc)
    partial_op = "sum" if op == "avg" else op
    reduce_into(partial, [inp[a:b] for inp in inputs], partial_op, acc)
    base = round_up(count * dtype.itemsize)  # my shard sits after the staging area
    mine = ch.scratch(nbytes)[base : base + (b - a) * dtype.itemsize].view(dtype)
    # between nodes: the same shard's partials from every node, reduced in node order
    if cross is None:  # one node: the partial is the whole reduction (two-shot, unrounded)
        reduce_into(mine, [partial], op, acc, avg_count=ch.world_size)
    elif large:
        reduce_across(ch, cross, partial, mine, op, acc, ch.world_size, "all_reduce")
    else:
        nodes = signed.gather_rows(ch, cross, block, "all_reduce", "member").view(acc)
        reduce_into(mine, list(nodes), op, acc, avg_count=ch.world_size)
    gather_shards(ch, s, dst, lo, count, base, dtype)
