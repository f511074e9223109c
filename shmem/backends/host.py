"""Host backend: the symmetric heap in an MPI-3 shared-memory window.

Layout
------
Every rank owns one slab of ``nbytes`` in a window from ``MPI.Win.Allocate_shared`` on its
node communicator, so ranks of the same node load and store each other's slabs directly
(``Shared_query`` views). When the job spans several nodes, the slabs come instead from one
``MPI.Win.Allocate`` window on the world communicator: node-local peers still map each other's
segments with ``Shared_query`` (MPI 4.1 allows it on any window; MPICH shares
``Win_allocate`` memory within a node), and peers on other nodes are reached with
passive-target RMA on memory MPI allocated itself, so it can use its fast paths (registered
memory; shared memory where the "other node" is the same machine). Where the library cannot
map a ``Win_allocate`` window's node-local memory, a second window is created with
``MPI.Win.Create`` over the slab (``Lock_all`` once, ``Put``/``Get`` + ``Flush``).

Atomics
-------
MPI only guarantees atomicity among accumulate operations on the same window. All atomics of
a job therefore go through one window: the shared window when the job is one node (they then
complete without the target's help), else the world window (target ranks must make MPI
progress: every wait loop of this package calls :meth:`HostHeap.progress`).

Progress
--------
A put to an off-node peer ends with ``Flush``, which returns once that peer's MPI progress
engine has applied it: a peer that computes for a long time without calling MPI delays the
put until it next waits, signals or calls MPI (the launcher's ``--timeout`` bounds a peer that
never does). Atomics and signals to off-node peers are request-based and bounded by the
deadline (``RemoteTimeoutError``); gets are ``Rget`` requests, bounded the same way.

Ordering
--------
``fence()`` is ``Win.Sync`` on the windows: a full memory barrier for load/store traffic (on
x86-64, whose total store order already gives release/acquire, only the RMA window's).
``put_bytes`` to an off-node peer returns after ``Flush`` (remote completion), so anything
signalled afterwards is ordered after the data.
"""

from __future__ import annotations

import logging
import mmap
import platform
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from ..config import HeapConfig
from ..errors import ArgumentError, RemoteTimeoutError
from ..signals import poll_until
from . import _cpu_atomics, rma_accel, strided
from .host_atomics import HostAtomics
from .nodes import host_size, shared_ranks

__all__ = ["HostHeap", "strided_view"]

log = logging.getLogger(__name__)

# x86-64 is total-store-order: stores become visible in program order and loads are not
# reordered with older loads, which is all the release/acquire pattern of signals needs, so
# the load/store fence is free there (as std::atomic_thread_fence(release) compiles to nothing).
_TOTAL_STORE_ORDER = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"}


def _message(arr: np.ndarray[Any, Any]) -> list[Any]:
    """A contiguous array as an MPI message of its bytes (numpy cannot export a buffer of a
    user-defined dtype such as bfloat16: those go as a uint8 view)."""
    return [arr if arr.dtype.isbuiltin else arr.view(np.uint8), MPI.BYTE]


def strided_view(
    flat: np.ndarray[Any, Any], block: int, nblocks: int, stride: int
) -> np.ndarray[Any, Any]:
    """The ``(nblocks, block)`` elements of ``flat`` that a strided transfer touches."""
    isz = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(
        flat, (nblocks, block), (stride * isz, isz), writeable=True
    )


_MAP_FIXED_NOREPLACE = 0x100000
_MAP_NORESERVE = 0x4000


def _fill_holes(ranges: list[tuple[int, int]]) -> None:
    """Map empty memory where the freed segments were, so numpy views the program kept past
    ``finalize`` read zeros instead of faulting. Only where nothing else was mapped since
    (``MAP_FIXED_NOREPLACE``): a range already reused is left alone. No swap is reserved,
    and pages cost memory only if a stale view writes them."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    spans = sorted((a // page * page, -(-(a + n) // page) * page) for a, n in ranges if n > 0)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):  # pragma: no cover - not Linux/glibc
        return
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED_NOREPLACE | _MAP_NORESERVE
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    failed = ctypes.c_void_p(-1).value

    def fill(lo: int, hi: int) -> bool:
        got = libc.mmap(lo, hi - lo, prot, flags, -1, 0)
        if got == lo:
            return True
        if got is not None and got != failed:
            libc.munmap(got, hi - lo)  # an old kernel placed it elsewhere: not ours to keep
        return False

    for lo, hi in merged:
        if not fill(lo, hi):  # part of it is still (or again) mapped: fill the holes only
            for at in range(lo, hi, page):
                fill(at, at + page)


class HostHeap(HostAtomics):
    """One shared-memory slab per rank, plus an RMA window when the job spans nodes.

    Parameters
    ----------
    comm : MPI.Intracomm
        The world communicator (already duplicated by the caller, who keeps ownership).
    node_comm : MPI.Intracomm
        Ranks sharing memory (from :func:`split_nodes`); ``local_rank`` is its rank.
    config : HeapConfig
        ``nbytes`` per rank and ``alignment``.
    """

    name = "host"
    device_memory = False  # the slab is host memory: buffers are numpy views
    _bitwise_by_cas = False  # and/or/xor as compare-and-swap loops (see __init__)
    _vector_leaks = False  # strided RMA a block at a time (see __init__)

    def __init__(
        self,
        comm: MPI.Intracomm,
        node_comm: MPI.Intracomm,
        config: HeapConfig,
        timeout_s: float = 60.0,
    ) -> None:
        """Make the heap's windows, collectively.

        Long because its collective steps (the node map and leaders, the world or shared
        window and its slabs, the off-node RMA window or its fallback) run in one order on
        every rank under one ExitStack that frees the windows made so far on failure.
        """
        self.rank = comm.Get_rank()
        self.world_size = comm.Get_size()
        self.local_rank = node_comm.Get_rank()
        self.local_size = node_comm.Get_size()
        self.host_size = host_size(comm, node_comm)
        # every rank's slab starts on an ``alignment`` boundary and is a whole number of
        # alignment units long, whatever MPI's segment layout (MPICH packs the ranks' segments
        # back to back and aligns a lone rank's to 16 bytes only)
        self.alignment = config.alignment
        self.nbytes = -(-config.nbytes // config.alignment) * config.alignment
        # slabs start on a page (or the configured alignment, when larger): an allocation
        # may ask for any power of two up to it (shmem_align)
        self.max_alignment = max(self.alignment, mmap.PAGESIZE)
        self.timeout_s = timeout_s
        # remote atomics and signals that passed their deadline (mpi4py Requests, or
        # shmem._rmafast Pendings: both have Test and Wait)
        self._pending: list[Any] = []  # requests a deadline gave up on (progress tests them)
        self._pending_lock = threading.Lock()  # threads (ThreadLevel.MULTIPLE) append to it
        # the C fast paths made on this heap's window (shmem._rmafast), cleared at close
        self._accel: weakref.WeakSet[Any] = weakref.WeakSet()
        # origin/result arrays of blocking atomics on the world window, by dtype: taken
        # out while in use (a second thread, or a request left pending, makes new ones)
        self._atomic_arrays: dict[np.dtype[Any], tuple[Any, Any, Any, Any, Any]] = {}
        # node index = order of each node's leader among world ranks
        leaders = comm.allgather(self.rank if self.local_rank == 0 else -1)
        leader_ranks = sorted(r for r in leaders if r >= 0)
        my_leader = node_comm.bcast(self.rank, root=0)
        self.node = leader_ranks.index(my_leader)
        self.num_nodes = len(leader_ranks)
        # world rank -> node-local rank (or -1 when on another node)
        node_of = comm.allgather((self.node, self.local_rank))
        self._local_of = [lr if node == self.node else -1 for node, lr in node_of]

        # node-local rank -> world rank
        self._world_of = [r for r, (nd, _) in enumerate(node_of) if nd == self.node]
        self._world_of.sort(key=lambda r: node_of[r][1])

        with ExitStack() as stack:
            segment = self.nbytes + self.max_alignment  # room to align the slab inside it
            self._rma_win: MPI.Win | None = None
            # where the slab starts in each world rank's RMA window (its displacement base)
            self._rma_base = [0] * self.world_size
            world_win = self._world_window(comm, segment) if self.num_nodes > 1 else None
            if world_win is not None:
                # one window for both: node-local peers load and store through Shared_query,
                # the others are reached with RMA on memory MPI allocated (its fast paths)
                self._shm_win = self._rma_win = world_win
                query = self._world_of
            else:
                self._shm_win = MPI.Win.Allocate_shared(segment, 1, comm=node_comm)
                query = list(range(self.local_size))
            stack.callback(self._shm_win.Free)
            self._shm_win.Lock_all(MPI.MODE_NOCHECK)
            stack.callback(self._shm_win.Unlock_all)
            self._slabs: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
            self._ranges: list[tuple[int, int]] = []  # (address, bytes) of each mapped segment
            # each local rank's slab offset inside its segment (its window displacement
            # base); page offsets are the same in every process mapping the segment
            self._pads: list[int] = []
            for target in query:
                mem, _ = self._shm_win.Shared_query(target)
                raw = np.frombuffer(cast(Any, mem), dtype=np.uint8, count=segment)
                self._ranges.append((int(raw.ctypes.data), segment))
                pad = -int(raw.ctypes.data) % self.max_alignment
                self._pads.append(pad)
                self._slabs.append(raw[pad : pad + self.nbytes])
            self._slab = self._slabs[self.local_rank]
            self._shm_rma: frozenset[int] = frozenset()  # (see _rget)
            if world_win is not None:
                self._rma_base = comm.allgather(self._pads[self.local_rank])
                self._shm_rma = shared_ranks(comm) - set(self._world_of)
            elif self.num_nodes > 1:  # MPI cannot share window memory: a second window
                self._rma_win = MPI.Win.Create(self._slab, 1, comm=comm)
                # Open MPI applies bitwise accumulates to Win_create memory wrongly (every
                # and/or lost between 2 ranks, 200 of 200 rounds; sum and replace are right):
                # those run as compare-and-swap loops there
                self._bitwise_by_cas = MPI.get_vendor()[0] != "MPICH"
                self._vector_leaks = strided.vector_leaks()  # (shmem/backends/strided.py)
                stack.callback(self._rma_win.Free)
                self._rma_win.Lock_all(MPI.MODE_NOCHECK)
                stack.callback(self._rma_win.Unlock_all)
            # the communicator whose MPI_Iprobe drives MPI's progress while this rank waits
            # (progress(), the C spin and barrier): one no message is ever sent on. An
            # Iprobe that finds a message waiting returns without progressing anything, on
            # MPICH and Open MPI alike: probed on ``comm``, one message of the program's own
            # left unreceived there stalled every signal to this rank, and a barrier after
            # a user's exchange hung (tests/mpi/test_signals.py, "program_message")
            self._progress_comm: MPI.Intracomm | None = None
            if self._rma_win is not None:
                self._progress_comm = comm.Dup()
                stack.callback(self._progress_comm.Free)
            stack.pop_all()
        self._base_address = int(self._slab.ctypes.data)
        self._bases = [int(slab.ctypes.data) for slab in self._slabs]
        # one node: every atomic of the job can be the processor's (see _cpu_atomics)
        self._cpu = _cpu_atomics.load() if self._rma_win is None else None
        # the C signal path leaves its last signal in flight (shmem._rmafast.pending, or None)
        self._inflight = rma_accel.pending() if self._rma_win is not None else None
        self._closed = False
        # called by progress(): contexts deliver deferred signals while this rank waits
        self.progress_hooks: list[Callable[[], None]] = []
        self._in_hooks = False
        self._scratch = np.zeros(2, dtype=np.uint64)

    def _world_window(self, comm: MPI.Intracomm, segment: int) -> MPI.Win | None:
        """A window from ``MPI.Win.Allocate`` on the world communicator whose node-local
        segments ``Shared_query`` maps (MPI 4.1 allows it on any window; MPICH shares
        ``Win_allocate`` memory within a node), or None where any rank cannot map its
        node-local peers' memory (collective: every rank decides alike)."""
        try:
            win = MPI.Win.Allocate(segment, 1, comm=comm)
        except MPI.Exception:  # pragma: no cover - every MPI-3 library has Win_allocate
            return None
        ok = 1
        for target in self._world_of:
            try:
                mem, unit = win.Shared_query(target)
            except MPI.Exception:
                ok = 0
                break
            if unit != 1 or len(memoryview(cast(Any, mem))) < segment:
                ok = 0
                break
        if comm.allreduce(ok, op=MPI.MIN):
            return win
        win.Free()
        log.info("host heap: MPI cannot share Win_allocate memory; using Win_create")
        return None

    # -- reachability and views -------------------------------------------------------------

    def is_local(self, rank: int) -> bool:
        return self._local_of[rank] >= 0

    def local_view(self, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return self._slab[offset : offset + nbytes]

    def peer_view(
        self, rank: int, offset: int, nbytes: int
    ) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        lr = self._local_of[rank]
        if lr < 0:
            return None
        return self._slabs[lr][offset : offset + nbytes]

    def rma_target(self, rank: int, offset: int) -> tuple[MPI.Win, int] | None:
        if self._local_of[rank] >= 0:
            return None
        return self._remote_window(), self._rma_base[rank] + offset

    def rma_putter(self, nbytes: int, dtype: np.dtype[Any]) -> Any:
        if self._rma_win is None or self._closed:
            return None
        putter = rma_accel.putter(self._rma_win, nbytes, dtype, self.world_size)
        if putter is not None:
            self._accel.add(putter)  # cleared when the window goes (close)
        return putter

    def rma_signaller(self, offset: int, slots: int) -> Any:
        """A ``shmem._rmafast.Signaller`` for a signal pad at heap byte ``offset`` (its
        off-node ranks), or None where signals stay in Python."""
        if self._rma_win is None or self._closed:
            return None
        # fence() syncs the shared window too on weakly ordered CPUs: so does the C path
        extra = None
        if not _TOTAL_STORE_ORDER and self._shm_win is not self._rma_win:
            extra = self._shm_win
        disps = [
            -1 if self._local_of[r] >= 0 else self._rma_base[r] + offset
            for r in range(self.world_size)
        ]
        signaller = rma_accel.signaller(self._rma_win, disps, slots, extra, self._shm_rma)
        if signaller is not None:
            self._accel.add(signaller)
        return signaller

    def rma_barrier(self, offset: int, slots: int, signaller: Any) -> Any:
        size, rank, word = self.world_size, self.rank, offset + slots * 8
        rounds = []
        distance, k = 1, 0
        while distance < size:
            dst = (rank + distance) % size
            lr = self._local_of[dst]
            if lr < 0 and signaller is None:
                return None  # off the node without the C signal
            peer = self._bases[lr] + word + 8 * k if lr >= 0 else 0
            rounds.append((peer, dst, slots + k, self._base_address + word + 8 * k))
            distance, k = distance * 2, k + 1
        barrier = rma_accel.barrier(rounds, signaller, self._progress_comm)
        if barrier is not None:
            self._accel.add(barrier)  # cleared when the memory goes (close)
        return barrier

    def rma_spinner(self) -> Any:
        if self._progress_comm is None:
            return None
        return rma_accel.spinner(self._progress_comm)

    def complete_signals(self, timeout_s: float | None = None) -> None:
        pending = self._inflight
        if pending is not None:
            req = pending()
            if req is not None:
                self.wait_started(req, req.rank, "signal", timeout_s)

    def wait_started(self, req: Any, rank: int, what: str, timeout_s: float | None) -> None:
        """Poll ``req`` (an operation on ``rank`` started by :mod:`shmem._rmafast` or
        mpi4py; ``Test()``) until it completes, within the deadline (``RemoteTimeoutError``;
        the request then completes later, when the peer progresses)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        if not poll_until(req.Test, time.monotonic() + limit, self.progress):
            with self._pending_lock:
                self._pending.append(req)
            raise RemoteTimeoutError(
                f"{what}: rank {self.rank}: the operation on rank {rank} did not complete "
                f"within {limit:g} s (rank {rank} made no MPI progress)",
                peer=rank,
            )

    def address(self, offset: int) -> int:
        return self._base_address + offset

    # -- one-sided data movement ------------------------------------------------------------

    def put_bytes(self, rank: int, offset: int, src: np.ndarray[Any, Any]) -> None:
        lr = self._local_of[rank]
        if lr >= 0:
            self._slabs[lr][offset : offset + src.nbytes] = src.reshape(-1).view(np.uint8)
            return
        # no progress call first: Flush drives MPI's progress engine itself
        win = self._remote_window()
        win.Put(_message(src), rank, self._rma_base[rank] + offset)
        win.Flush(rank)

    def get_bytes(self, rank: int, offset: int, dst: np.ndarray[Any, Any]) -> None:
        lr = self._local_of[rank]
        if lr >= 0:
            dst.reshape(-1).view(np.uint8)[...] = self._slabs[lr][offset : offset + dst.nbytes]
            return
        req = self._rget(_message(dst), rank, self._rma_base[rank] + offset)
        if req and not poll_until(req.Test, time.monotonic() + self.timeout_s, self.progress):
            req.Wait()  # the destination buffer must not be released under MPI
            raise RemoteTimeoutError(
                f"get: rank {self.rank}: reading rank {rank} took longer than "
                f"{self.timeout_s:g} s (rank {rank} made no MPI progress)",
                peer=rank,
            )

    def _wait_request(self, req: MPI.Request, what: str, rank: int) -> None:
        if not poll_until(req.Test, time.monotonic() + self.timeout_s, self.progress):
            req.Wait()  # the local buffer must not be released under MPI
            raise RemoteTimeoutError(
                f"{what}: rank {self.rank}: the transfer with rank {rank} took longer than "
                f"{self.timeout_s:g} s (rank {rank} made no MPI progress)",
                peer=rank,
            )

    def put_strided(
        self,
        rank: int,
        offset: int,
        src: np.ndarray[Any, Any],
        block: int,
        nblocks: int,
        stride: int,
    ) -> None:
        """Write the contiguous ``src`` (``nblocks * block`` elements) as ``nblocks`` blocks of
        ``block`` elements, ``stride`` elements apart, from heap byte ``offset`` of ``rank``'s
        slab: peer stores on the node, one MPI ``Put`` with a vector datatype off it."""
        isz = src.dtype.itemsize
        span = ((nblocks - 1) * stride + block) * isz if nblocks else 0
        view = self.peer_view(rank, offset, span)
        if view is not None:
            if nblocks:
                target = strided_view(view.view(src.dtype), block, nblocks, stride)
                target[...] = src.reshape(nblocks, block)
            return
        win = self._remote_window()
        self.progress()
        at = self._rma_base[rank] + offset
        if self._vector_leaks:  # (see __init__)
            return strided.put_blocks(win, rank, at, src, block, nblocks, stride)
        vec = strided.vector_type(isz, block, nblocks, stride)
        try:
            win.Put([src.reshape(-1).view(np.uint8), MPI.BYTE], rank, (at, 1, vec))
            win.Flush(rank)
        finally:
            vec.Free()

    def get_strided(
        self,
        rank: int,
        offset: int,
        dst: np.ndarray[Any, Any],
        block: int,
        nblocks: int,
        stride: int,
    ) -> None:
        """Read ``nblocks`` blocks (as :meth:`put_strided` writes them) into contiguous ``dst``."""
        isz = dst.dtype.itemsize
        span = ((nblocks - 1) * stride + block) * isz if nblocks else 0
        view = self.peer_view(rank, offset, span)
        if view is not None:
            if nblocks:
                source = strided_view(view.view(dst.dtype), block, nblocks, stride)
                dst.reshape(nblocks, block)[...] = source
            return
        self.progress()
        at = self._rma_base[rank] + offset
        if self._vector_leaks:  # (see __init__)
            return strided.get_blocks(self._remote_window(), rank, at, dst, block, nblocks, stride)
        vec = strided.vector_type(isz, block, nblocks, stride)
        try:
            req = self._rget([dst.reshape(-1).view(np.uint8), MPI.BYTE], rank, (at, 1, vec))
            if req:
                self._wait_request(req, "iget", rank)
        finally:
            vec.Free()

    def put_nbi(self, rank: int, offset: int, src: np.ndarray[Any, Any]) -> MPI.Request | None:
        """Start a put: a node-local peer's copy is written at once (None); an off-node peer
        gets a request-based ``Rput`` (complete at the target after the request and a
        :meth:`flush` of ``rank``). ``src`` must stay alive and unchanged until then."""
        lr = self._local_of[rank]
        if lr >= 0:
            self._slabs[lr][offset : offset + src.nbytes] = src.reshape(-1).view(np.uint8)
            return None
        return self._rget(_message(src), rank, self._rma_base[rank] + offset, put=True)

    def get_nbi(self, rank: int, offset: int, dst: np.ndarray[Any, Any]) -> MPI.Request | None:
        """Start a get into ``dst``: at once from a node-local peer (None), else ``Rget``
        (``dst`` is filled when the request completes)."""
        lr = self._local_of[rank]
        if lr >= 0:
            dst.reshape(-1).view(np.uint8)[...] = self._slabs[lr][offset : offset + dst.nbytes]
            return None
        return self._rget(_message(dst), rank, self._rma_base[rank] + offset)

    def _rget(self, buf: Any, rank: int, where: Any, put: bool = False) -> MPI.Request | None:
        """An ``Rget`` (``Rput`` with ``put``) of ``where`` on off-node ``rank``; to a rank
        whose memory MPI shares (nodes simulated on one machine) a ``Get``/``Put`` +
        ``Flush``, complete now (None): MPICH 5.0.2 leaks 48 bytes per ``Rget``/``Rput`` (128
        per ``Rget_accumulate``: atomics and signals take ``Fetch_and_op``) to ``Win_allocate``
        memory it reaches through shared memory."""
        win = self._remote_window()
        if rank not in self._shm_rma:
            return (win.Rput if put else win.Rget)(buf, rank, where)
        (win.Put if put else win.Get)(buf, rank, where)
        win.Flush(rank)
        return None

    def flush(self, rank: int) -> None:
        """Complete every RMA operation of this process to ``rank`` at the target."""
        if self._rma_win is not None and not self.is_local(rank):
            self._rma_win.Flush(rank)

    def _remote_window(self) -> MPI.Win:
        if self._rma_win is None:  # pragma: no cover - is_local() is True for every rank then
            raise ArgumentError("HostHeap: no RMA window (every rank is on this node)")
        if self._inflight is not None:
            self.complete_signals()  # a signal sent before is applied before this operation
        return self._rma_win

    # -- ordering and progress --------------------------------------------------------------

    @property
    def release_fence_needed(self) -> bool:
        """Whether a node-local peer may see a flag before the data stored ahead of it unless
        a fence separates them: False on x86-64, whose total store order keeps stores (and
        loads before a later store) in order, so :meth:`fence` skips the load/store fence
        there; True elsewhere, and whenever off-node peers are reached through MPI RMA."""
        return not _TOTAL_STORE_ORDER or self._rma_win is not None

    def fence(self) -> None:
        if not _TOTAL_STORE_ORDER and self._shm_win is not self._rma_win:
            self._shm_win.Sync()
        if self._rma_win is not None:
            self._rma_win.Sync()

    def progress(self) -> None:
        if self._progress_comm is not None:
            self._progress_comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            if self._inflight is not None:
                self._inflight()  # tests the signal in flight (forgotten once complete)
            if self._pending:
                with self._pending_lock:
                    self._pending = [r for r in self._pending if not r.Test()]
            if self.progress_hooks and not self._in_hooks:
                self._in_hooks = True  # a hook's own MPI calls progress too: no re-entry
                try:
                    for hook in list(self.progress_hooks):
                        hook()
                finally:
                    self._in_hooks = False

    # -- teardown ---------------------------------------------------------------------------

    def close(self, collective: bool = True) -> None:
        """Free the windows (collective). ``collective=False`` only drops references."""
        if self._closed:
            return
        self._closed = True
        for accel in list(self._accel):
            accel.clear()  # nothing may reach the windows once they are freed
        self._slabs = []
        self._slab = np.empty(0, dtype=np.uint8)
        if not collective:
            return
        if self._rma_win is not None:
            last = self._inflight() if self._inflight is not None else None
            for req in [*self._pending, *([] if last is None else [last])]:
                req.Wait()  # every peer is here, making progress
            self._pending = []
            if self._rma_win is not self._shm_win:
                self._rma_win.Unlock_all()
                self._rma_win.Free()
            self._rma_win = None
        if self._progress_comm is not None:
            self._progress_comm.Free()
            self._progress_comm = None
        self._shm_win.Unlock_all()
        self._shm_win.Free()
        _fill_holes(self._ranges)
