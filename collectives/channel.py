"""The node-local transport of one Communicator: flags, scratch, sequence numbers (internal).

Synchronisation on a node is pull-style: every rank owns a small array of int64 flags in the
symmetric heap and raises them to the call's sequence number at fixed points (``READY``: my
input is readable; ``SHARD``: my reduced shard is in my scratch; ``DONE``: I have finished
reading peers' memory for this call). Peers poll those flags through zero-copy peer views,
with a deadline. Sequence numbers only grow, so flags are never reset (but ``PROG``: a
count within one call, reset before that call's ``READY``).

Scratch reuse rule: before a rank writes its scratch for call ``s`` it waits until every
node-local peer has posted ``DONE >= s - 1`` (they finished reading it). A rank whose input is
the caller's own SHMEMBuffer (zero-copy) waits for every peer's ``DONE`` of this call before
returning, so the caller may overwrite the input at once.

The algorithm modules (``allreduce``, ``family``, ...) drive a :class:`Channel`; the
:class:`~collectives.Communicator` facade owns one and adds validation, algorithm choice and
stats. Everything here is package-internal API: public names, no compatibility promise.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, cast

import numpy as np
from mpi4py import MPI  # the collectives need MPI anyway (the exchanges between nodes)

from shmem import SHMEMBuffer, World, flight
from shmem.callreport import Reporter
from shmem.errors import (
    CollectiveMismatchError,
    PeerFailedError,
    ShmemStateError,
    SignalTimeoutError,
)
from shmem.signals import poll_until, spin_seconds

from .operand import Operand
from .ops import stage_copy
from .schedule import AlgorithmTable
from .signature import describe
from .stage_way import StageWays
from .stats import CommStats

__all__ = [
    "MAX_PLANS",
    "NUM_FLAGS",
    "SHARES",
    "Channel",
    "Flag",
    "peer_failed",
    "shared_word",
    "source_tag",
]

log = logging.getLogger(__name__)

NUM_FLAGS = 11
MAX_PLANS = 64  # cached shapes per communicator (Channel.max_plans; least recently made go)
_INLINE_TESTS = 32  # request tests an MPI exchange makes before its deadline loop
_YIELDED_TESTS = 64  # ... and then with a yield before each, still without the clock
BOARD_GRACE_S = 0.05  # an MPI exchange still pending this long reads the other nodes' board
BOARD_MAX_INTERVAL_S = 1.0  # then again at doubling intervals up to this


class Flag(enum.IntEnum):
    """Index of each of a rank's flags (``SRC`` holds a heap offset, not a sequence number)."""

    READY = 0
    SHARD = 1
    DONE = 2
    SRC = 3
    ABORT = 4  # the sequence number of a call this rank abandoned (0: none; negative: it
    # abandoned it because ranks called different collectives)
    SIG = 5  # the signature (collectives.signature) of call s sits in SIG + s % 2, written
    # once the peers finished call s - 1 (wait_previous): peers compare it after READY
    # (before reading) and after DONE
    # (SIG + 1 = 6 is the second signature slot)
    INLINE = 7  # a cached plan's input of up to 8 bytes, in the cache line of READY
    XSEQ = 8  # the board: the call (sequence number) whose MPI exchange between nodes
    XSIG = 9  # this rank waits on (XSEQ), and its signature (XSIG): read by other nodes
    PROG = 10  # a cached broadcast's root: the chunks of its input staged so far in this
    # call (collectives.family.STAGE_CHUNK each; 0 before READY, counted after it)


_READY = int(Flag.READY)
_DONE = int(Flag.DONE)  # (post's test, without the enum's attribute lookup)
OFFSET_BITS = 40  # SRC: the heap offset in the low bits, a tag of the call's signature above
OFFSET_MASK = (1 << OFFSET_BITS) - 1
TAG_BITS = 0x7FFFFF << OFFSET_BITS  # the call's tag (source_tag) in the SRC word
# the SRC word's sign bit: this rank's input is also its result (an all-reduce in place on a
# SHMEMBuffer), and the call shares the work shard by shard (collectives.shards)
SHARES = 1 << 63


def shared_word(word: int) -> int:
    """The ``SRC`` word ``word`` (offset and tag) with :data:`SHARES` set, as an int64."""
    return word - SHARES


def source_tag(sig: int) -> int:
    """23 bits of ``sig`` (folded), placed above the offset in the ``SRC`` word: a reader
    that compares the whole word sees a mismatched call without another load."""
    return ((sig ^ (sig >> 23) ^ (sig >> 46)) & 0x7FFFFF) << OFFSET_BITS


def peer_failed(what: str, rank: int, peer: int, abort: int) -> PeerFailedError:
    """The error of a rank that saw ``peer``'s ``ABORT`` word ``abort`` (negative: that
    peer stopped on a mismatch)."""
    why = "ranks called different collectives" if abort < 0 else "its error is raised there"
    return PeerFailedError(
        f"{what}: rank {rank} stopped: rank {peer} failed in its call {abs(abort)} ({why})",
        failed_rank=peer,
        mismatch=abort < 0,
    )


def _q(arr: np.ndarray[Any, Any]) -> memoryview:
    return memoryview(cast(Any, arr)).cast("B").cast("q")


ABANDONED: list[tuple[MPI.Request, object]] = []
"""Requests MPI may still complete into their buffers, with those buffers (never freed)."""


class Channel:
    """Flags, scratch and sequence numbers of one Communicator on a host World (collective
    to create: it allocates from the symmetric heap and, across nodes, splits the world
    communicator). Its barrier is a call like the others (:mod:`collectives.barrier`).

    Attributes
    ----------
    seq : int
        The sequence number of the last call that exchanged flags.
    my_flags, peer_flags : memoryview, dict of memoryview
        My flags (int64) and each node-local peer's, as zero-copy views.
    local_peers : list of int
        Node-local ranks in local-rank order (world ranks); ``local_index`` is mine.
    cross : MPI.Intracomm or None
        The ranks of other nodes this rank exchanges with (hierarchical algorithms).
    plans : OrderedDict
        Cached per-shape plans of the algorithms (cleared when the scratch moves).
    broken : bool
        A call failed after exchanging flags: peers may be mid-call, so ``close`` does not
        wait on them.
    """

    def __init__(self, world: World, stats: CommStats) -> None:
        cfg = world.config.collectives
        self.world = world
        # its own communicator: Communicators used at once by several threads (ThreadLevel
        # MULTIPLE) never match each other's MPI exchanges
        self.comm: MPI.Intracomm = world.comm.Dup()
        self.heap = world.heap
        self.progress = world.heap.progress  # served while waiting on MPI exchanges
        self.stats = stats
        self.rank, self.world_size, self.num_nodes = world.rank, world.world_size, world.num_nodes
        self.timeout_s = world.config.signal.timeout_s
        self.spin_s = spin_seconds(world.heap.host_size)
        # more ranks than cores: an MPI exchange yields the core from its second test on (32
        # tests in a row, ~9 us each on a busy core, kept the ranks whose transfers it waits
        # for off the core: 4 simulated nodes on 2 cores, 128 KiB-2 MiB, the two in one job,
        # 0.49-1.56 -> 0.60-1.73x MPI)
        self.inline_tests = _INLINE_TESTS if self.spin_s > 0 else 1
        self.check_args = cfg.check_args
        self.float32_accumulate = np.dtype(cfg.float32_accumulate)
        self.release_fence_needed = world.heap.release_fence_needed or self.num_nodes > 1
        self.table = AlgorithmTable()  # the owner sets its configured table
        self.seq = 0
        self.stream = flight.recorder().new_stream(range(self.world_size), self.comm.allgather)
        self.calls = 0  # calls checked across ranks (debug mode's call number)
        self.signature = 0  # the current call's (set by operand.agree)
        self.sig_seq = 0
        self.broken = False
        self.board_seen: dict[int, int] = {}  # rank -> the call on its board, at the last read
        # exchanges given up on (a timeout, a mismatch): MPI may still write into their
        # buffers, so they are kept for the life of the process, past this channel's
        self.pending: list[tuple[MPI.Request, object]] = ABANDONED
        self.cross_buffers: dict[tuple[int, int], np.ndarray[Any, np.dtype[np.uint8]]] = {}
        self.cross: MPI.Intracomm | None = None
        # node-local peers in local-rank order (world ranks), and my index among them
        # (and whether any rank's node has more ranks than cores: the algorithm table's
        # choice, hence every call's signature, must be the same on every rank)
        gathered = world.comm.allgather((world.node, world.local_rank, self.spin_s == 0))
        node_of = [(nd, lr) for nd, lr, _ in gathered]
        self.crowded = any(crowded for _, _, crowded in gathered)
        self.local_peers = [
            r
            for r, _ in sorted(
                ((r, lr) for r, (nd, lr) in enumerate(node_of) if nd == world.node),
                key=lambda t: t[1],
            )
        ]
        self.local_index = self.local_peers.index(self.rank)
        local = set(self.local_peers)
        self.remote_ranks = [r for r in range(self.world_size) if r not in local]
        sizes = {sum(1 for nd, _ in node_of if nd == k) for k in range(self.num_nodes)}
        self.uniform_nodes = len(sizes) == 1
        self.flags_buf = world.zeros(NUM_FLAGS, "int64")
        # what a mismatch report exchanges: every rank's own account of its call
        self.reporter = Reporter(self.comm, range(self.world_size), self.timeout_s, self.progress)
        self.scratch_buf = world.zeros(max(cfg.scratch_nbytes, 64), "uint8")
        self.scratch_max = cfg.scratch_max_nbytes
        self.stage_views: dict[tuple[int, np.dtype[Any]], np.ndarray[Any, Any]] = {}
        self.stage_ways = StageWays()  # how each size of stage is written
        # by an all-reduce's size: its last calls in a row where every rank staged its input
        # (every rank reads the same SRC words: collectives.allreduce.staged_two_shot)
        self.all_staged: dict[int, int] = {}
        self.scratch_views: dict[int, np.ndarray[Any, Any]] = {}  # by rank (mine included)
        self.input_views: dict[tuple[int, int, int, np.dtype[Any]], np.ndarray[Any, Any]] = {}
        self.plans: OrderedDict[Hashable, Any] = OrderedDict()
        self.max_plans = MAX_PLANS  # (a test makes it small to see every cache evict)
        self.my_flags = _q(self.flags_buf.local())
        self.peer_flags = {
            r: _q(cast("np.ndarray[Any, Any]", self.flags_buf.peer(r))) for r in self.local_peers
        }
        if self.num_nodes > 1:
            # uniform nodes: ranks with the same local index, one per node, in node order;
            # otherwise everyone, in rank order (every rank then reduces the whole vector)
            color, key = (world.local_rank, world.node) if self.uniform_nodes else (0, world.rank)
            self.cross = cast("MPI.Intracomm", world.comm.Split(color=color, key=key))

    def close(self) -> None:
        """Wait for the peers' last ``DONE`` (unless broken), then free flags and scratch."""
        if not self.broken:
            # a peer that abandoned a call reads nothing of ours any more
            with contextlib.suppress(PeerFailedError, CollectiveMismatchError):
                self.wait_peers(Flag.DONE, self.seq, "close")
        # drop every view of the buffers first: a view that outlived close() would keep
        # its block allocated (shmem.quarantine)
        self.drop_plans()
        self.scratch_views.clear()
        self.stage_views.clear()
        self.input_views.clear()
        self.my_flags = _q(np.zeros(NUM_FLAGS, np.int64))
        self.peer_flags = {}
        for buf in (self.scratch_buf, self.flags_buf):
            buf.close()
        if self.cross is not None:
            self.cross.Free()
            self.cross = None
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()

    def drop_plan(self, key: Hashable) -> None:
        """Forget one cached plan, releasing what it holds (a persistent MPI request); it
        is marked ``closed``, so a reference kept elsewhere (the engine's last replayed plan)
        is looked up again instead of replayed."""
        self.plans.pop(key).close()

    def drop_plans(self) -> None:
        """Forget every cached plan (the scratch moved, or the channel closes)."""
        for key in list(self.plans):
            self.drop_plan(key)

    # -- flags ---------------------------------------------------------------------------------

    def next_call(self) -> int:
        """Start a call that exchanges flags: its sequence number. Its signature is written
        by :meth:`wait_previous`, once no peer can still be comparing call ``s - 2``'s in
        the same slot."""
        self.seq += 1
        self.stats.calls += 1
        return self.seq

    def fail(self, mismatch: bool = False) -> None:
        """This rank abandons the current call (an error after flags moved): retract its
        flags, so a late peer cannot complete the call against stale input, and raise
        ``ABORT``, so a peer waiting on this rank stops with ``PeerFailedError`` (its
        ``mismatch`` set when ranks called different collectives: ``ABORT`` is then the
        call's number negated, and that peer reports the mismatch too)."""
        self.broken = True
        self.heap.fence()
        if self.my_flags[Flag.ABORT] >= 0:  # (a mismatch, once known, stays the reason)
            self.my_flags[Flag.ABORT] = -max(self.seq, 1) if mismatch else max(self.seq, 1)
        for flag in (Flag.READY, Flag.SHARD, Flag.DONE, Flag.PROG):
            self.my_flags[flag] = -1

    def post(self, flag: int, value: int) -> None:
        """Raise my ``flag`` to ``value`` (release: data written before it is visible)."""
        self.heap.fence()
        self.my_flags[flag] = value
        if flag == _DONE and self.stage_ways.timing is not None:
            self.stage_ways.done()  # (a timed stage: its call ends here)

    def wait_peers(
        self,
        flag: int,
        value: int,
        what: str,
        peers: list[int] | None = None,
        check: bool = True,
    ) -> None:
        """Wait until every peer in ``peers`` (default: the node's) has ``flag >= value``,
        within the deadline; then acquire. After a ``READY`` wait the peers' call signatures
        are compared with this rank's (unless ``check`` is False: the caller compares)."""
        deadline = 0.0
        for r in self.local_peers if peers is None else peers:
            if r == self.rank:
                continue
            view = self.peer_flags[r]
            if view[flag] >= value:
                continue
            if not deadline:
                deadline = time.monotonic() + self.timeout_s

            def ready(v: memoryview = view) -> bool:
                return bool(v[flag] >= value or v[Flag.ABORT])

            ok = self._poll(ready, deadline, what, remote=False)
            if view[Flag.ABORT]:
                raise peer_failed(what, self.rank, r, int(view[Flag.ABORT]))
            if not ok:
                name = Flag(flag).name if flag < len(Flag) else str(flag)
                raise SignalTimeoutError(
                    f"{what}: rank {self.rank} timed out after {self.timeout_s:g} s waiting for "
                    f"rank {r} ({name} flag: expected >= {value}, last value seen {view[flag]})",
                    operation=what,
                    slot=flag,
                    expected=f">= {value}",
                    last_value=int(view[flag]),
                    peers=(r,),
                )
        if check and flag == _READY:
            self.check_ready(peers, what, value)
        self.heap.fence()  # acquire

    def wait_previous(self, s: int, what: str) -> None:
        """Wait until every node-local peer finished call ``s - 1`` (``DONE``), then check
        it was the same call as this rank's (a mismatch no reader saw, as ranks that
        disagree on a broadcast's root, is caught here, one call late)."""
        if len(self.local_peers) > 1:  # (alone on the node: nothing to wait for or check)
            self.wait_peers(Flag.DONE, s - 1, what)
            if s > 1:
                self.check_signatures(None, what, s - 1)
        # the SIG slot of call s is call s - 2's: every peer finished that call's checks
        # (they come before its DONE of s - 1, which every peer has now posted)
        self.my_flags[Flag.SIG + s % 2] = self.signature
        self.sig_seq = s  # the last call whose SIG word every rank wrote

    def begin(self, what: str, abandon: Callable[[BaseException], None] | None = None) -> int:
        """Start a call (the guarantees every call applies once, before it moves data): its
        sequence number, once every node-local peer finished the previous call and made it
        with this rank's signature (:meth:`wait_previous`). On a mismatch or a peer's failure
        there, ``abandon(exc)`` runs before the error is raised: a call that exchanges with
        other nodes takes part as abandoned there, so those ranks stop at once."""
        s = self.next_call()
        try:
            self.wait_previous(s, what)
        except (CollectiveMismatchError, PeerFailedError) as exc:
            if abandon is not None:
                abandon(exc)
            raise
        return s

    def check_signatures(self, peers: list[int] | None, what: str, s: int) -> None:
        """Raise ``CollectiveMismatchError`` unless every peer in ``peers`` (default: the
        node's) made call ``s`` with this rank's signature (read after their ``READY`` or
        ``DONE`` of ``s``); on a mismatch retract this rank's flags first, so peers waiting
        on it stop as well. Unknown signatures (0) are not compared."""
        slot = Flag.SIG + s % 2
        mine = self.my_flags[slot]
        if mine <= 0:
            return
        for r in self.local_peers if peers is None else peers:
            theirs = self.peer_flags[r][slot]
            if r != self.rank and theirs != mine and theirs > 0:
                self.mismatch(what, s)

    def check_ready(self, peers: list[int] | None, what: str, s: int) -> None:
        """After the peers' ``READY`` of call ``s``: compare their signatures and the call
        tags in their ``SRC`` words with mine. The tag is the check that always holds: a
        cached all-reduce plan writes its ``SIG`` word only when its plan changes, but every
        publisher tags ``SRC`` before it raises ``READY``."""
        self.check_signatures(peers, what, s)
        mine = self.my_flags[Flag.SRC] & TAG_BITS
        for r in self.local_peers if peers is None else peers:
            if r != self.rank and (self.peer_flags[r][Flag.SRC] & TAG_BITS) != mine:
                self.mismatch(what, s)

    def mismatch(self, what: str, s: int, remote: dict[int, int] | None = None) -> None:
        """Raise ``CollectiveMismatchError`` listing every node-local rank's call ``s`` (and
        the calls ``remote`` read from other nodes' boards, by rank)."""
        slot = Flag.SIG + s % 2
        calls = {
            r: int(self.my_flags[slot] if r == self.rank else self.peer_flags[r][slot])
            for r in self.local_peers
        }
        if remote is not None:
            calls[self.rank] = self.signature
            calls.update(remote)
        listing = "; ".join(f"rank {r}: {describe(calls[r])}" for r in sorted(calls))
        self.fail(mismatch=True)
        # (the Communicator replaces this listing of signatures by every rank's own account
        # of its call: shmem.callreport)
        raise CollectiveMismatchError(f"{what}: ranks called different collectives ({listing})")

    def mpi_wait(self, req: MPI.Request, what: str, keep: object = None) -> None:
        """Wait for a non-blocking MPI exchange between nodes, within the deadline (and
        reading the board while it lasts: :meth:`_poll`)."""
        test = req.Test
        settle = getattr(req, "settle", None)  # (signed.Persistent: these tests in C)
        done = False
        try:
            if settle is not None:
                if settle(self.inline_tests, _YIELDED_TESTS):
                    done = True
                    return
            else:
                for _ in range(self.inline_tests):  # small exchanges end within microseconds:
                    if test():  # no clock, frame or closure for them (the loop costs ~0.3 us)
                        done = True
                        return
                for _ in range(_YIELDED_TESTS):  # larger ones within a few peers' turns
                    os.sched_yield()
                    if test():
                        done = True
                        return
            done = self._poll(test, time.monotonic() + self.timeout_s, what)
        finally:
            if not done:
                # a non-blocking collective cannot be cancelled: keep it (and its buffers,
                # which the caller's frame holds through ``keep``) alive, retire this channel
                self.pending.append((req, keep))
                self.broken = True
        if not done:
            absent = self.absent_ranks()
            who = (
                f"rank(s) {', '.join(map(str, absent))} never arrived: their board shows an "
                "earlier call"
                if absent
                else "a rank on another node did not arrive"
            )
            raise SignalTimeoutError(
                f"{what}: rank {self.rank} timed out after {self.timeout_s:g} s in the MPI "
                f"exchange between nodes ({who})",
                operation=what,
                slot=-1,
                expected="exchange complete",
                last_value=0,
                peers=absent,
            )

    def absent_ranks(self) -> tuple[int, ...]:
        """The ranks whose board, at this wait's last read, did not show this call: every
        rank in it announced it long before a deadline, so these never arrived (empty when
        some rank's board was not read)."""
        others = [r for r in self.local_peers + self.remote_ranks if r != self.rank]
        seen = self.board_seen
        if not others or any(r not in seen for r in others):
            return ()
        return tuple(r for r in others if seen[r] != self.seq)

    # -- between nodes -------------------------------------------------------------------------

    def _poll(
        self, ready: Callable[[], bool], deadline: float, what: str, remote: bool = True
    ) -> bool:
        """Poll ``ready`` until ``deadline``. A wait still unfinished after
        ``BOARD_GRACE_S`` puts this call on the board (:meth:`announce`) and reads every
        other rank's (:meth:`check_board`), then again at doubling intervals: a rank in the
        same call with another signature is a mismatch no flag or exchange shows (an
        ``all_reduce`` waiting on flags or on one MPI communicator, a family call or
        ``collect`` on another, never meet), and a rank that abandoned a call will not
        come; both raise at once instead of at the deadline. Fast waits never get here.
        Node-local waits (``remote=False``) read only the node's boards: a one-sided read of
        another node blocks until that rank's MPI progresses, which a rank computing in
        Python may not do for a while (the node-local peer in the MPI exchange reads them)."""
        interval = BOARD_GRACE_S
        announced = False
        self.board_seen = {}  # this wait's reads only
        while True:
            until = min(deadline, time.monotonic() + interval)
            # the first window only yields between probes, never sleeps: an MPI exchange
            # moves its data only while its request is tested (a sleeping poller cut a
            # 16 MiB all-reduce between nodes to a quarter of MPI's speed)
            yield_s = interval if not announced else 2e-3
            if poll_until(ready, until, None, self.spin_s, yield_s):
                return True
            if until >= deadline:
                return False
            if not announced:
                self.announce()
                announced = True
            self.check_board(what, remote)
            interval = min(2 * interval, BOARD_MAX_INTERVAL_S)

    def announce(self) -> None:
        """Put this call on the board for other nodes (seqlock order: a reader that sees
        the same ``XSEQ`` before and after ``XSIG`` read the signature of that call)."""
        if self.signature > 0:
            self.my_flags[Flag.XSEQ] = -1
            self.heap.fence()  # (weakly ordered CPUs: -1 is visible before the new XSIG)
            self.my_flags[Flag.XSIG] = self.signature
            self.heap.fence()
            self.my_flags[Flag.XSEQ] = self.seq
            self.heap.fence()

    def check_board(self, what: str, remote: bool = True) -> None:
        """Read every other rank's board (node-local peers through their flag views, ranks
        on other nodes one-sided: no peer takes part): raise ``PeerFailedError`` if one
        abandoned a call, ``CollectiveMismatchError`` (the calls listed) if one is in this
        call with another signature."""
        mine, s = self.signature, self.seq
        if mine <= 0:
            return
        theirs: dict[int, int] = {}
        for r in self.local_peers + (self.remote_ranks if remote else []):
            if r == self.rank:
                continue
            view = self.peer_flags.get(r)
            if view is not None:
                fetch: Callable[[int], int] = view.__getitem__
            else:

                def fetch(i: int, r: int = r) -> int:
                    return int(self.flags_buf.atomic_fetch(r, i))

            abort = fetch(Flag.ABORT)
            if abort:
                raise peer_failed(what, self.rank, r, int(abort))
            first = fetch(Flag.XSEQ)
            self.board_seen[r] = int(first)
            self.heap.fence()  # the seqlock's reads in order (local views on weak CPUs)
            sig = fetch(Flag.XSIG)
            self.heap.fence()
            if first == s and fetch(Flag.XSEQ) == s and sig > 0:
                theirs[r] = sig
        if any(sig != mine for sig in theirs.values()):
            self.mismatch(what, s, theirs)

    def cross_rows(self, members: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A receive array of ``members`` rows of ``nbytes`` for the exchanges between nodes
        (:mod:`collectives.cross`), reused across calls of the same shape (its pages are
        touched once: a fresh 16 MiB array costs milliseconds of page faults)."""
        key = (members, nbytes)
        rows = self.cross_buffers.get(key)
        if rows is None:
            if len(self.cross_buffers) >= 8:
                self.cross_buffers.clear()
            rows = self.cross_buffers[key] = np.empty((members, nbytes), np.uint8)
        return rows

    # -- inputs --------------------------------------------------------------------------------

    def publish(
        self,
        s: int,
        xin: Operand,
        scratch_bytes: int,
        lo: int = 0,
        hi: int | None = None,
        shares: bool = False,
        unread: tuple[int, int] = (0, 0),
        timed: bool = True,
    ) -> None:
        """Make my input ``[lo, hi)`` readable by node-local peers and raise ``READY``.

        A SHMEMBuffer is published where it is (zero-copy); a numpy array is copied into my
        scratch first (callers have waited for ``DONE >= s - 1``), but for the elements
        ``unread`` (``[a, b)`` of the piece) that no peer reads (my shard of a reduce-scatter:
        I reduce it from my own array). The heap offset goes into the ``SRC`` flag, so peers
        find it whatever kind of argument this rank passed. ``shares`` (a SHMEMBuffer in
        place): my input is my result too, :data:`SHARES` says so. How the stage is written
        is :attr:`stage_ways`' choice (``timed``: False where my ``DONE`` does not wait for
        the readers' copies, a broadcast's root).
        """
        hi = xin.count if hi is None else hi
        isz = xin.dtype.itemsize
        if scratch_bytes > self.scratch_buf.nbytes:
            self.scratch(scratch_bytes)
        if xin.shmem is None:
            key = (hi - lo, xin.dtype)
            mine = self.stage_views.get(key)
            if mine is None:
                mine = self.scratch_buf.local()[: (hi - lo) * isz].view(xin.dtype)
                self.stage_views[key] = mine
            a, b = unread
            staged = (hi - lo - (b - a)) * isz
            stream = self.stage_ways.way(staged, timed)
            if b > a:
                stage_copy(mine[:a], xin.array[lo : lo + a], stream)
                stage_copy(mine[b:], xin.array[lo + b : hi], stream)
            else:
                stage_copy(mine, xin.array[lo:hi], stream)
            self.stats.staged_bytes += staged
            offset = self.scratch_buf.offset
        else:
            offset = xin.shmem.offset + lo * isz
        word = offset | source_tag(self.signature)
        self.my_flags[Flag.SRC] = shared_word(word) if shares and xin.shmem is not None else word
        self.post(Flag.READY, s)

    def source_offset(self, rank: int) -> int:
        """The heap offset rank ``rank`` published its input at (after its READY)."""
        if rank == self.rank:
            return int(self.my_flags[Flag.SRC]) & OFFSET_MASK
        return int(self.peer_flags[rank][Flag.SRC]) & OFFSET_MASK

    def check_tags(self, words: list[int], order: list[int], what: str, s: int) -> None:
        """Raise ``CollectiveMismatchError`` unless every ``SRC`` word in ``words`` (ranks
        ``order``, after their ``READY`` of call ``s``) carries this rank's call tag."""
        mine = words[order.index(self.rank)] & TAG_BITS
        if any((w & TAG_BITS) != mine for w in words):
            self.mismatch(what, s)

    def peer_input(self, rank: int, count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """Rank ``rank``'s published input (after its READY), as ``count`` elements."""
        return self.peer_at(rank, self.source_offset(rank), count, dtype)

    def peer_at(
        self, rank: int, offset: int, count: int, dtype: np.dtype[Any]
    ) -> np.ndarray[Any, Any]:
        """``count`` elements of node-local rank ``rank``'s heap at ``offset`` (views kept)."""
        key = (rank, offset, count, dtype)
        cached = self.input_views.get(key)
        if cached is not None:
            return cached
        view = self.heap.peer_view(rank, offset, count * dtype.itemsize)
        if view is None:
            raise ShmemStateError(f"Channel.peer_at: rank {rank} is not on this node")
        typed = view.view(dtype)
        if len(self.input_views) > 4096:
            self.input_views.clear()
        self.input_views[key] = typed
        return typed

    # -- scratch -------------------------------------------------------------------------------

    def scratch(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """My scratch, at least ``nbytes`` (grown collectively; every rank calls it alike)."""
        if nbytes > self.scratch_buf.nbytes:
            self.wait_peers(Flag.DONE, self.seq - 1, "scratch growth")
            new = max(nbytes, min(2 * self.scratch_buf.nbytes, self.scratch_max))
            grown: SHMEMBuffer = self.world.empty(new, "uint8")  # on failure the old stays
            # views of the old scratch go first, so that closing it frees it
            self.scratch_views.clear()
            self.stage_views.clear()
            self.input_views.clear()  # offsets inside the old scratch are stale
            self.drop_plans()
            self.scratch_buf.close()
            self.scratch_buf = grown
            self.stats.scratch_growths += 1
        return self.peer_scratch(self.rank)

    def peer_scratch(self, rank: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Rank ``rank``'s scratch (node-local), as a zero-copy view (made once per scratch)."""
        view = self.scratch_views.get(rank)
        if view is None:
            buf = self.scratch_buf
            view = buf.local() if rank == self.rank else buf.peer(rank)
            self.scratch_views[rank] = view
        return cast("np.ndarray[Any, np.dtype[np.uint8]]", view)

    @property
    def scratch_capacity(self) -> int:
        """Bytes the scratch may grow to."""
        return max(self.scratch_max, self.scratch_buf.nbytes)

    def fits_scratch(self, xin: Operand) -> bool:
        """Whether the family's node-local exchange can take ``xin`` (one node, and the whole
        input fits the scratch); otherwise the family uses MPI."""
        return self.num_nodes == 1 and xin.count * xin.dtype.itemsize <= self.scratch_capacity
