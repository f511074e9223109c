"""The World: the runtime of one job (communicators, node split, heap, signals)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import socket
import threading
import warnings
import weakref
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from . import flight
from .agreement import (
    BARRIER_SIGNATURE,
    alloc_after_collecting,
    compare_across_ranks,
    heap_mismatch,
    heap_signature,
)
from .arena import Arena
from .backends import Backend, resolve_backend
from .buffer import SHMEMBuffer
from .callreport import Reporter
from .config import Config, load_config
from .device.context import DeviceContext
from .device.devices import CPU
from .dtypes import DTypeLike, ShapeLike, as_dtype, as_shape, dtype_name
from .errors import (
    ArgumentError,
    CollectiveMismatchError,
    HeapExhaustedError,
    ShmemStateError,
    SignalTimeoutError,
)
from .flight import recorded
from .heap import SymmetricHeap
from .quarantine import FREED_BIT, MAX_HELD, Quarantine, ViewRef
from .signals import Cmp, SignalOp, SignalPad
from .team import Team, TeamConfig
from .threads import ThreadLevel, mpi_level, provided_level

if TYPE_CHECKING:
    from mpi4py import MPI  # imported lazily: importing it initialises MPI

    from .rma import Context

__all__ = ["World", "compare_across_ranks", "finalize", "get_world", "init"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_current: World | None = None


class World:
    """One job's runtime. Made by :func:`init`; use as a context manager or call
    :meth:`finalize`.

    Parameters
    ----------
    config : Config
        The loaded configuration.
    comm : MPI.Intracomm
        The job's ranks (duplicated by the World).
    backend : str
        The backend's name (``"host"`` or ``"nvshmem"``).
    why : str
        Why that backend was chosen (logged, and shown in errors).
    thread_level : ThreadLevel, optional
        The thread support provided.

    Attributes
    ----------
    rank, world_size : int
        This process's rank in the (duplicated) communicator, and the number of ranks.
    local_rank, local_size : int
        Rank and size within the node (``COMM_TYPE_SHARED`` split, or each rank alone with
        ``heap.node_split = "rank"``).
    node, num_nodes : int
        This rank's node index (nodes ordered by their lowest rank) and the node count.
    backend : str
        ``"host"`` or ``"nvshmem"``.
    heap : SymmetricHeap
        The backend heap.
    config : Config
    comm, node_comm : MPI.Intracomm
        The duplicated world communicator and the node communicator (owned by the World).
    signals : SignalPad
        The world's signal pad (``config.signal.slots`` user slots).
    ctx : DeviceContext
        The stream this rank's heap copies are ordered on (the host device on the host
        backend).
    thread_level : ThreadLevel
        The thread support this World provides (``shmem_query_thread``; :mod:`shmem.threads`).
    """

    def __init__(
        self,
        config: Config,
        comm: MPI.Intracomm,
        backend: str,
        why: str,
        thread_level: ThreadLevel = ThreadLevel.MULTIPLE,
    ) -> None:
        """Start the World collectively (made by :func:`init`).

        Long because its collective steps (the communicator's dup, the node split, the heap,
        the signal pad, the teams) run in one order on every rank under one ExitStack that
        undoes what was made on failure.
        """
        self.thread_level = thread_level
        self._ctx_lock = threading.Lock()  # the default context is made once
        with ExitStack() as stack:
            self.comm: MPI.Intracomm = comm.Dup()
            stack.callback(self.comm.Free)
            self.config = config
            self.rank = self.comm.Get_rank()
            self.world_size = self.comm.Get_size()
            from .backends.host import HostHeap
            from .backends.nodes import split_nodes

            self.node_comm: MPI.Intracomm = split_nodes(self.comm, config.heap.node_split)
            stack.callback(self.node_comm.Free)
            self.local_rank = self.node_comm.Get_rank()
            self.local_size = self.node_comm.Get_size()
            self.backend = backend
            self._arena = Arena(config.heap.nbytes, config.heap.alignment)
            self._calls = 0
            self._reporter = Reporter(self.comm, range(self.world_size), config.signal.timeout_s)
            self._finalized = False
            self._out_of_step = ""  # why collective heap calls are refused (a timed-out check)
            self._live: weakref.WeakValueDictionary[int, SHMEMBuffer] = (
                weakref.WeakValueDictionary()
            )
            self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()  # open contexts
            pad_nbytes = SignalPad.nbytes_for(config.signal.slots)
            pad_offset = self._arena.alloc(pad_nbytes)
            # the heap-call signatures and view masks (_agree) use the pad's last four
            # barrier-round words, which only a job of more than 2**60 ranks would reach
            self._sig_offset = pad_offset + pad_nbytes - 32
            self._quarantine = Quarantine()
            if backend == "nvshmem":
                from .backends.nvshmem import NvshmemHeap
                from .backends.nvshmem_signals import DeviceSignalPad

                gpu_heap = NvshmemHeap(self.comm, self.node_comm, config)
                stack.callback(gpu_heap.close, collective=False)
                self.heap: SymmetricHeap = gpu_heap
                self.signals: SignalPad = DeviceSignalPad(
                    gpu_heap, pad_offset, config.signal.slots, config.signal.timeout_s
                )
                self.ctx = DeviceContext(gpu_heap.device)
            else:
                host_heap = HostHeap(
                    self.comm, self.node_comm, config.heap, config.signal.timeout_s
                )
                stack.callback(host_heap.close)
                self.heap = host_heap
                self.signals = SignalPad(
                    self.heap, pad_offset, config.signal.slots, config.signal.timeout_s
                )
                self.ctx = DeviceContext(CPU())
            self.node = self.heap.node
            self.num_nodes = self.heap.num_nodes
            self._default_ctx: Context | None = None
            self.team_world = Team(
                self, self.comm, tuple(range(self.world_size)), TeamConfig(), "world", False
            )
            self.team_shared = Team(
                self,
                self.node_comm,
                tuple(r for r in range(self.world_size) if self.heap.is_local(r)),
                TeamConfig(),
                "shared",
                False,
            )
            stack.callback(self.ctx.close)
            self.comm.Barrier()  # every pad is zeroed before anyone signals
            stack.pop_all()
        log.info(
            "rank %d/%d (local %d/%d, node %d/%d) on %s pid %d: backend %s (%s), heap %d bytes",
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_size,
            self.node,
            self.num_nodes,
            socket.gethostname(),
            os.getpid(),
            backend,
            why,
            config.heap.nbytes,
        )

    # -- state ------------------------------------------------------------------------------

    @property
    def finalized(self) -> bool:
        """Whether :meth:`finalize` has run (the heap and every buffer of it are gone)."""
        return self._finalized

    def check_open(self, where: str) -> None:
        """Raise :class:`~shmem.errors.ShmemStateError` naming ``where`` once the World is
        finalized (the liveness check for code built on a World).

        Parameters
        ----------
        where : str
            The caller's name, which heads the message.

        Raises
        ------
        ShmemStateError
            The World is finalized.
        """
        if self._finalized:
            raise ShmemStateError(f"{where}: the World is finalized (call shmem.init() again)")

    _check_open = check_open

    def __repr__(self) -> str:
        return (
            f"World(rank={self.rank}, world_size={self.world_size}, local_rank="
            f"{self.local_rank}, node={self.node}/{self.num_nodes}, backend={self.backend!r}"
            f"{', finalized' if self._finalized else ''})"
        )

    # -- collective symmetry check --------------------------------------------------------

    def _agree(
        self,
        where: str,
        record: tuple[Any, ...],
        error: Exception | None,
        closing: tuple[ViewRef, ...] = (),
    ) -> bool:
        """All ranks compare ``record`` (and local argument errors) before any heap change.

        With ``heap.check_symmetry`` the records are all-gathered; any disagreement, or an
        argument error on any rank, raises on every rank. Without it this is an epoch barrier
        (the allocation is collective and synchronising, as ``nvshmem_malloc`` is) and a
        local argument error is raised locally; the call's signature (allocation size, or the
        offset freed) rides along: every rank writes it before the barrier and reads the
        others' after it, so differing calls raise ``CollectiveMismatchError`` on every rank
        before any heap change, at no extra synchronisation (host backend).

        Beside the signature each rank writes which closed buffers it still has views of
        (:mod:`shmem.quarantine`): blocks no rank has a view of any more are freed here, in
        the same order everywhere. Returns whether some rank still has a view of the buffer
        being closed (``closing``: its views' weak references), which must then be held.
        """
        self._calls += 1
        # memory management implies a barrier_all: nothing started before it is left pending
        # (a put landing in a block freed and allocated again)
        self._complete_default()
        if self._out_of_step:
            raise ShmemStateError(
                f"{where}: the World is out of step ({self._out_of_step}); finalize it"
            )
        if not self.config.heap.check_symmetry:
            if error is not None:
                raise error
            if self.heap.device_memory:
                self.signals.barrier()
                return False
        else:
            try:
                compare_across_ranks(
                    self.comm,
                    where,
                    self._calls,
                    record,
                    error,
                    self.config.signal.timeout_s,
                    self.heap.progress,
                )
            except SignalTimeoutError as exc:
                self._out_of_step = f"{where} timed out: {exc}"
                raise
            except CollectiveMismatchError as exc:  # every rank: each one's own account
                if getattr(exc, "agreed", False):  # (another rank's bad argument: known)
                    raise
                raise heap_mismatch(self, where, record, exc) from None
            if self.heap.device_memory:
                return False
        held = self._barrier_with_signature(
            where, heap_signature(record), self._quarantine.mask(closing), record
        )
        self._quarantine.settle(held, self._arena)
        return bool(held & FREED_BIT)

    def _barrier_with_signature(
        self, where: str, sig: int, mask: int, record: tuple[Any, ...]
    ) -> int:
        """The allocation barrier, with every rank's call signature compared after it;
        returns the OR of every rank's view ``mask`` (``record``: this rank's call)."""
        off = self._sig_offset + 16 * (self._calls % 2)  # a fast rank writes the other pair
        self.heap.local_view(off, 16).view(np.int64)[:] = (sig, mask)
        self.signals.barrier()
        # the next pair says "a barrier" until the next heap call: a peer's heap call that
        # meets this rank's World.barrier reads that, never this call's stale words
        nxt = self._sig_offset + 16 * ((self._calls + 1) % 2)
        self.heap.local_view(nxt, 16).view(np.int64)[:] = (BARRIER_SIGNATURE, 0)
        words = np.empty(2, np.int64)
        theirs = []
        held = 0
        for r in range(self.world_size):
            view = self.heap.peer_view(r, off, 16)
            if view is not None:
                words[:] = view.view(np.int64)
            else:
                self.heap.get_bytes(r, off, words)
            theirs.append(int(words[0]))
            held |= int(words[1])
        if any(t != sig for t in theirs):  # every rank sees it: each one's own account
            raise heap_mismatch(self, where, record)
        return held

    # -- allocation -------------------------------------------------------------------------

    @recorded("alloc")
    def empty(
        self, shape: ShapeLike, dtype: DTypeLike = "float32", *, alignment: int | None = None
    ) -> SHMEMBuffer:
        """Allocate an uninitialised symmetric buffer (collective, synchronising).

        Every rank must call it with the same shape, dtype and alignment, in the same order;
        the buffer then sits at the same heap offset everywhere (``shmem_malloc``, or
        ``shmem_align`` with ``alignment``: any power of two up to ``heap.max_alignment``,
        a page on the host backend; the default is ``[heap] alignment``). Like every
        OpenSHMEM allocation it completes the default context's operations first.

        Parameters
        ----------
        shape : int or tuple of int
            This rank's array shape (the same on every rank).
        dtype : dtype-like, optional
            A supported dtype (default ``"float32"``).
        alignment : int, optional
            The heap offset's alignment, a power of two (default ``[heap] alignment``).

        Returns
        -------
        SHMEMBuffer
            The buffer; close it (collectively) when done.

        Raises
        ------
        HeapExhaustedError
            On every rank, when no free block is large enough; the heap stays usable.
        ArgumentError
            An invalid shape, dtype or alignment.
        CollectiveMismatchError
            With ``heap.check_symmetry``, when ranks passed different arguments.
        """
        self._check_open("World.empty")
        error = None
        try:
            dims = as_shape("World.empty", shape)
            dt = as_dtype(dtype, "World.empty")
            align = self._check_alignment("World.empty", alignment)
            record: tuple[Any, ...] = (
                "alloc", math.prod(dims) * dt.itemsize, dtype_name(dt), dims, align,
            )  # fmt: skip
        except (ValueError, TypeError) as exc:
            error, record = exc, ("alloc", "invalid")
        self._agree("World.empty", record, error)
        try:
            offset = self._arena.alloc(record[1], record[4])
        except HeapExhaustedError:
            if not self._quarantine.held_nbytes:
                raise
            offset = alloc_after_collecting(self, record)
        buf = SHMEMBuffer(self, offset, dims, dt)
        self._live[offset] = buf
        return buf

    def zeros(
        self, shape: ShapeLike, dtype: DTypeLike = "float32", *, alignment: int | None = None
    ) -> SHMEMBuffer:
        """Like :meth:`empty`, with this rank's copy zeroed before a barrier (collective).

        Parameters
        ----------
        shape : int or tuple of int
            This rank's array shape (the same on every rank).
        dtype : dtype-like, optional
            A supported dtype (default ``"float32"``).
        alignment : int, optional
            The heap offset's alignment, a power of two (default ``[heap] alignment``).

        Returns
        -------
        SHMEMBuffer
            The buffer, zero-filled on every rank.
        """
        buf = self.empty(shape, dtype, alignment=alignment)
        buf._zero()
        self.barrier()
        return buf

    def _check_alignment(self, where: str, alignment: object) -> int | None:
        if alignment is None:
            return None
        top = self.heap.max_alignment
        if (
            isinstance(alignment, bool)
            or not isinstance(alignment, int | np.integer)
            or alignment <= 0
            or alignment & (alignment - 1)
            or alignment > top
        ):
            raise ArgumentError(
                f"{where}: invalid alignment (got {alignment!r}; expected a power of two "
                f"<= {top}, the heap's slab alignment)"
            )
        return int(alignment)

    @recorded("free")
    def _free(self, buf: SHMEMBuffer) -> None:
        self._check_open("SHMEMBuffer.close")
        views = buf._view_refs()
        keep = self._agree("SHMEMBuffer.close", ("free", buf.offset, buf.nbytes), None, views)
        self._live.pop(buf.offset, None)
        if not keep:
            self._arena.free(buf.offset)
        elif not self._quarantine.hold(buf.offset, buf.nbytes, views):
            warnings.warn(
                f"SHMEMBuffer.close: {buf.nbytes} bytes at offset {buf.offset} stay allocated "
                f"until finalize: views of the buffer are still alive and {MAX_HELD} closed "
                "buffers with live views are held already (drop views before close())",
                ResourceWarning,
                stacklevel=3,
            )

    def heap_stats(self) -> Any:
        """The arena's :class:`~shmem.arena.ArenaStats` (identical on every rank; ``held``:
        closed buffers kept for views still alive, freed at the first heap call after the
        last view is gone).

        Returns
        -------
        ArenaStats
            The heap's usage now.
        """
        return dataclasses.replace(self._arena.stats(), held=self._quarantine.held_nbytes)

    # -- signals ----------------------------------------------------------------------------

    def signal(self, rank: int, slot: int, value: int, op: SignalOp | str = "set") -> None:
        """Set or add to ``slot`` of ``rank``'s world pad; see :meth:`SignalPad.signal`.

        Parameters
        ----------
        rank : int
            The rank whose flag changes (may be this rank).
        slot : int
            ``0 <= slot < config.signal.slots``.
        value : int
            ``0 <= value < 2**64``.
        op : {"set", "add"}, optional
            Set the slot to ``value``, or add ``value`` to it.

        Raises
        ------
        ShmemStateError
            The World is finalized.
        ArgumentError
            ``rank``, ``slot`` or ``op`` invalid.
        """
        if self._finalized:
            self._check_open("World.signal")
        self.signals.signal(rank, slot, value, op)

    @recorded("wait_until")
    def wait_until(
        self,
        slot: int,
        cmp: Cmp | str,
        value: int,
        timeout: float | None = None,
        *,
        peers: tuple[int, ...] = (),
    ) -> int:
        """Wait on this rank's ``slot``; see :meth:`SignalPad.wait_until`.

        Parameters
        ----------
        slot : int
            ``0 <= slot < config.signal.slots``.
        cmp : {"eq", "ne", "gt", "ge", "lt", "le"}
            The comparison of the slot's value against ``value``.
        value : int
            ``0 <= value < 2**64``.
        timeout : float, optional
            Seconds; ``[signal] timeout_s`` when None.
        peers : tuple of int, optional
            The ranks expected to signal, named in the error on timeout.

        Returns
        -------
        int
            The slot's value that satisfied the comparison.

        Raises
        ------
        SignalTimeoutError
            The deadline passed first.
        ArgumentError
            ``slot``, ``cmp`` or ``timeout`` invalid.
        """
        if self._finalized:
            self._check_open("World.wait_until")
        return self.signals.wait_until(slot, cmp, value, timeout, peers=peers)

    @recorded("barrier")
    def barrier(self, timeout: float | None = None) -> None:
        """Complete this rank's operations on the default context, then wait for every rank
        (collective; ``shmem_barrier_all``: a quiet of the default context and a sync of the
        world). Every earlier ``put_nbi``, ``get_nbi``, ``put_signal_nbi`` and non-blocking
        atomic of the default context is complete on every rank that leaves it. An
        epoch-flag barrier, not ``MPI_Barrier``; operations on other contexts complete at
        their own ``quiet``.

        Parameters
        ----------
        timeout : float, optional
            Seconds; ``[signal] timeout_s`` when None.

        Raises
        ------
        ShmemStateError
            The World is finalized.
        SignalTimeoutError
            A peer did not arrive in time.
        """
        self._check_open("World.barrier")
        ctx = self._default_ctx  # (_complete_default, inline: the barrier is a hot path)
        if ctx is not None and ctx._ops:
            ctx.quiet()
        self.signals.barrier(timeout)

    @recorded("sync_all")
    def sync_all(self, timeout: float | None = None) -> None:
        """Wait for every rank (collective; ``shmem_sync_all``): earlier stores (blocking
        puts, stores into peer views) are complete and visible, but non-blocking operations
        are not completed: :meth:`barrier` is this plus a quiet of the default context.

        Parameters
        ----------
        timeout : float, optional
            Seconds; ``[signal] timeout_s`` when None.

        Raises
        ------
        ShmemStateError
            The World is finalized.
        SignalTimeoutError
            A peer did not arrive in time.
        """
        self._check_open("World.sync_all")
        self.signals.barrier(timeout)

    def _complete_default(self) -> None:
        """The quiet half of ``shmem_barrier_all`` (also before every allocation and free,
        which OpenSHMEM defines to imply one)."""
        ctx = self._default_ctx
        if ctx is not None and ctx.pending:
            ctx.quiet()

    # -- contexts, completion and queries (OpenSHMEM) ----------------------------------------

    @property
    def default_context(self) -> Context:
        """The default communication context (``SHMEM_CTX_DEFAULT``): the ``*_nbi`` methods of
        SHMEMBuffer use it when no ``ctx`` is given; :meth:`quiet` completes it."""
        ctx = self._default_ctx
        if ctx is None:
            from .rma import Context

            with self._ctx_lock:  # two threads asking first get the same context
                ctx = self._default_ctx
                if ctx is None:
                    ctx = self._default_ctx = Context(self)
        return ctx

    def create_context(self, team: Team | None = None) -> Context:
        """A new communication context (``shmem_ctx_create``; local, not collective), over
        ``team``'s ranks when given (``shmem_team_create_ctx``). Close it when done.

        Parameters
        ----------
        team : Team, optional
            The team whose ranks the context addresses; the World's when None.

        Returns
        -------
        Context
            The new context (``ctx.quiet()`` completes its non-blocking operations).

        Raises
        ------
        ArgumentError
            ``team`` is not a Team.
        """
        self._check_open("World.create_context")
        if team is not None:
            from .team import Team

            if not isinstance(team, Team):
                raise ArgumentError(
                    f"World.create_context: invalid team (got {team!r} of type "
                    f"{type(team).__name__}; expected a Team or None)"
                )
            return team.create_ctx()
        from .rma import Context

        return Context(self)

    def quiet(self) -> None:
        """Complete every operation of the default context (``shmem_quiet``)."""
        self._check_open("World.quiet")
        if self.heap.device_memory:
            self.heap.fence()
            return
        self.default_context.quiet()

    def fence(self) -> None:
        """Order the default context's operations to each rank (``shmem_fence``)."""
        self._check_open("World.fence")
        if self.heap.device_memory:
            self.heap.fence()
            return
        self.default_context.fence()

    def pe_accessible(self, rank: int) -> bool:
        """Whether ``rank`` is a rank of this job (``shmem_pe_accessible``).

        Parameters
        ----------
        rank : int
            A rank number.

        Returns
        -------
        bool
            True when ``rank`` is an integer with ``0 <= rank < world_size``.
        """
        return (
            not isinstance(rank, bool)
            and isinstance(rank, int | np.integer)
            and 0 <= rank < self.world_size
        )

    def addr_accessible(self, buf: SHMEMBuffer, rank: int) -> bool:
        """Whether ``buf`` is an open symmetric buffer of this World that ``rank`` can be
        reached at (``shmem_addr_accessible``).

        Parameters
        ----------
        buf : SHMEMBuffer
            The buffer.
        rank : int
            The peer.

        Returns
        -------
        bool
            True when ``buf`` is open, belongs to this World and ``rank`` is a rank of it.
        """
        return (
            isinstance(buf, SHMEMBuffer)
            and buf.world is self
            and not buf.closed
            and self.pe_accessible(rank)
        )

    def ptr(self, buf: SHMEMBuffer, rank: int) -> Any:
        """``rank``'s copy of ``buf`` for direct loads and stores (a numpy view; a device
        Buffer on nvshmem), or None when it is not reachable so (``shmem_ptr``).

        Parameters
        ----------
        buf : SHMEMBuffer
            A symmetric buffer of this World.
        rank : int
            The peer whose copy is wanted.

        Returns
        -------
        numpy.ndarray or Buffer or None
            The peer's copy (zero-copy), or None when ``rank`` is off this node.

        Raises
        ------
        ArgumentError
            ``buf`` is not a SHMEMBuffer, or ``rank`` is out of range.
        """
        if not isinstance(buf, SHMEMBuffer):
            raise ArgumentError(
                f"World.ptr: invalid buffer (got {type(buf).__name__}; expected a SHMEMBuffer)"
            )
        return buf._peer("ptr", rank)

    @staticmethod
    def global_exit(status: int = 0) -> NoReturn:
        """End the whole job with ``status`` (``shmem_global_exit``; :func:`shmem.global_exit`).

        Parameters
        ----------
        status : int, optional
            The job's exit status.

        Returns
        -------
        typing.NoReturn
            It does not return: the job ends.
        """
        from .job import global_exit

        global_exit(status)

    @staticmethod
    def pcontrol(level: int = 1, *args: object) -> None:
        """``shmem_pcontrol``: a checked no-op (:func:`shmem.pcontrol`).

        Parameters
        ----------
        level : int, optional
            0 off, 1 the default, 2 and up library-defined.
        *args : object
            Ignored.
        """
        from .job import pcontrol

        pcontrol(level, *args)

    @staticmethod
    def info_get_version() -> tuple[int, int]:
        """The OpenSHMEM specification version this API follows (``shmem_info_get_version``).

        Returns
        -------
        tuple of int
            ``(major, minor)``: ``(1, 5)``.
        """
        return (1, 5)

    @staticmethod
    def info_get_name() -> str:
        """The library's name and version (``shmem_info_get_name``).

        Returns
        -------
        str
            ``"shmem (symheap) <version>"``.
        """
        from ._version import __version__

        return f"shmem (symheap) {__version__}"

    # -- teardown ---------------------------------------------------------------------------

    @recorded("finalize")
    def finalize(self) -> None:
        """Release the heap and communicators (collective). Open buffers become unusable.

        Raises
        ------
        ShmemStateError
            This World is already finalized.
        """
        global _current
        if self._finalized:
            raise ShmemStateError("finalize: this World is already finalized")
        if not self.heap.device_memory:
            # outstanding non-blocking operations of every open context land before teardown
            for ctx in list(self._contexts):
                if not ctx.closed:
                    ctx.quiet()
        self._finalized = True
        with _lock:
            if _current is self:
                _current = None
        if self._live:
            log.debug("finalize: %d buffer(s) still open are released", len(self._live))
        for buf in list(self._live.values()):
            buf._drop()  # with its views; the put fast path's windows go with the heap
        self._live.clear()
        try:
            self.ctx.close()
            close_pad = getattr(self.signals, "close", None)
            if close_pad is not None:
                close_pad()
        finally:
            self.comm.Barrier()
            self.heap.close()
            self.node_comm.Free()
            self.comm.Free()

    def _abandon(self) -> None:
        """Local teardown after an exception: no collective call (peers may be gone)."""
        global _current
        self._finalized = True
        with _lock:
            if _current is self:
                _current = None
        for buf in list(self._live.values()):
            buf._drop()  # with its views; the put fast path's windows go with the heap
        self._live.clear()
        with contextlib.suppress(Exception):
            self.ctx.close()
        self.heap.close(collective=False)

    def __enter__(self) -> World:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self._finalized:
            return
        if exc_type is None:
            self.finalize()
        else:
            self._abandon()


@recorded("init")
def init(
    config: Config | str | os.PathLike[str] | None = None,
    comm: MPI.Intracomm | None = None,
    backend: Backend | str = "auto",
    *,
    thread_level: ThreadLevel | str | None = None,
    **overrides: Any,
) -> World:
    """Start the runtime on every rank of ``comm`` (collective) and return the :class:`World`.

    Parameters
    ----------
    config : Config or path, optional
        A configuration, or a TOML file to load (``$SHMEM_CONFIG`` when None).
    comm : MPI.Intracomm, optional
        The ranks of the job (default ``MPI.COMM_WORLD``); it is duplicated.
    backend : {"auto", "host", "nvshmem"}
    thread_level : ThreadLevel or str, optional
        The thread support wanted (``shmem_init_thread``): ``World.thread_level`` is then the
        level provided, which never exceeds MPI's (:mod:`shmem.threads`). None: the highest
        level MPI allows.
    **overrides
        Configuration keywords (``heap_nbytes="64MiB"``), applied over file and environment.

    Returns
    -------
    World
        The open World (also :func:`get_world`'s until :func:`finalize`).

    Raises
    ------
    ShmemStateError
        A World is already open in this process.
    ConfigError, BackendUnavailableError
    """
    global _current
    with _lock:
        if _current is not None:
            raise ShmemStateError(
                f"init: already initialised ({_current!r}); call shmem.finalize() first"
            )
    requested = None if thread_level is None else ThreadLevel.parse(thread_level, "init")
    if isinstance(config, Config):
        if overrides:
            raise ArgumentError(
                "init: keyword overrides need a config path or None, not a Config object "
                f"(got {sorted(overrides)}; use dataclasses.replace on the Config instead)"
            )
        cfg = config
    else:
        cfg = load_config(config, **overrides)
    flight.configure(cfg.flight.records)  # (the launcher's ring, or one in memory)
    name, why = resolve_backend(backend)
    from mpi4py import MPI  # MPI starts here, not at ``import shmem``

    provided = provided_level(requested, mpi_level(MPI))
    if requested is not None and provided < requested:
        log.info(
            "init: thread level %s asked for, %s provided (MPI's level)",
            requested.name,
            provided.name,
        )
    world = World(cfg, MPI.COMM_WORLD if comm is None else comm, name, why, provided)
    with _lock:
        _current = world
    return world


def get_world() -> World:
    """The open World of this process.

    Returns
    -------
    World
        The World :func:`init` opened.

    Raises
    ------
    ShmemStateError
        When :func:`init` has not been called (or the World was finalized).
    """
    world = _current
    if world is None:
        raise ShmemStateError("get_world: shmem is not initialised (call shmem.init() first)")
    return world


def finalize() -> None:
    """Finalize the open World (collective).

    Raises
    ------
    ShmemStateError
        When no World is open.
    """
    world = _current
    if world is None:
        raise ShmemStateError("finalize: shmem is not initialised (call shmem.init() first)")
    world.finalize()
