"""All-reduce: one-shot, two-shot and hierarchical, all in fixed rank order.

``out = ((x_0 op x_1) op x_2) ... op x_{P-1}`` elementwise on every rank, accumulated in
float32 for float16/bfloat16/float8 (``[collectives] float32_accumulate`` for float32) and
rounded once. One-shot and two-shot evaluate exactly that expression for every element, so
they agree bitwise with each other and across ranks. Hierarchical evaluates it node by node,
``(node_0 partial) op (node_1 partial) ...`` with each partial in local-rank order: bitwise
identical on every rank, though it may differ from one-shot in the last bit for floats.
"""

from __future__ import annotations

import importlib
import logging
import operator
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from shmem import SHMEMBuffer
from shmem.dtypes import dtype_name
from shmem.errors import (
    CollectiveArgumentError,
    CollectiveMismatchError,
    PeerFailedError,
    ShmemError,
)

from .channel import Channel, Flag, source_tag
from .cross import CROSS_RS_MIN_NBYTES, reduce_across
from .operand import Array, Operand, agree, output_array
from .ops import (
    UFUNCS,
    ReduceOp,
    accumulate_dtype,
    canonical_padding,
    check_op,
    int_avg,
    reduce_into,
    widen,
)
from .schedule import ALGORITHMS, Algorithm, shard_bounds, shard_of
from .signed import PersistentGather

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = [
    "ReplayPlan",
    "TinyPlan",
    "all_reduce",
    "cached_plan",
    "choose",
    "replay_status",
    "shard_plan",
    "tiny_plan",
]

log = logging.getLogger(__name__)
DONE, READY, SHARD, SRC, SIG = Flag.DONE, Flag.READY, Flag.SHARD, Flag.SRC, Flag.SIG
_DONE, _READY, _SIG0, _SRC = int(DONE), int(READY), int(SIG), int(SRC)  # the hot path's
_SRC_WORD = operator.itemgetter(_SRC)
_SPIN = 64  # flag loads a replay makes itself before the bounded wait (a few microseconds)

try:  # the C replay (collectives/_replay.c), built by the install where a compiler is
    _c_replay: Any = importlib.import_module("collectives._replay")
    _C_REPLAY_WHY = "C"
except ImportError as exc:
    _c_replay = None
    _C_REPLAY_WHY = f"pure Python: the C extension collectives._replay is not built ({exc})"

# what the C replay reduces (its code, by numpy kind and itemsize; by op): exactly the
# operations whose C expression gives numpy's bits (not float min/max: NaNs and signed zeros)
_C_TYPES = {("f", 4): 0, ("f", 8): 1, ("i", 1): 2, ("i", 2): 3, ("i", 4): 4, ("i", 8): 5}
_C_TYPES.update({("u", 1): 6, ("u", 2): 7, ("u", 4): 8, ("u", 8): 9})
_C_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}
_C_FLOAT_OPS = ("sum", "prod")
_C_DONE, _C_UNTOUCHED, _C_AFTER_READY = 0, 1, 2  # Replay.run's answers (3: after DONE)
# how Replay combines the inputs: reduce them (all-reduce, a reduce-scatter's shard), copy
# one (broadcast) or concatenate them (all-gather)
_C_MODES = {"reduce": 0, "copy_one": 1, "concat": 2}
# How long the C replay spins on a flag before the Python wait takes over. Ranks reach a
# call a few microseconds apart in a loop with Python between calls; the Python wait costs
# more than such a spin (and yields the core for its first 2 ms anyway). None on a node with
# more ranks than cores (Channel.spin_s is 0 there), where a spin starves the rank it waits
# for: 3 ranks on 2 cores took 70 us a call with a 20 us spin, 21 us with none.
_C_SPIN_NS = 20_000


def replay_status() -> str:
    """Whether cached small all-reduces replay in C (``"C"``) or in Python, and why."""
    return _C_REPLAY_WHY


def _spin(flags: memoryview, flag: int, value: int) -> bool:
    """Whether a peer's ``flag`` reaches ``value`` within a short inline spin: the common
    case, where the peers are a moment behind, costs no deadline, clock or closure."""
    for _ in range(_SPIN):  # noqa: SIM110 - a generator in any() costs more per load
        if flags[flag] >= value:
            return True
    return False


_ALIGN = 64


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


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
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: %d bytes on %d ranks -> %s", where, nbytes, ch.world_size, algo)
    ch.stats.count(algo)
    return algo


def all_reduce(
    ch: Channel,
    x: SHMEMBuffer | Array,
    op: ReduceOp | str,
    out: SHMEMBuffer | Array | None,
    algorithm: Algorithm | str,
) -> SHMEMBuffer | Array:
    where = "Communicator.all_reduce"
    error: Exception | None = None
    xin: Operand | None = None
    ret: SHMEMBuffer | Array | None = None
    dst: Array | None = None
    record: tuple[object, ...] = ("all_reduce", "invalid")
    try:
        xin = Operand(x, where, "x")
        check_op(op, xin.dtype, where)
        ret, dst = output_array(out, xin.count, xin.dtype, where, xin)
        record = ("all_reduce", xin.count, dtype_name(xin.dtype), str(op), str(algorithm))
    except (ValueError, TypeError, ShmemError) as exc:  # also closed buffers
        error = exc
    agree(ch, where, record, error)
    if xin is None or dst is None or ret is None:  # agree() raised already; for the types
        raise CollectiveArgumentError(f"{where}: invalid arguments")
    op = str(op)
    n, isz = xin.count, xin.dtype.itemsize
    algo = choose(ch, algorithm, n * isz, where)
    if n == 0:
        return ret
    acc = accumulate_dtype(xin.dtype, ch.float32_accumulate)
    staged = xin.shmem is None
    in_place = np.may_share_memory(dst, xin.array)
    parts = 1 if algo == "one_shot" else len(ch.local_peers)

    def need(count: int) -> int:
        # the same on every rank whatever kind of x it passed (staging space is reserved
        # either way), so every rank cuts the same pieces and grows scratch together
        shard = 0 if algo == "one_shot" else -(-count // parts) * isz
        return _round_up(count * isz) + shard

    piece = n
    cap = ch.scratch_capacity
    uses_scratch = not (algo == "hierarchical" and ch.num_nodes > 1 and not ch.uniform_nodes)
    if uses_scratch and need(n) > cap:
        while need(piece) > cap and piece > 1:
            piece = max(1, piece // 2)
    run = {"one_shot": _one_shot, "two_shot": _two_shot, "hierarchical": _hierarchical}[algo]
    for lo in range(0, n, piece):
        hi = min(lo + piece, n)
        run(ch, xin, dst, lo, hi, op, acc, staged, in_place, need(hi - lo))
    return ret


def _inputs(
    ch: Channel, xin: Operand, lo: int, hi: int, s: int, scratch_bytes: int
) -> list[np.ndarray[Any, Any]]:
    """Publish my piece ``[lo, hi)``, wait for every node-local rank's, and return them in
    local-rank (= rank) order. Callers have waited ``DONE >= s - 1`` already."""
    ch.publish(s, xin, scratch_bytes, lo, hi)
    ch.wait_peers(READY, s, "all_reduce")
    return [ch.peer_input(r, hi - lo, xin.dtype) for r in ch.local_peers]


TINY_NBYTES = 64 << 10  # one-shot calls up to this size run from a cached plan
# A zero-copy input up to this size is staged by the C replay like a numpy one: a copy of
# 1 KiB costs less than the wait for every peer's DONE that returning a read buffer needs
# (2 ranks, 8-512 B: 1.5-1.6 us staged against 1.75-1.8 us zero-copy)
STAGE_SMALL = 1 << 10
MAX_PLANS = 64  # cached shapes per communicator (least recently made are dropped)


class ReplayPlan:
    """The node-local exchange a cached small call replays: wait for the previous call's
    ``DONE``, publish the input (a copy into my staging view, or the SHMEMBuffer's offset),
    raise ``READY``, wait for the peers' and return every node-local rank's input in rank
    order. Made once per shape; subclasses combine the inputs (:meth:`finish`): reduce them
    (all-reduce), copy one (broadcast) or concatenate them (all-gather,
    :class:`collectives.family.FamilyPlan`)."""

    algorithm = ""
    where = "all_reduce"  # what waits and errors name

    def __init__(
        self, ch: Channel, count: int, dtype: np.dtype[Any], op: str, acc: np.dtype[Any]
    ) -> None:
        self.count, self.dtype, self.op, self.acc = count, dtype, op, acc
        self.nbytes = count * dtype.itemsize
        self.signature = ch.signature  # the call that made the plan: the same every replay
        if self.nbytes <= 8:
            # inline: the input rides in my flags' cache line, which a peer loads anyway
            # for READY (one cache-line transfer less per call than a scratch stage)
            word = ch.flags_buf.local()[Flag.INLINE : Flag.INLINE + 1]
            self.stage = word.view(np.uint8)[: self.nbytes].view(dtype)
            self.stage_offset = ch.flags_buf.offset + Flag.INLINE * 8
        else:
            self.stage = ch.scratch(_round_up(self.nbytes))[: self.nbytes].view(dtype)
            self.stage_offset = ch.scratch_buf.offset
        self.tag = source_tag(self.signature)
        self.stage_word = self.stage_offset | self.tag
        self.flags = [ch.peer_flags[r] for r in ch.local_peers if r != ch.rank]
        self.order = list(ch.local_peers)
        # every rank's flag words in rank order (mine included): the SRC words to compare
        self.words = [ch.my_flags if r == ch.rank else ch.peer_flags[r] for r in self.order]
        self.offsets: list[int] = []
        self.inputs: list[np.ndarray[Any, Any]] = []
        self.shm: SHMEMBuffer | None = None  # the last zero-copy input, and its SRC word
        self.shm_word = 0
        self.staged_shm: SHMEMBuffer | None = None  # the last small one staged, and where
        self.staged_addr = 0  # its bytes are in this process
        self.fast: Any = None  # the C replay (collectives._replay.Replay), where it applies
        self.extra: object = None  # the key's last item: a broadcast's root, a shard's op
        self.out_count = count  # elements of the result
        self.scratch = ch.scratch_buf
        # x86-64 orders loads before a later store (TSO): the release fence is a no-op there
        self.fence_needed = ch.release_fence_needed
        # the fast path may replay this plan for algorithm="auto" only if the table agrees
        choice = ch.table.choose(self.nbytes, ch.world_size, ch.num_nodes)
        self.auto = choice == self.algorithm

    def close(self) -> None:
        """Release what the plan holds beyond memory (the C replay's addresses)."""
        if self.fast is not None:
            self.fast.close()
            self.fast = None

    def exchange(
        self, ch: Channel, s: int, x: np.ndarray[Any, Any], shm: SHMEMBuffer | None
    ) -> list[np.ndarray[Any, Any]]:
        """Call ``s``'s exchange: :meth:`publish`, then :meth:`wait_inputs`."""
        self.publish(ch, s, x, shm)
        return self.wait_inputs(ch, s)

    def publish(
        self, ch: Channel, s: int, x: np.ndarray[Any, Any], shm: SHMEMBuffer | None
    ) -> None:
        """Wait for the peers' ``DONE`` of call ``s - 1``, publish my input, raise ``READY``."""
        prev = s - 1
        for f in self.flags:
            if f[_DONE] < prev and not _spin(f, _DONE, prev):
                ch.wait_peers(DONE, prev, self.where)
                break
        if ch.sig_seq == prev:  # the previous call was not a tiny one: was it the same?
            ch.check_signatures(None, self.where, prev)
        mine = ch.my_flags
        # the call's signature rides in SRC's upper bits (no extra store), and in its SIG
        # word only when the plan is made or the words change (a peer's mismatch shows
        # there, since the SRC word differs)
        if shm is None:
            self.stage[...] = x  # the plan's dtype: no cast (cheaper than np.copyto here)
            mine[SRC] = self.stage_word
            ch.stats.staged_bytes += self.nbytes
        else:
            mine[SRC] = self.shm_src(shm)
        if self.fence_needed:  # release (Channel.post, inlined)
            ch.world.heap.fence()
        mine[_READY] = s

    def shm_src(self, shm: SHMEMBuffer) -> int:
        """The SRC word of a zero-copy input (the last one's is kept: its offset is known)."""
        if shm is not self.shm:
            self.shm_word = shm.offset | self.tag
            self.shm = shm
        return self.shm_word

    def wait_inputs(self, ch: Channel, s: int) -> list[np.ndarray[Any, Any]]:
        """Wait for the peers' ``READY`` of call ``s``; every rank's input, in rank order
        (checked against the plan's SRC words: a mismatch raises on every rank)."""
        for f in self.flags:
            if f[_READY] < s and not _spin(f, _READY, s):
                ch.wait_peers(READY, s, self.where, check=False)
                break
        else:
            if self.fence_needed:  # acquire (free on x86-64: loads keep their order)
                ch.world.heap.fence()
        offsets = list(map(_SRC_WORD, self.words))  # (a comprehension costs a frame here)
        if offsets != self.offsets:
            ch.my_flags[_SIG0 + (s & 1)] = self.signature  # for the listing, should it differ
            ch.check_tags(offsets, self.order, self.where, s)
            inputs = [ch.peer_input(r, self.count, self.dtype) for r in self.order]
            if self.fast is not None:
                self.fast.set_inputs(offsets, inputs)
            self.offsets, self.inputs = offsets, inputs
        return self.inputs

    def make_fast(
        self,
        ch: Channel,
        mode: str,
        *,
        ctype: int = 0,
        op: int = 0,
        root: int = 0,
        lo: int = 0,
        n: int = -1,
    ) -> None:
        """The C replay of this plan, where the extension is built. ``mode`` "reduce":
        ``ctype``/``op`` over the elements ``[lo, lo + n)`` of each input (default all);
        "copy_one": rank-order input ``root``; "concat": every input (these two copy bytes)."""
        if _c_replay is None:
            return
        count = self.count
        if mode != "reduce":
            ctype, count = _C_TYPES["u", 1], self.nbytes
        self.fast = _c_replay.Replay(
            ch.my_flags,
            tuple(self.flags),
            tuple(self.words),
            self.stage,
            self.stage_word,
            _READY,
            _DONE,
            _SRC,
            ctype,
            op,
            count,
            _C_SPIN_NS if ch.spin_s > 0 else 0,
            _C_MODES[mode],
            root,
            lo,
            n,
        )

    def run(
        self,
        ch: Channel,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
    ) -> None:
        """Replay one call: in C where it applies (the Python replay goes on from the step
        it hands back), else in Python."""
        s = ch.seq = ch.seq + 1
        ch.signature = self.signature  # what a slow wait announces (Channel.announce)
        fast = self.fast
        if fast is not None and ch.sig_seq != s - 1 and not (in_place and shm is not None):
            if shm is None:
                code = fast.run(s, x, 0, dst)
            elif self.nbytes <= STAGE_SMALL:  # copied in, as a numpy input: no DONE wait
                if shm is not self.staged_shm:
                    self.staged_addr = ch.world.heap.address(shm.offset)
                    self.staged_shm = shm
                code = fast.run(s, self.staged_addr, 0, dst)
                if code != _C_UNTOUCHED:
                    shm = None  # from here on the call is a staged one
            else:
                code = fast.run(s, None, self.shm_src(shm), dst)
            if code != _C_UNTOUCHED:
                if shm is None:
                    ch.stats.staged_bytes += self.nbytes
                if code == _C_DONE:
                    ch.stats.calls += 1
                elif code == _C_AFTER_READY:  # the Python replay goes on from READY
                    self.finish(ch, s, self.wait_inputs(ch, s), shm, dst, in_place)
                else:  # DONE is raised: wait for the peers' (they read my SHMEMBuffer)
                    ch.stats.calls += 1
                    self.await_done(ch, s)
                return
        self.finish(ch, s, self.exchange(ch, s, x, shm), shm, dst, in_place)

    def finish(
        self,
        ch: Channel,
        s: int,
        inputs: list[np.ndarray[Any, Any]],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
    ) -> None:
        """Combine call ``s``'s inputs (rank order) into ``dst`` and raise ``DONE`` (for a
        zero-copy input, then wait for the peers'): each plan's own."""
        raise NotImplementedError

    def await_done(self, ch: Channel, s: int) -> None:
        """Wait for the peers' ``DONE`` of call ``s`` (they have read my input)."""
        for f in self.flags:
            if f[_DONE] < s and not _spin(f, _DONE, s):
                ch.wait_peers(DONE, s, self.where)
                break


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
        super().__init__(ch, count, dtype, op, acc)
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
        self.ufunc = UFUNCS[op]
        self.divide = acc.type(ch.world_size) if op == "avg" else None
        self.widen = acc != dtype  # low precision: accumulate in float32, round once
        self.padded = dtype == np.dtype(np.longdouble)
        self.acc_buf = np.empty(hi - lo if self.widen else 0, acc)
        self.tmp_buf = np.empty(hi - lo if self.widen else 0, acc)
        ctype = _C_TYPES.get((dtype.kind, dtype.itemsize))
        if (
            ctype is not None
            and dtype.isnative
            and not self.widen
            and op in _C_OPS
            and (dtype.kind != "f" or op in _C_FLOAT_OPS)
        ):
            self.make_fast(ch, "reduce", ctype=ctype, op=_C_OPS[op], lo=lo, n=hi - lo)

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
        """Reduce call ``s``'s inputs (rank order) into ``dst``, raise ``DONE``."""
        target = np.empty_like(dst) if (in_place and shm is not None) else dst
        if self.widen:
            a = widen(inputs[0], self.acc_buf)
            if a is not self.acc_buf:
                np.copyto(self.acc_buf, a)
            for src in inputs[1:]:
                self.ufunc(self.acc_buf, widen(src, self.tmp_buf), out=self.acc_buf)
            if self.divide is not None:
                np.divide(self.acc_buf, self.divide, out=self.acc_buf)
            np.copyto(target, self.acc_buf, casting="unsafe")  # the one rounding
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
                np.divide(target, self.divide, out=target)
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


def tiny_plan(
    ch: Channel, count: int, dtype: np.dtype[Any], op: str, acc: np.dtype[Any]
) -> TinyPlan | NodesPlan | None:
    """The cached plan for this shape, or None when the call does not qualify (too large,
    debug checks on, nodes of different sizes): a :class:`TinyPlan` on one node, a
    :class:`NodesPlan` across nodes."""
    if count * dtype.itemsize > TINY_NBYTES or ch.check_args:
        return None
    kind: type[TinyPlan] | type[NodesPlan] = TinyPlan
    if ch.num_nodes > 1:
        if not ch.uniform_nodes or ch.cross is None:
            return None
        kind = NodesPlan
    plan = cached_plan(ch, (count, dtype, op), lambda: kind(ch, count, dtype, op, acc), acc)
    return cast("TinyPlan | NodesPlan", plan)


def cached_plan(ch: Channel, key: Hashable, make: Callable[[], Any], acc: Any = None) -> Any:
    """The channel's plan under ``key``, made by ``make()`` when there is none, or the one
    there was made for an older scratch (or another accumulation dtype ``acc``); the least
    recently made plans beyond :data:`MAX_PLANS` are dropped. A plan has ``scratch``
    (the scratch it was made for), ``acc`` where ``acc`` is given, and ``close()``."""
    plan = ch.plans.get(key)
    if plan is None or plan.scratch is not ch.scratch_buf or (acc is not None and plan.acc != acc):
        if plan is not None:
            ch.drop_plan(key)
        plan = ch.plans[key] = make()
        while len(ch.plans) > MAX_PLANS:  # least recently made first
            ch.drop_plan(next(iter(ch.plans)))
    else:
        ch.plans.move_to_end(key)
    return plan


def shard_plan(
    ch: Channel, xin: Operand, op: str, acc: np.dtype[Any], shard: tuple[int, int]
) -> TinyPlan | None:
    """The cached plan of a small node-local reduce-scatter of this shape (a
    :class:`TinyPlan` reducing only my ``shard`` of the inputs), or None where the call
    does not qualify (the general path)."""
    count, dtype = xin.count, xin.dtype
    if count * dtype.itemsize > TINY_NBYTES or ch.check_args or ch.num_nodes > 1:
        return None
    key = ("reduce_scatter", count, dtype, op)
    return cast(
        TinyPlan, cached_plan(ch, key, lambda: TinyPlan(ch, count, dtype, op, acc, shard), acc)
    )


class NodesPlan(ReplayPlan):
    """The cached plan of a small all-reduce across nodes (uniform nodes): every rank
    reduces its node's inputs (the one-shot exchange, in rank order, unrounded), exchanges
    that partial with the ranks of the same local index on the other nodes (one MPI
    all-gather, the call signature behind the data), and reduces the partials in node order:
    the operations of :func:`_hierarchical`, in its order, so bitwise the same result,
    without its reduce-scatter, shard exchange and per-call argument handling."""

    algorithm = "hierarchical"

    def __init__(
        self, ch: Channel, count: int, dtype: np.dtype[Any], op: str, acc: np.dtype[Any]
    ) -> None:
        super().__init__(ch, count, dtype, op, acc)
        self.partial_op = "sum" if op == "avg" else op
        cross = cast("MPI.Intracomm", ch.cross)
        # the partials' exchange, set up once (a persistent all-gather; its signature is
        # this plan's)
        self.gather = PersistentGather(cross, count * acc.itemsize, self.signature)
        self.partial = self.gather.data_out.view(acc)
        self.nodes = list(self.gather.data.view(acc))  # one row per node, in node order
        self.ufunc = UFUNCS[op]
        self.partial_ufunc = UFUNCS[self.partial_op]
        # the common case (the input's dtype is the accumulation dtype): the reductions are
        # ufunc chains in order, the operations reduce_into makes, without its checks
        self.direct = dtype == acc and dtype != np.dtype(np.longdouble)
        self.divide = acc.type(ch.world_size) if op == "avg" else None

    def close(self) -> None:
        self.auto = False  # a remembered plan is not replayed once dropped
        self.gather.close()

    def run(
        self,
        ch: Channel,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
    ) -> None:
        s = ch.seq = ch.seq + 1
        ch.signature = self.signature
        try:
            inputs = self.exchange(ch, s, x, shm)
        except (CollectiveMismatchError, PeerFailedError):
            self.gather.abandon(ch, "all_reduce")  # other nodes wait: tell them at once
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
            self.gather.run(ch, "all_reduce")
            nodes, ufunc = self.nodes, self.ufunc
            ufunc(nodes[0], nodes[1], out=target)  # a plan across nodes has 2 or more
            for src in nodes[2:]:
                ufunc(target, src, out=target)
            if self.divide is not None:
                if target.dtype.kind in "fc":
                    np.divide(target, self.divide, out=target)
                else:
                    int_avg(target, int(self.divide))
        else:
            reduce_into(partial, inputs, self.partial_op, self.acc)
            self.gather.run(ch, "all_reduce")
            reduce_into(target, self.nodes, self.op, self.acc, avg_count=ch.world_size)
        if self.fence_needed:  # release (Channel.post, inlined)
            ch.world.heap.fence()
        ch.my_flags[_DONE] = s
        ch.stats.calls += 1
        if shm is not None:  # the caller owns x again once every node-local peer read it
            ch.wait_peers(DONE, s, "all_reduce")
            if target is not dst:
                np.copyto(dst, target)


class _Plan:
    """What a repeated one-shot call of one shape needs, made once: the peers' flag views,
    and their inputs (valid while they publish at the same offsets)."""

    def __init__(self, ch: Channel, count: int, dtype: np.dtype[Any]) -> None:
        self.count, self.dtype = count, dtype
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
) -> None:
    count = hi - lo
    if lo == 0 and hi == xin.count:
        tiny = tiny_plan(ch, count, xin.dtype, op, acc)
        if tiny is not None:
            tiny.run(ch, xin.array, xin.shmem, dst, in_place)
            return
    s = ch.next_call()
    key = (count, xin.dtype)
    plan = ch.plans.get(key)
    if plan is None:
        plan = ch.plans[key] = _Plan(ch, count, xin.dtype)
        while len(ch.plans) > MAX_PLANS:  # least recently made first
            ch.drop_plan(next(iter(ch.plans)))
    ch.wait_previous(s, "all_reduce")  # peers finished reading my scratch
    ch.publish(s, xin, nbytes, lo, hi)
    if any(f[READY] < s for f in plan.flags):
        ch.wait_peers(READY, s, "all_reduce")
    else:
        ch.world.heap.fence()
        ch.check_ready(None, "all_reduce", s)
    inputs = plan.sources(ch)
    # zero-copy and in place: peers still read my x, so reduce aside and write after DONE
    aside = in_place and not staged
    target = np.empty(count, dst.dtype) if aside else dst[lo:hi]
    reduce_into(target, inputs, op, acc, avg_count=ch.world_size)
    ch.post(DONE, s)
    if not staged:  # the caller owns x again once every peer has read it
        ch.wait_peers(DONE, s, "all_reduce")
        if aside:
            np.copyto(dst[lo:hi], target)


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
) -> None:
    s = ch.next_call()
    count, dtype = hi - lo, xin.dtype
    parts = len(ch.local_peers)
    ch.wait_previous(s, "all_reduce")
    inputs = _inputs(ch, xin, lo, hi, s, nbytes)
    # reduce-scatter: I own shard `local_index`, reduced in rank order into my scratch
    base = _round_up(count * dtype.itemsize)  # my shard sits after the staging area
    a, b = shard_of(count, parts, ch.local_index)
    mine = ch.scratch(nbytes)[base : base + (b - a) * dtype.itemsize].view(dtype)
    reduce_into(mine, [inp[a:b] for inp in inputs], op, acc, avg_count=ch.world_size)
    _gather_shards(ch, s, dst, lo, count, base, dtype)


def _gather_shards(
    ch: Channel,
    s: int,
    dst: np.ndarray[Any, Any],
    lo: int,
    count: int,
    base: int,
    dtype: np.dtype[Any],
) -> None:
    """Publish my reduced shard (``SHARD``), then copy every owner's shard, in order, from
    its scratch at ``base`` into ``dst[lo:lo + count]`` (the all-gather half of two-shot)."""
    ch.post(SHARD, s)
    ch.wait_peers(SHARD, s, "all_reduce")  # every shard done: no one reads inputs any more
    for q, (qa, qb) in zip(ch.local_peers, shard_bounds(count, len(ch.local_peers)), strict=True):
        src = ch.peer_scratch(q)[base : base + (qb - qa) * dtype.itemsize].view(dtype)
        np.copyto(dst[lo + qa : lo + qb], src)
    ch.post(DONE, s)


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
) -> None:

    count, dtype = hi - lo, xin.dtype
    if lo == 0 and hi == xin.count:
        small = tiny_plan(ch, count, dtype, op, acc)
        if isinstance(small, NodesPlan):
            small.run(ch, xin.array, xin.shmem, dst, in_place)
            return
    s = ch.next_call()
    cross = ch.cross
    # large vectors cross nodes as a reduce-scatter + all-gather (collectives.cross): the
    # same per-element operations in the same order as the single all-gather below
    large = cross is not None and count * dtype.itemsize >= CROSS_RS_MIN_NBYTES
    if (
        cross is not None and not ch.uniform_nodes
    ):  # every rank reduces everything, in rank order, over MPI
        try:
            ch.wait_previous(s, "all_reduce")  # node-local peers are done with the last call
        except (CollectiveMismatchError, PeerFailedError):
            ch.abandon_exchange(cross, 0 if large else count * acc.itemsize, "all_reduce")
            raise
        if large:
            src = xin.array[lo:hi]
            reduce_across(ch, cross, src, dst[lo:hi], op, acc, ch.world_size, "all_reduce")
            ch.post(DONE, s)
            return
        block = ch.signed_block(count * acc.itemsize)
        np.copyto(block[: count * acc.itemsize].view(acc), xin.array[lo:hi], casting="unsafe")
        every = ch.gather_signed(cross, block, "all_reduce").view(acc)
        reduce_into(dst[lo:hi], list(every), op, acc, avg_count=ch.world_size)
        ch.post(DONE, s)
        return
    parts = len(ch.local_peers)
    if large and parts == 1:  # one rank per node: my input is my node's partial, exactly
        try:
            ch.wait_previous(s, "all_reduce")
        except (CollectiveMismatchError, PeerFailedError):
            ch.abandon_exchange(cast("MPI.Intracomm", cross), 0, "all_reduce")
            raise
        reduce_across(
            ch, cast("MPI.Intracomm", cross), xin.array[lo:hi], dst[lo:hi], op, acc,
            ch.world_size, "all_reduce",
        )  # fmt: skip
        ch.post(DONE, s)
        return
    # intra-node reduce-scatter: my node's partial of shard `local_index` (no rounding yet)
    a, b = shard_of(count, parts, ch.local_index)
    try:
        ch.wait_previous(s, "all_reduce")
        inputs = _inputs(ch, xin, lo, hi, s, nbytes)
    except (CollectiveMismatchError, PeerFailedError):
        if cross is not None:  # the other nodes wait in the exchange: tell them, at once
            ch.abandon_exchange(cross, 0 if large else (b - a) * acc.itemsize, "all_reduce")
        raise
    block = ch.signed_block((b - a) * acc.itemsize)  # the signature rides behind the data
    partial = block[: (b - a) * acc.itemsize].view(acc)
    partial_op = "sum" if op == "avg" else op
    reduce_into(partial, [inp[a:b] for inp in inputs], partial_op, acc)
    base = _round_up(count * dtype.itemsize)  # my shard sits after the staging area
    mine = ch.scratch(nbytes)[base : base + (b - a) * dtype.itemsize].view(dtype)
    # between nodes: the same shard's partials from every node, reduced in node order
    if cross is None:  # one node: the partial is the whole reduction (two-shot, unrounded)
        reduce_into(mine, [partial], op, acc, avg_count=ch.world_size)
    elif large:
        reduce_across(ch, cross, partial, mine, op, acc, ch.world_size, "all_reduce")
    else:
        nodes = ch.gather_signed(cross, block, "all_reduce").view(acc)
        reduce_into(mine, list(nodes), op, acc, avg_count=ch.world_size)
    _gather_shards(ch, s, dst, lo, count, base, dtype)
