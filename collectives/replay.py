"""The replay of a cached small call: the node-local exchange every cached plan runs.

A small collective of a shape seen before skips argument handling and scratch layout: it
replays a plan made on its first call (kept on the channel, :func:`cached_plan`). The base
:class:`ReplayPlan` does the exchange (wait for the previous call's ``DONE``, publish the
input, raise ``READY``, wait for the peers') and each kind combines the inputs its own way
(:mod:`collectives.allreduce_plans`, :mod:`collectives.family`,
:mod:`collectives.cross_plan`). Where the C extension ``collectives._replay`` is built
(:func:`replay_status`), a plan runs those steps out of Python on the same flag words.
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from shmem import SHMEMBuffer, flight

from .channel import MAX_PLANS, Channel, Flag, shared_word, source_tag
from .ops import C_FLOAT_OPS, C_OPS, C_WIDENED

__all__ = [
    "MAX_PLANS",
    "STAGE_SMALL",
    "TINY_NBYTES",
    "ReplayPlan",
    "c_reduce_codes",
    "cached_plan",
    "replay_status",
    "round_up",
    "spin_flag",
]

DONE, READY, SRC, SIG, PROG = Flag.DONE, Flag.READY, Flag.SRC, Flag.SIG, Flag.PROG
_DONE, _READY, _SIG0, _SRC = int(DONE), int(READY), int(SIG), int(SRC)  # the hot path's
_PROG = int(PROG)
_SRC_WORD = operator.itemgetter(_SRC)
_SPIN = 64  # flag loads a replay makes itself before the bounded wait (a few microseconds)

try:  # the C replay (collectives/_replay.c), built by the install where a compiler is
    _c_replay: Any = importlib.import_module("collectives._replay")
    _C_REPLAY_WHY = "C"
    if not hasattr(_c_replay, "Memo"):  # a build older than its source
        _c_replay, _C_REPLAY_WHY = None, "pure Python: collectives._replay is out of date"
except ImportError as exc:
    _c_replay = None
    _C_REPLAY_WHY = f"pure Python: the C extension collectives._replay is not built ({exc})"

# what the C replay reduces (its code, by numpy kind and itemsize; by op): exactly the
# operations whose C expression gives numpy's bits (not float min/max: NaNs and signed zeros)
_C_TYPES = {("f", 4): 0, ("f", 8): 1, ("i", 1): 2, ("i", 2): 3, ("i", 4): 4, ("i", 8): 5}
_C_TYPES.update({("u", 1): 6, ("u", 2): 7, ("u", 4): 8, ("u", 8): 9})
_F32 = np.dtype(np.float32)  # (the low-precision floats' accumulator: ops.C_WIDENED)
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


def spin_flag(flags: memoryview, flag: int, value: int) -> bool:
    """Whether a peer's ``flag`` reaches ``value`` within a short inline spin: the common
    case, where the peers are a moment behind, costs no deadline, clock or closure."""
    for _ in range(_SPIN):  # noqa: SIM110 - a generator in any() costs more per load
        if flags[flag] >= value:
            return True
    return False


def c_reduce_codes(
    dtype: np.dtype[Any], op: str, acc: np.dtype[Any] | None = None
) -> tuple[int, int] | None:
    """The C replay's ``(type, op)`` codes for a reduction of ``dtype`` with ``op``
    accumulated in ``acc`` (default: ``dtype``), or None where its C expression would not
    give numpy's bits (or the extension is not built)."""
    if _c_replay is None or op not in C_OPS:
        return None
    if acc is not None and acc != dtype:  # float16/bfloat16 in float32 only
        wide = C_WIDENED.get(dtype)
        if wide is None or acc != _F32 or op not in C_FLOAT_OPS:
            return None
        return wide, C_OPS[op]
    ctype = _C_TYPES.get((dtype.kind, dtype.itemsize))
    if ctype is None or not dtype.isnative:
        return None
    if (dtype.kind == "f" and op not in C_FLOAT_OPS) or (dtype.kind != "f" and op == "avg"):
        return None  # (floats: not min/max, NaNs and signed zeros; integer averages truncate)
    return ctype, C_OPS[op]


_ALIGN = 64


def round_up(n: int) -> int:
    """``n`` rounded up to a multiple of 64 bytes (a cache line)."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


TINY_NBYTES = 64 << 10  # one-shot calls up to this size run from a cached plan
# A zero-copy input up to this size is staged by the C replay like a numpy one: a copy of
# 1 KiB costs less than the wait for every peer's DONE that returning a read buffer needs
# (2 ranks, 8-512 B: 1.5-1.6 us staged against 1.75-1.8 us zero-copy)
STAGE_SMALL = 1 << 10


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
            self.stage = ch.scratch(round_up(self.nbytes))[: self.nbytes].view(dtype)
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
        self.flight, self.stream = flight.recorder(), ch.stream  # where its calls are recorded
        # the fast path may replay this plan for algorithm="auto" only if the table agrees
        choice = ch.table.choose(self.nbytes, ch.world_size, ch.num_nodes)
        self.auto = choice == self.algorithm
        self.closed = False  # dropped from the cache: a remembered reference looks it up again
        # an all-reduce in place on a SHMEMBuffer runs shard by shard (collectives.shards,
        # TinyPlan's own): None, or where my reduced shard goes in my scratch
        self.share_base: int | None = None
        # whether peers read my input (not a broadcast's non-root's: it stages nothing,
        # awaits no DONE, and its x in place is no hazard)
        self.reads_mine = True
        # a broadcast beyond one chunk (collectives.family.STAGE_CHUNK): how many; its root
        # counts them in PROG (the C replay chunk by chunk after READY, this one all before
        # it), its readers copy what PROG counts
        self.chunks = 0

    def close(self) -> None:
        """Release what the plan holds beyond memory (the C replay's addresses); a plan
        the engine still remembers is then never replayed (``closed``)."""
        self.closed = True
        self.auto = False
        if self.fast is not None:
            self.fast.close()
            self.fast = None

    def exchange(
        self,
        ch: Channel,
        s: int,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        shares: bool = False,
    ) -> list[np.ndarray[Any, Any]]:
        """Call ``s``'s exchange: :meth:`publish`, then :meth:`wait_inputs`."""
        self.publish(ch, s, x, shm, shares)
        return self.wait_inputs(ch, s)

    def publish(
        self,
        ch: Channel,
        s: int,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        shares: bool = False,
    ) -> None:
        """Wait for the peers' ``DONE`` of call ``s - 1``, publish my input, raise ``READY``
        (``shares``: ``shm`` in place, :data:`collectives.channel.SHARES` set)."""
        prev = s - 1
        for f in self.flags:
            if f[_DONE] < prev and not spin_flag(f, _DONE, prev):
                ch.wait_peers(DONE, prev, self.where)
                break
        if ch.sig_seq == prev:  # the previous call was not a tiny one: was it the same?
            ch.check_signatures(None, self.where, prev)
        mine = ch.my_flags
        # the call's signature rides in SRC's upper bits (no extra store), and in its SIG
        # word only when the plan is made or the words change (a peer's mismatch shows
        # there, since the SRC word differs)
        if shm is None:
            if self.reads_mine:
                self.stage[...] = x  # the plan's dtype: no cast (cheaper than np.copyto here)
                ch.stats.staged_bytes += self.nbytes
            mine[SRC] = self.stage_word
        elif shares:
            mine[SRC] = shared_word(self.shm_src(shm))
        else:
            mine[SRC] = self.shm_src(shm)
        if self.chunks and self.reads_mine:
            mine[_PROG] = self.chunks  # all of it, before READY
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
            if f[_READY] < s and not spin_flag(f, _READY, s):
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
            if self.fast is not None and min(offsets) >= 0:  # (a rank in place: Python's)
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
        chunk: int = 0,
    ) -> None:
        """The C replay of this plan, where the extension is built. ``mode`` "reduce":
        ``ctype``/``op`` over the elements ``[lo, lo + n)`` of each input (default all);
        "copy_one": rank-order input ``root`` (beyond one ``chunk`` of bytes, its root's
        ``PROG`` followed: :attr:`chunks`); "concat": every input (these two copy bytes)."""
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
            _PROG if chunk else -1,
            chunk,
        )
        rec = self.flight
        if rec.capacity:  # the C replay records its calls itself
            code = flight.op_code(self.where.rpartition(".")[2])
            dtype = self.dtype.name.encode()[:12]
            self.fast.flight(rec.buffer, rec.capacity, self.stream, code, self.nbytes, dtype)

    def run(
        self,
        ch: Channel,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
        record: bool = False,
    ) -> None:
        """Replay one call: in C where it applies (the Python replay goes on from the step
        it hands back), else in Python; ``record``: in the flight recorder (a call the
        fast path replays: the general path records its calls itself)."""
        s = ch.seq = ch.seq + 1
        ch.signature = self.signature  # what a slow wait announces (Channel.announce)
        fast = self.fast
        code, n = _C_UNTOUCHED, -1
        if in_place and not self.hazard(ch, shm, dst):
            in_place = False  # (a broadcast's root into x itself, its non-roots)
        shares = in_place and shm is not None and self.share_base is not None
        if fast is not None and ch.sig_seq != s - 1 and not shares:
            staged = shm is None or self.nbytes <= STAGE_SMALL or in_place
            if shm is None:
                code = fast.run(s, x, 0, dst, record)
            elif staged:
                # copied in, as a numpy input: no DONE wait (in place: the peers read the
                # copy, so the result goes straight into x, with no aside and no wait)
                if shm is not self.staged_shm:
                    self.staged_addr = ch.world.heap.address(shm.offset)
                    self.staged_shm = shm
                code = fast.run(s, self.staged_addr, 0, dst, record)
            else:
                code = fast.run(s, None, self.shm_src(shm), dst, record)
            if code != _C_UNTOUCHED and staged and self.reads_mine:
                ch.stats.staged_bytes += self.nbytes
            if code == _C_DONE:  # (the C replay recorded the whole call)
                ch.stats.calls += 1
                return
            n = fast.slot  # the record it began, pending, or -1
        self.resume(ch, s, code, n, x, shm, dst, in_place, record)

    def resume(
        self,
        ch: Channel,
        s: int,
        code: int,
        n: int,
        x: np.ndarray[Any, Any],
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any],
        in_place: bool,
        record: bool,
    ) -> None:
        """Call ``s`` from where the C replay's answer ``code`` left it (``n``: the flight
        record it began, or -1)."""
        if code != _C_UNTOUCHED and shm is not None and (self.nbytes <= STAGE_SMALL or in_place):
            shm = None  # staged in C (run's rule): from here on the call is a staged one
        shares = in_place and shm is not None and self.share_base is not None
        if n < 0 and record:
            op = self.where.rpartition(".")[2]
            n = self.flight.begin(self.stream, op, self.nbytes, self.dtype)
        try:
            if code == _C_UNTOUCHED:
                if in_place and shm is not None and not shares:  # staged, as in C
                    x, shm = shm.local().reshape(-1), None
                self.finish(ch, s, self.exchange(ch, s, x, shm, shares), shm, dst, in_place)
            elif code == _C_AFTER_READY:  # the Python replay goes on from READY
                self.finish(ch, s, self.wait_inputs(ch, s), shm, dst, in_place)
            else:  # DONE is raised: wait for the peers' (they read my SHMEMBuffer)
                ch.stats.calls += 1
                self.await_done(ch, s)
        except BaseException:
            self.flight.end(n, True)
            raise
        self.flight.end(n)

    def memo(
        self,
        ch: Channel,
        x: Any,
        out: Any,
        key: object,
        shm: SHMEMBuffer | None,
        dst: np.ndarray[Any, Any] | None,
        in_place: bool,
        shape: tuple[int, ...],
        result: object = None,
        name: str | None = None,
    ) -> Any:
        """The C form of the engine's memo of a call ``(x, out, key)`` replayed with this
        plan (``collectives._replay.Memo``: :meth:`run`'s steps and the engine's checks in
        one C call; ``dst``: the result's flat view, None for a new array of ``shape`` each
        call; ``in_place``: as :meth:`run` takes it, its :meth:`hazard` already checked by
        the caller, which resumes handed-back calls with it; ``result``: what a call with
        ``dst`` returns, default ``out``; ``name``: the
        algorithm it counts under, default the plan's), or None where the C replay does not
        take the call (no C replay, a non-contiguous numpy input, a shared in-place input, a
        plan with its own run)."""
        fast = self.fast
        if fast is None or type(self).run is not ReplayPlan.run:
            return None
        staged = self.nbytes if self.reads_mine else 0
        guards: list[tuple[object, str, object]] = [
            (ch, "broken", False),
            (ch, "scratch_buf", self.scratch),
            (self, "closed", False),
            (self, "fast", fast),
            # (the attributes behind the properties World.finalized and SHMEMBuffer.closed:
            # a property costs the C code a Python call each, ~50 ns)
            (ch.world, "_finalized", False),
        ]
        src: object
        word = 0
        if shm is None:
            if type(x) is not np.ndarray or not x.flags.c_contiguous:
                return None
            src = x.reshape(-1)  # (a view)
            guards.append((x, "dtype", self.dtype))
        elif in_place and self.share_base is not None:
            return None
        else:
            guards.append((shm, "_closed", False))
            if self.nbytes <= STAGE_SMALL or in_place:  # staged, as run() does
                src = ch.world.heap.address(shm.offset)
            else:
                src, word, staged = None, self.shm_src(shm), 0
        if type(out) is SHMEMBuffer:
            guards.append((out, "_closed", False))
        return _c_replay.Memo(
            fast, x, out, key, tuple(guards), ch, self.signature, src, word, dst,
            out if result is None else result, np.empty, (shape, self.dtype), staged,
            self.algorithm if name is None else name,
        )  # fmt: skip

    def hazard(self, ch: Channel, shm: SHMEMBuffer | None, dst: np.ndarray[Any, Any]) -> bool:
        """Whether ``dst``, overlapping my zero-copy input ``shm``, is a hazard: written
        while peers may still read it (the rule for every plan that reads every input)."""
        return True

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
            if f[_DONE] < s and not spin_flag(f, _DONE, s):
                ch.wait_peers(DONE, s, self.where)
                break


def cached_plan(ch: Channel, key: Hashable, make: Callable[[], Any], acc: Any = None) -> Any:
    """The channel's plan under ``key``, made by ``make()`` when there is none, or the one
    there was made for an older scratch (or another accumulation dtype ``acc``); beyond
    ``ch.max_plans`` the least recently *made* plans are dropped (closed).

    The cache must change alike on every rank: a plan holds collective state (a persistent
    MPI all-gather between nodes, made and started in step by every member), so a rank that
    dropped a plan its peers still replay would start a different exchange. Plans are made
    on the general path, in the same call on every rank; a hit never reorders the cache, as
    whether a call hits here or replays from the engine's fast path depends on this rank's
    own arguments (a numpy ``out`` on one rank, a SHMEMBuffer on another).

    A plan has ``scratch`` (the scratch it was made for), ``acc`` where ``acc`` is given,
    ``closed`` and ``close()``."""
    plan = ch.plans.get(key)
    if plan is None or plan.scratch is not ch.scratch_buf or (acc is not None and plan.acc != acc):
        if plan is not None:
            ch.drop_plan(key)
        plan = ch.plans[key] = make()
        while len(ch.plans) > ch.max_plans:  # least recently made first
            ch.drop_plan(next(iter(ch.plans)))
    return plan
