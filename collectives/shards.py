"""A node's all-reduce shard by shard: each rank reduces one shard of every input, then
copies every other shard from its owner (the reduce-scatter + all-gather of two-shot).

Where a rank runs the all-reduce in place on a SHMEMBuffer it says so in its ``SRC`` word
(:data:`collectives.channel.SHARES`), and every rank of that call runs it this way, one-shot
plans included: the rank in place reduces its shard straight into x (no peer reads that
shard of x: each reads only its own shard of the inputs), the others' go into their scratch,
and after every ``SHARD`` (no input is read any more) each rank copies the shards it lacks
from where their owners put them. Nothing is staged, and each element is reduced once, in
rank order: bitwise the one-shot result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .channel import OFFSET_MASK, Channel, Flag
from .ops import CHUNK_BYTES, reduce_into, stage_copy
from .schedule import shard_bounds, shard_of

__all__ = ["gather_shards", "reduce_shards", "results_of"]

SHARD, DONE = Flag.SHARD, Flag.DONE


def results_of(words: list[int]) -> list[int] | None:
    """Where each rank's result sits on the heap, from the ``SRC`` words of a call (in
    rank order): its input's offset for a rank in place (:data:`SHARES` set), else -1;
    None where no rank is in place (the call needs no shards)."""
    if min(words) >= 0:
        return None
    return [w & OFFSET_MASK if w < 0 else -1 for w in words]


def reduce_shards(
    ch: Channel,
    s: int,
    inputs: list[np.ndarray[Any, Any]],
    dst: np.ndarray[Any, Any],
    lo: int,
    base: int,
    op: str,
    acc: np.dtype[Any],
    results: list[int] | None = None,
) -> None:
    """The reduce-scatter + all-gather of one node's piece ``dst[lo:lo + count]`` (``count``
    the inputs' length): I reduce shard ``local_index`` of the inputs (rank order) into
    ``dst`` where my result is on the heap (``results``: :func:`results_of`'s), else into my
    scratch at ``base``, then gather every shard (:func:`gather_shards`)."""
    count, dtype = inputs[0].shape[0], dst.dtype
    a, b = shard_of(count, len(ch.local_peers), ch.local_index)
    in_place = results is not None and results[ch.local_index] >= 0
    if in_place:
        mine = dst[lo + a : lo + b]
    else:
        end = base + (b - a) * dtype.itemsize
        mine = ch.scratch(end)[base:end].view(dtype)
    sources = [inp[a:b] for inp in inputs]
    # in place, my shard of x and the shards I copy into it are read by my peers next from
    # where I wrote them: written with streaming stores where that is faster (each size
    # timed both ways now and then: collectives.stage_way, to my DONE)
    stream = in_place and ch.stage_ways.way(mine.nbytes, key="shards")
    # x in place: the expression ((s0 op s1) op s2) ... writes out before it reads s2 (out
    # being s0 or s1 is safe, elementwise)
    if stream or (in_place and ch.local_index >= 2):
        _reduce_aside(mine, sources, op, acc, ch.world_size, stream)
    else:
        reduce_into(mine, sources, op, acc, avg_count=ch.world_size)
    gather_shards(ch, s, dst, lo, count, base, dtype, results, stream)


def _reduce_aside(
    out: np.ndarray[Any, Any],
    sources: list[np.ndarray[Any, Any]],
    op: str,
    acc: np.dtype[Any],
    avg_count: int,
    stream: bool,
) -> None:
    """:func:`ops.reduce_into` chunk by chunk through a cache-sized block, then copied (from
    the cache) into ``out``, with streaming stores where ``stream``: where ``out`` is one of
    the later ``sources`` (my shard of x in place, the rank-order expression would overwrite
    that source before reading it), or is to be written to memory. Elementwise, so the same
    bits."""
    step = max(1, CHUNK_BYTES // acc.itemsize)
    tmp = np.empty(min(step, out.shape[0]), out.dtype)
    for lo in range(0, out.shape[0], step):
        hi = min(lo + step, out.shape[0])
        reduce_into(tmp[: hi - lo], [x[lo:hi] for x in sources], op, acc, avg_count)
        stage_copy(out[lo:hi], tmp[: hi - lo], stream)


def gather_shards(
    ch: Channel,
    s: int,
    dst: np.ndarray[Any, Any],
    lo: int,
    count: int,
    base: int,
    dtype: np.dtype[Any],
    results: list[int] | None = None,
    stream: bool = False,
) -> None:
    """Publish my reduced shard (``SHARD``), then copy every owner's shard, in order, from
    where it put it (``results``: :func:`results_of`'s heap offsets of the ranks in place;
    None or -1: its scratch at ``base``) into ``dst[lo:lo + count]`` (the all-gather half of
    two-shot; ``stream``: with streaming stores). Where my own result is on the heap, wait
    for every peer's ``DONE``: they copy my shard from it."""
    ch.post(SHARD, s)
    ch.wait_peers(SHARD, s, "all_reduce")  # every shard done: no one reads inputs any more
    bounds = shard_bounds(count, len(ch.local_peers))
    isz = dtype.itemsize
    for i, (q, (qa, qb)) in enumerate(zip(ch.local_peers, bounds, strict=True)):
        at = -1 if results is None else results[i]
        if at < 0:
            src = ch.peer_scratch(q)[base : base + (qb - qa) * isz].view(dtype)
        elif q == ch.rank:
            continue  # (reduced where it belongs)
        else:
            src = ch.peer_at(q, at + qa * isz, qb - qa, dtype)
        stage_copy(dst[lo + qa : lo + qb], src, stream)
    ch.post(DONE, s)
    if results is not None and results[ch.local_index] >= 0:
        ch.wait_peers(DONE, s, "all_reduce")  # the caller owns its result again
