"""The all-reduce's cached plans: a small call of a shape seen before replays one.

:class:`TinyPlan` (one node: the one-shot exchange, then a reduction in rank order; also a
small reduce-scatter's shard) and :class:`NodesPlan` (uniform nodes: the node's partial,
one signed exchange between nodes, :func:`collectives.signed.persistent_gather`, the
partials in node order), both over
:class:`collectives.replay.ReplayPlan`; the general path (:mod:`collectives.allreduce`)
makes them on a shape's first call, and the host engine's fast path replays them.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from mpi4py import MPI

from shmem import SHMEMBuffer
from shmem.errors import CollectiveMismatchError, PeerFailedError

from .channel import Channel, Flag
from .cross import PeerReduce, peer_reduce_fits, reduce_across
from .operand import Operand
from .ops import canonical_padding, divide_by_count, int_avg, reduce_into, ufunc_of, widen
from .replay import TINY_NBYTES, ReplayPlan, c_reduce_codes, cached_plan, round_up
from .shards import reduce_shards, results_of
from .signature import collective_of
from .signed import abandon_gather, abandoned, persistent_gather

__all__ = [
    "ALONE_GATHER_MAX_SENT",
    "ALONE_GATHER_MAX_SENT_MANY",
    "NODE_PLAN_NBYTES",
    "SHARE_MIN",
    "AcrossPlan",
    "NodesPlan",
    "TinyPlan",
    "node_plan_limit",
    "own_view",
    "shard_plan",
    "tiny_plan",
    "whole_gather_limit",
]

DONE = Flag.DONE
_DONE = int(DONE)


class TinyPlan(ReplayPlan):
    """A one-shot all-reduce of one shape, made once and replayed with nothing else.

    The replay does only what the protocol needs: wait for the previous call's ``DONE``,
    publish the input (a copy into my staging view, or the SHMEMBuffer's offset), raise
    ``READY``, wait for the peers', reduce in rank order, raise ``DONE`` (and, for a zero-copy
    input, wait for the peers' ``DONE``). The reduction is the same expression as
    :func:`ops.reduce_into`'s, so results are bitwise the same as every other path.

    Where the C replay applies (:func:`replay_status`; native float32/float64 sum and prod,
    every op but avg on native integers) it runs those steps out of Python on the same
    words, and hands the call back to this code at the step it cannot finish within its
    spin (a late peer, new inputs, a mismatch): the protocol, and every wait with a
    deadline, stay the same.
    """

    algorithm = "one_shot"

    def __init__(
        self,
        ch: Channel,
        count: int,
        dtype: np.dtype[Any],
        op: str,
        acc: np.dtype[Any],
        shard: tuple[int, int] | None = None,
    ) -> None:
        nbytes = count * dtype.itemsize
        share_base = None
        if shard is None and nbytes > SHARE_MIN and ch.num_nodes == 1:
            # in place on a SHMEMBuffer: shard by shard, my shard after my stage (room made
            # now, before the stage's view: every rank makes the plan in the same call)
            share_base = round_up(nbytes)
            ch.scratch(share_base + -(-count // len(ch.local_peers)) * dtype.itemsize)
        super().__init__(ch, count, dtype, op, acc)
        self.share_base = share_base
        if shard is not None:  # a reduce-scatter: my shard [lo, hi) of the reduction
            self.algorithm = "reduce_scatter"
            self.where = "Communicator.reduce_scatter"
            self.auto = True
            self.extra = op
            self.out_count = shard[1] - shard[0]
        self.shard = shard
        self.sliced: list[np.ndarray[Any, Any]] = []  # the inputs' shards (reduce-scatter)
        self.sliced_of: list[np.ndarray[Any, Any]] | None = None
        lo, hi = (0, count) if shard is None else shard
        self.ufunc = ufunc_of(op, acc)
        self.divide = acc.type(ch.world_size) if op == "avg" else None
        self.widen = acc != dtype  # low precision: accumulate in float32, round once
        self.padded = dtype == np.dtype(np.longdouble)
        self.wide_bufs: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None
        codes = c_reduce_codes(dtype, op, acc)
        if codes is not None:
            self.make_fast(ch, "reduce", ctype=codes[0], op=codes[1], lo=lo, n=hi - lo)

    def wait_inputs(self, ch: Channel, s: int) -> list[np.ndarray[Any, Any]]:
        inputs = super().wait_inputs(ch, s)
        if self.shard is None:
            return inputs
        if inputs is not self.sliced_of:  # new inputs: their shards, once
            lo, hi = self.shard
            self.sliced, self.sliced_of = [x[lo:hi] for x in inputs], inputs
        return self.sliced

    def finish(
        self,
        ch: Channel,
        s: int,
        inputs: list[np.ndarray[Any, Any]],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
    ) -> None:
        """Reduce call ``s``'s inputs (rank order) into ``dst``, raise ``DONE``; shard by
        shard where a rank is in place (collectives.shards)."""
        if self.share_base is not None and min(self.offsets) < 0:
            ch.stats.calls += 1
            results = results_of(self.offsets)
            reduce_shards(ch, s, inputs, dst, 0, self.share_base, self.op, self.acc, results)
            return
        target = np.empty_like(dst) if (in_place and shm is not None) else dst
        if self.widen:
            if self.wide_bufs is None:  # (made on the first call the C replay hands back)
                n = target.shape[0]
                self.wide_bufs = (np.empty(n, self.acc), np.empty(n, self.acc))
            acc_buf, tmp_buf = self.wide_bufs
            a = widen(inputs[0], acc_buf)
            if a is not acc_buf:
                np.copyto(acc_buf, a)
            for src in inputs[1:]:
                self.ufunc(acc_buf, widen(src, tmp_buf), out=acc_buf)
            if self.divide is not None:
                divide_by_count(acc_buf, ch.world_size)
            np.copyto(target, acc_buf, casting="unsafe")  # the one rounding
        elif len(inputs) == 1:
            if not np.may_share_memory(target, inputs[0]):
                np.copyto(target, inputs[0])
        else:
            ufunc = self.ufunc
            ufunc(inputs[0], inputs[1], out=target)
            for src in inputs[2:]:
                ufunc(target, src, out=target)
        if self.divide is not None and not self.widen:
            if target.dtype.kind in "fc":
                divide_by_count(target, ch.world_size)
            else:
                int_avg(target, int(self.divide))
        if self.padded:
            canonical_padding(target)
        if self.fence_needed:
            ch.world.heap.fence()  # release: my reads of peers' memory are done
        ch.my_flags[DONE] = s
        ch.stats.calls += 1
        if shm is not None:  # the caller owns x again once every peer has read it
            self.await_done(ch, s)
            if target is not dst:
                np.copyto(dst, target)


# One node: a one-shot all-reduce up to this size runs from a cached TinyPlan (the C replay,
# where it applies: 2 ranks, float32, at 128 KiB / 256 KiB / 1 MiB, 1.8-2.9 / 1.4-2.4 /
# 2.4-2.8x MPI against 0.6-1.2 / 0.8-1.7 / 1.7-2.0x for the general path); the dtypes
# accumulated wider (float16, bfloat16) only where the C replay reduces them (else
# TINY_NBYTES). A reduce-scatter too (float32, 2-4 ranks, 128 KiB-1 MiB, the two in one
# job: numpy input 0.47-1.25 -> 0.53-3.09x MPI, symmetric 0.68-2.34 -> 2.89-7.07). At 2 MiB,
# the plan against the general path in one job: the all-reduce at 2 ranks in place
# 1.87-2.01 -> 2.64-2.76, numpy 1.23-1.33 -> 1.34-1.35, symmetric 2.22-2.50 -> 2.56-2.77;
# the reduce-scatter at 2 and 4 ranks numpy 1.33-1.51 -> 1.72-2.07, symmetric 2.60-2.78 ->
# 3.06-4.17. Beyond, the general path (at 16 MiB the plan's symmetric forms lost 1.5 -> 1.2)
NODE_PLAN_NBYTES = 2 << 20
# In place on a SHMEMBuffer, larger than this: the call runs shard by shard; smaller, x is
# staged (one copy costs less than the shards' extra round: float32, the two in one job,
# staged / shards x MPI, 96 KiB-256 KiB: 2 ranks 1.23-1.45 / 1.10-1.22, 3 ranks 1.92-2.62 /
# 0.81-1.75, 4 ranks 0.95-2.20 / 0.99-1.23; 512 KiB-1 MiB shards win: 1.08-1.97 / 0.88-1.61)
SHARE_MIN = 256 << 10

# Between nodes of one rank each, the cached plan sends every member's whole input to every
# other (one round, the signature with the data: NodesPlan) up to this many bytes sent per
# member; beyond, the reduce-scatter + all-gather (two rounds, 2 (n - 1) / n of the vector,
# persistent requests: AcrossPlan). Simulated nodes on the 2-core VM, numpy input, x
# MPI_Allreduce, one round / two rounds, both in one job, two jobs (since both rounds'
# requests are started and tested in C). MPICH: 2 nodes 512 KiB 1.23-1.24 / 1.13-1.14,
# 768 KiB 1.18-1.23 / 1.24-1.27, 1 MiB 0.86-0.89 / 1.19-1.24; 3 nodes 96 KiB 1.26-1.33 /
# 1.10-1.13, 128 KiB 1.28-1.31 / 1.18-1.24, 192 KiB 1.38-1.39 / 1.38-1.58, 256 KiB
# 1.23-1.35 / 1.45-1.59; 4 nodes 96 KiB 0.98 / 0.98, 128 KiB 0.93-0.94 / 0.96-1.00, 192
# KiB 0.85-0.87 / 1.00-1.01: 768 KiB sent at 2 nodes, 256 KiB from 3 on. Open MPI (tcp):
# 2 nodes 512 KiB 1.09-1.14 / 0.90-0.94, 768 KiB 1.05-1.06 / 0.93-0.94, 1 MiB 0.88-1.20 /
# 0.91-1.01 (noisy), 1.5 MiB 0.88-0.95 / 0.95-1.04; 3 nodes 384 KiB 0.92 / 0.83, 512 KiB
# 0.88 / 0.92, 768 KiB 0.80 / 0.92; 4 nodes 256 KiB 0.82-0.89 / 0.68-0.74, 384 KiB
# 0.74-0.77 / 0.75-0.79, 512 KiB 0.69-0.74 / 0.75-0.81: 768 KiB sent at every node count.
ALONE_GATHER_MAX_SENT = 768 << 10
ALONE_GATHER_MAX_SENT_MANY = 256 << 10 if MPI.get_vendor()[0] == "MPICH" else 768 << 10


def whole_gather_limit(ch: Channel) -> int:
    """The bytes up to which a small all-reduce runs from a cached plan that moves whole
    inputs (:class:`TinyPlan` on one node, :class:`NodesPlan` across nodes): more between
    nodes of one rank each (:data:`ALONE_GATHER_MAX_SENT`, from 3 nodes on
    :data:`ALONE_GATHER_MAX_SENT_MANY`), the same on every rank."""
    if ch.num_nodes > 1 and ch.uniform_nodes and len(ch.local_peers) == 1:
        sent = ALONE_GATHER_MAX_SENT if ch.num_nodes == 2 else ALONE_GATHER_MAX_SENT_MANY
        return max(TINY_NBYTES, sent // (ch.num_nodes - 1))
    return TINY_NBYTES


def node_plan_limit(dtype: np.dtype[Any], op: str, acc: np.dtype[Any]) -> int:
    """The bytes up to which a one-node all-reduce or reduce-scatter runs from a cached
    plan: :data:`NODE_PLAN_NBYTES`, but :data:`TINY_NBYTES` for a dtype accumulated wider
    that the C replay does not reduce."""
    if acc == dtype or c_reduce_codes(dtype, op, acc) is not None:
        return NODE_PLAN_NBYTES
    return TINY_NBYTES


def tiny_plan(
    ch: Channel, count: int, dtype: np.dtype[Any], op: str, acc: np.dtype[Any]
) -> TinyPlan | NodesPlan | None:
    """The cached plan for this shape, or None when the call does not qualify (too large,
    debug checks on, nodes of different sizes): a :class:`TinyPlan` on one node, a
    :class:`NodesPlan` across nodes."""
    limit = node_plan_limit(dtype, op, acc) if ch.num_nodes == 1 else whole_gather_limit(ch)
    if count * dtype.itemsize > limit or ch.check_args:
        return None
    kind: type[TinyPlan] | type[NodesPlan] = TinyPlan
    if ch.num_nodes > 1:
        if not ch.uniform_nodes or ch.cross is None:
            return None
        kind = NodesPlan
    key: tuple[object, ...] = (count, dtype, op)  # (the engine's fast path looks it up)
    if collective_of(ch.signature) != "all_reduce":  # a reduce-scatter's whole all-reduce
        key = ("whole", ch.signature, *key)
    plan = cached_plan(ch, key, lambda: kind(ch, count, dtype, op, acc), acc)
    return cast("TinyPlan | NodesPlan", plan)


def shard_plan(
    ch: Channel, xin: Operand, op: str, acc: np.dtype[Any], shard: tuple[int, int]
) -> TinyPlan | None:
    """The cached plan of a small node-local reduce-scatter of this shape (a
    :class:`TinyPlan` reducing only my ``shard`` of the inputs), or None where the call
    does not qualify (the general path)."""
    count, dtype = xin.count, xin.dtype
    too_large = count * dtype.itemsize > node_plan_limit(dtype, op, acc)
    if too_large or ch.check_args or ch.num_nodes > 1:
        return None
    key = ("reduce_scatter", count, dtype, op)
    return cast(
        TinyPlan, cached_plan(ch, key, lambda: TinyPlan(ch, count, dtype, op, acc, shard), acc)
    )


class NodesPlan(ReplayPlan):
    """The cached plan of a small all-reduce across nodes (uniform nodes): every rank
    reduces its node's inputs (the one-shot exchange, in rank order, unrounded), exchanges
    that partial with the ranks of the same local index on the other nodes (one round of
    persistent MPI messages, the call signature with the data: ``persistent_gather``), and
    reduces the partials in node order: the operations of :func:`_hierarchical`, in its
    order, so bitwise the same result, without its reduce-scatter, shard exchange and
    per-call argument handling."""

    algorithm = "hierarchical"

    def __init__(
        self, ch: Channel, count: int, dtype: np.dtype[Any], op: str, acc: np.dtype[Any]
    ) -> None:
        super().__init__(ch, count, dtype, op, acc)
        self.partial_op = "sum" if op == "avg" else op
        cross = cast("MPI.Intracomm", ch.cross)
        # the partials' exchange, set up once (persistent requests; its signature is
        # this plan's)
        self.gather = persistent_gather(cross, count * acc.itemsize, self.signature)
        self.partial = self.gather.data_out.view(acc)
        self.nodes = list(self.gather.data.view(acc))  # one row per node, in node order
        self.ufunc = ufunc_of(op, acc)
        self.partial_ufunc = ufunc_of(self.partial_op, acc)
        # the common case (the input's dtype is the accumulation dtype): the reductions are
        # ufunc chains in order, the operations reduce_into makes, without its checks
        self.direct = dtype == acc and dtype != np.dtype(np.longdouble)
        self.divide = acc.type(ch.world_size) if op == "avg" else None
        # the only rank of its node: no node-local exchange (no flags, stage or fences)
        self.alone = len(ch.local_peers) == 1
        self.shm_view: tuple[SHMEMBuffer, np.ndarray[Any, Any]] | None = None

    def close(self) -> None:
        super().close()  # closed: a remembered plan is looked up again, never replayed
        self.gather.close()

    def run(
        self,
        ch: Channel,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
        record: bool = False,
    ) -> None:
        s = ch.seq = ch.seq + 1
        ch.signature = self.signature
        if self.alone:
            self.run_alone(ch, s, x, shm, dst)
            return
        try:
            inputs = self.exchange(ch, s, x, shm)
        except (CollectiveMismatchError, PeerFailedError) as exc:
            self.gather.abandon(ch, "all_reduce", abandoned(exc))  # other nodes wait: tell them
            raise
        partial = self.partial
        target = np.empty_like(dst) if (in_place and shm is not None) else dst
        if self.direct:
            if len(inputs) == 1:
                np.copyto(partial, inputs[0])
            else:
                self.partial_ufunc(inputs[0], inputs[1], out=partial)
                for src in inputs[2:]:
                    self.partial_ufunc(partial, src, out=partial)
        else:
            reduce_into(partial, inputs, self.partial_op, self.acc)
        self.reduce_nodes(ch, target)
        if self.fence_needed:  # release (Channel.post, inlined)
            ch.world.heap.fence()
        ch.my_flags[_DONE] = s
        ch.stats.calls += 1
        if shm is not None:  # the caller owns x again once every node-local peer read it
            ch.wait_peers(DONE, s, "all_reduce")
            if target is not dst:
                np.copyto(dst, target)

    def reduce_nodes(self, ch: Channel, target: np.ndarray[Any, Any]) -> None:
        """Exchange my node's partial (filled) with the other nodes and reduce every node's
        into ``target`` in node order (one rounding; ``avg`` divided by the world size)."""
        self.gather.run(ch, "all_reduce")
        if not self.direct:
            reduce_into(target, self.nodes, self.op, self.acc, avg_count=ch.world_size)
            return
        nodes, ufunc = self.nodes, self.ufunc
        ufunc(nodes[0], nodes[1], out=target)  # a plan across nodes has 2 or more
        for src in nodes[2:]:
            ufunc(target, src, out=target)
        if self.divide is not None:
            if target.dtype.kind in "fc":
                divide_by_count(target, ch.world_size)
            else:
                int_avg(target, int(self.divide))

    def run_alone(
        self,
        ch: Channel,
        s: int,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
    ) -> None:
        """Call ``s`` on the only rank of its node: its input is its node's partial, sent
        as it is (no node-local peer reads its flags, stage or input, so none is written
        and no fence is made); the partials are reduced in node order as :meth:`run` does,
        so bitwise its result. The input is copied into the send slot before ``dst`` is
        written: they may overlap."""
        if shm is not None:
            self.shm_view = kept = own_view(ch, shm, self.shm_view, self.dtype)
            x = kept[1]
        if self.direct:
            np.copyto(self.partial, x)
        else:
            reduce_into(self.partial, [x], self.partial_op, self.acc)
        self.reduce_nodes(ch, dst)
        ch.my_flags[_DONE] = s
        ch.stats.calls += 1


def own_view(
    ch: Channel,
    shm: SHMEMBuffer,
    kept: tuple[SHMEMBuffer, np.ndarray[Any, Any]] | None,
    dtype: np.dtype[Any],
) -> tuple[SHMEMBuffer, np.ndarray[Any, Any]]:
    """``(shm, my local view of it as dtype)``: ``kept`` when it is that buffer's already.
    The view is the heap's own (``peer_view``), so keeping it never holds a closed buffer's
    block (:mod:`shmem.quarantine`)."""
    if kept is not None and kept[0] is shm:
        return kept
    view = ch.heap.peer_view(ch.rank, shm.offset, shm.nbytes)
    assert view is not None  # (my own heap)
    return shm, view.view(dtype)


class AcrossPlan:
    """The cached plan of a large all-reduce across nodes of one rank each: per piece (the
    general path's pieces, in its order) the call's guarantees (``Channel.begin``), the
    reduce-scatter and all-gather between nodes (:func:`collectives.cross.reduce_across`),
    then ``DONE``: the general path's own operations, so bitwise its result, without its
    per-call argument handling, algorithm choice and piece planning (~30 us a call at
    256 KiB here). Made by :func:`collectives.allreduce.all_reduce` on a shape's first call;
    the host engine's fast path replays it. No node-local peer reads anything of it."""

    algorithm = "hierarchical"
    where = "all_reduce"
    fast = None  # no C replay: the engine records the call
    extra: object = None

    def __init__(
        self,
        ch: Channel,
        count: int,
        dtype: np.dtype[Any],
        op: str,
        acc: np.dtype[Any],
        pieces: list[tuple[int, int]],
    ) -> None:
        self.count, self.dtype, self.op, self.acc = count, dtype, op, acc
        self.out_count = count
        self.nbytes = count * dtype.itemsize
        self.pieces = pieces
        self.signature = ch.signature  # the call that made the plan: the same every replay
        self.scratch = ch.scratch_buf
        self.cross = cast("MPI.Intracomm", ch.cross)
        choice = ch.table.choose(self.nbytes, ch.world_size, ch.num_nodes)
        self.auto = choice == self.algorithm
        self.closed = False
        self.shm: SHMEMBuffer | None = None  # the last symmetric input (the engine asks)
        self.shm_view: tuple[SHMEMBuffer, np.ndarray[Any, Any]] | None = None
        self.persistent = peer_reduce_fits(self.cross.Get_size(), self.nbytes)
        # per piece: its persistent exchanges (the last two pairs of arrays: a program that
        # alternates two, as a new output each call does, keeps both) and the arrays of
        # its last two calls
        self.peers: list[list[PeerReduce]] = [[] for _ in pieces]
        self.seen: list[list[tuple[int, int]]] = [[] for _ in pieces]

    def close(self) -> None:
        """Dropped from the cache: a reference kept elsewhere is looked up again."""
        self.closed = True
        self.auto = False
        for peers in self.peers:
            for peer in peers:
                peer.close()
        self.peers = [[] for _ in self.pieces]

    def _peer(
        self, i: int, src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]
    ) -> PeerReduce | None:
        """Piece ``i``'s persistent exchange for these arrays, or None (its exchange is made
        per call): made on a call with the same arrays as one of the last two calls, so a
        program that passes new arrays every call makes its requests once a call, as
        before. The exchanges of a piece share their receive rows (calls run one at a
        time) unless one of them is busy (it may still write there)."""
        peers = self.peers[i]
        for peer in peers:
            if peer.fits(src, dst):
                return peer
        if not self.persistent or not (src.flags.c_contiguous and dst.flags.c_contiguous):
            return None
        key = (MPI.buffer(src).address, MPI.buffer(dst).address)
        seen = self.seen[i]
        if key not in seen:
            seen.append(key)
            del seen[:-2]
            return None
        if key[0] != key[1] and np.may_share_memory(src, dst):
            return None  # (an out= overlapping the input elsewhere: the general exchange)
        rows = peers[0].rows if peers and not any(p.busy for p in peers) else None
        if len(peers) == 2:
            peers.pop(0).close()  # (a busy one frees nothing: its requests stay pending)
        peer = PeerReduce(self.cross, self.signature, src, dst, rows)
        peers.append(peer)
        return peer

    def run(
        self,
        ch: Channel,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
    ) -> None:
        """One call: ``x`` (flat), or the SHMEMBuffer ``shm`` where given, in; the result
        into ``dst`` (flat; it may be ``x``: :func:`reduce_across` reads each piece first)."""
        if shm is not None:
            self.shm_view = kept = own_view(ch, shm, self.shm_view, self.dtype)
            self.shm, x = shm, kept[1]
        ch.signature = self.signature
        cross, op, acc, size = self.cross, self.op, self.acc, ch.world_size

        def abandon(exc: BaseException) -> None:  # the other nodes wait: tell them, at once
            abandon_gather(ch, cross, 0, "all_reduce", exc)

        for i, (lo, hi) in enumerate(self.pieces):
            s = ch.begin("all_reduce", abandon)
            src, target = x[lo:hi], dst[lo:hi]
            peer = self._peer(i, src, target)
            if peer is not None:
                peer.run(ch, src, target, op, acc, size, "all_reduce")
            else:
                reduce_across(ch, cross, src, target, op, acc, size, "all_reduce")
            ch.post(DONE, s)
