"""Communication contexts, non-blocking and strided RMA (OpenSHMEM's ``shmem_ctx_*``).

A :class:`Context` is an independent stream of one-sided operations: ``put_nbi``,
``get_nbi``, ``put_signal_nbi`` and the non-blocking fetching atomics start on it, and
:meth:`Context.quiet` completes them (data at the target, gets and fetches in their local
buffers, deferred signals delivered); :meth:`Context.fence` orders what came before it before
what comes after. Each context tracks only its own operations. The World's default context
(:attr:`World.default_context`, OpenSHMEM's ``SHMEM_CTX_DEFAULT``) serves the ``*_nbi``
methods of :class:`~shmem.SHMEMBuffer` when no ``ctx`` is given; a context made from a
:class:`~shmem.team.Team` takes ranks of that team.

Host paths
----------
A node-local peer's copy is a load/store view: a non-blocking put or get is a copy done at
once (OpenSHMEM allows completing early), ``quiet`` is then a memory fence. An off-node peer
(the RMA path, also ``heap.node_split = "rank"``) gets request-based MPI RMA (``Rput``,
``Rget``, ``Rget_accumulate``); ``quiet`` waits for the requests within the deadline and
``Flush``-es each target, so the data is at the target when it returns. ``put_signal_nbi``
to an off-node peer delivers its signal once the data is complete (at the next ``quiet``,
``fence`` or :meth:`Context.progress`): never before the data.

Strided transfers (``iput``/``iget``/``ibput``/``ibget``, :mod:`shmem.rma_strided`) are peer
stores through a strided view on the node, and a single ``Put``/``Rget`` with an MPI vector
datatype off it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .dtypes import Casting, dtype_name, float_operand, int_operand
from .errors import ArgumentError, NvshmemUnsupportedError, RemoteTimeoutError, ShmemStateError
from .heap import ATOMIC_DTYPES, FLOAT_ATOMIC_DTYPES
from .rma_strided import StridedMethods
from .signals import COMPARISONS, poll_until

if TYPE_CHECKING:
    from mpi4py import MPI

    from .backends.host import HostHeap
    from .buffer import SHMEMBuffer
    from .team import Team
    from .world import World

__all__ = ["AtomicOp", "Context", "Fetched", "signal_word"]

SIGNAL_DTYPE = np.dtype(np.uint64)


class AtomicOp(enum.StrEnum):
    """A fetching atomic (``AtomicOp.FETCH_ADD`` and ``"fetch_add"`` are interchangeable)."""

    FETCH = "fetch"  # shmem_atomic_fetch
    SWAP = "swap"  # shmem_atomic_swap
    COMPARE_SWAP = "compare_swap"  # shmem_atomic_compare_swap
    FETCH_ADD = "fetch_add"
    FETCH_INC = "fetch_inc"
    FETCH_AND = "fetch_and"
    FETCH_OR = "fetch_or"
    FETCH_XOR = "fetch_xor"


# AtomicOp -> the heap's op name (float32/float64 take only fetch and swap)
_HEAP_OPS = {
    "fetch": "fetch",
    "swap": "set",
    "fetch_add": "add",
    "fetch_inc": "add",
    "fetch_and": "and",
    "fetch_or": "or",
    "fetch_xor": "xor",
}


def host_heap(world: World, where: str) -> HostHeap:
    """The World's heap as a host heap, or :class:`NvshmemUnsupportedError` naming ``where``."""
    world.check_open(where)
    if world.heap.device_memory:
        raise NvshmemUnsupportedError(
            f"{where}: not available on the nvshmem backend yet (host backend only; see "
            "docs/openshmem.md for what the nvshmem backend has)"
        )
    return cast("HostHeap", world.heap)


def signal_word(
    heap: HostHeap, rank: int, offset: int, value: int, op: str, timeout_s: float | None = None
) -> None:
    """Release, then set or add ``value`` to the uint64 signal word at heap byte ``offset``
    of ``rank`` (an MPI atomic on every path, so ``"set"`` and ``"add"`` may mix)."""
    heap.fence()
    heap.atomic_fetch_op(rank, offset, value, SIGNAL_DTYPE, op, timeout_s)


def check_signal_op(where: str, op: object) -> str:
    if not isinstance(op, str) or op not in ("set", "add"):
        raise ArgumentError(f"{where}: invalid signal op (got {op!r}; expected 'set' or 'add')")
    return str(op)


class Fetched:
    """The result of a non-blocking fetching atomic: :attr:`value` once the context's
    :meth:`~Context.quiet` has run (or :attr:`done` is True)."""

    __slots__ = ("_req", "_result", "dtype")

    def __init__(self, req: MPI.Request | None, result: np.ndarray[Any, Any]) -> None:
        self._req = req
        self._result = result
        self.dtype: np.dtype[Any] = result.dtype

    @property
    def done(self) -> bool:
        """Whether the old value has arrived."""
        if self._req is not None and self._req.Test():
            self._req = None
        return self._req is None

    @property
    def value(self) -> int | float:
        """The old value (int, or float for float32/float64).

        Raises
        ------
        ShmemStateError
            The operation has not completed: call the context's ``quiet()`` first.
        """
        if not self.done:
            raise ShmemStateError(
                "Fetched.value: the atomic has not completed yet (call quiet() on its context "
                "first)"
            )
        return cast("int | float", self._result[0].item())

    def __repr__(self) -> str:
        state = f"value={self._result[0].item()!r}" if self.done else "pending"
        return f"Fetched({dtype_name(self.dtype)}, {state})"


@dataclass(slots=True)
class _Pending:
    req: MPI.Request
    rank: int  # world rank of the target
    keep: object  # buffers MPI reads or writes until the request completes
    then: Callable[[], None] | None = None  # runs once the data is complete at the target


class Context(StridedMethods):
    """A communication context (``shmem_ctx_create`` / ``shmem_team_create_ctx``).

    Made by :meth:`World.create_context` or :meth:`Team.create_ctx` (local, not collective);
    :meth:`close` (``shmem_ctx_destroy``) completes its operations first. Ranks passed to its
    methods are ranks of its team (the world's by default).
    """

    def __init__(self, world: World, team: Team | None = None) -> None:
        self._world = world
        self._team = team
        self._ops: list[_Pending] = []
        # threads share a context (ThreadLevel.MULTIPLE): the list is swapped and appended to
        # under this lock, never waited on while holding it
        self._lock = threading.Lock()
        self._closed = False
        world._contexts.add(self)  # finalize() completes what is still outstanding

    # -- state ------------------------------------------------------------------------------

    @property
    def team(self) -> Team | None:
        """The team whose ranks this context's calls take (None: the world's)."""
        return self._team

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Operations started and not yet completed by :meth:`quiet`."""
        return len(self._ops)

    def __repr__(self) -> str:
        team = "world" if self._team is None else repr(self._team)
        return f"Context(team={team}, pending={len(self._ops)}{', closed' if self._closed else ''})"

    def _heap(self, where: str) -> HostHeap:
        world = self._world
        heap = world.heap
        if self._closed or world.finalized or heap.device_memory:  # the errors, named
            if self._closed:
                raise ShmemStateError(f"Context.{where}: the context is closed")
            return host_heap(world, f"Context.{where}")
        return cast("HostHeap", heap)

    def world_rank(self, rank: int, where: str, buf: object = None) -> int:
        """``rank`` of this context's team as a world rank (validated; and ``buf``, when
        given, must be a SHMEMBuffer)."""
        if buf is not None and not _is_buffer(buf):
            raise ArgumentError(
                f"Context.{where}: invalid buffer (got {type(buf).__name__}; expected a "
                "SHMEMBuffer of this World)"
            )
        if self._team is not None:
            if self._team.destroyed:
                raise ShmemStateError(
                    f"Context.{where}: the context's team {self._team.name} is destroyed"
                )
            return self._team.world_rank(rank, f"Context.{where}")
        size = self._world.world_size
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < size:
            raise ArgumentError(
                f"Context.{where}: invalid rank (got {rank!r}; expected 0 <= rank < {size})"
            )
        return int(rank)

    # -- blocking RMA and atomics on the context -------------------------------------------

    def put(self, buf: SHMEMBuffer, rank: int, src: Any, offset: int = 0) -> None:
        """``shmem_ctx_put``: :meth:`SHMEMBuffer.put` with a rank of this context's team."""
        self._heap("put")
        buf.put(self.world_rank(rank, "put", buf), src, offset)

    def get(
        self,
        buf: SHMEMBuffer,
        rank: int,
        dst: np.ndarray[Any, Any] | None = None,
        offset: int = 0,
    ) -> np.ndarray[Any, Any]:
        """``shmem_ctx_get``: :meth:`SHMEMBuffer.get` with a rank of this context's team."""
        self._heap("get")
        return buf.get(self.world_rank(rank, "get", buf), dst, offset)

    def atomic(
        self,
        buf: SHMEMBuffer,
        rank: int,
        index: int,
        op: AtomicOp | str,
        value: float = 0,
        *,
        compare: int | None = None,
    ) -> int | float:
        """``shmem_ctx_atomic_*``: a fetching atomic, complete on return; the old value."""
        fetched = self.atomic_nbi(buf, rank, index, op, value, compare=compare)
        if not fetched.done:
            self.quiet()
        return fetched.value

    # -- non-blocking RMA -------------------------------------------------------------------

    def put_nbi(
        self,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        offset: int = 0,
        *,
        casting: Casting = "same_kind",
    ) -> None:
        """Start writing ``src`` into ``rank``'s copy of ``buf`` at byte ``offset``
        (``shmem_put_nbi``). ``src`` must not change until :meth:`quiet`."""
        heap = self._heap("put_nbi")
        if (
            self._team is None
            and type(rank) is int
            and 0 <= rank < self._world.world_size
            and type(buf) in _BUFFER_TYPES
        ):
            target = rank  # the common case, checked without the call
        else:
            target = self.world_rank(rank, "put_nbi", buf)
        buf._live("put_nbi")
        if type(src) is np.ndarray and src.dtype == buf.dtype and src.flags.c_contiguous:
            data: np.ndarray[Any, Any] = src
        else:
            data = buf._as_source("put_nbi", src, casting)
        if offset or data.nbytes > buf.nbytes or type(offset) is not int:
            buf._check_span("put_nbi", offset, data.nbytes)
        req = heap.put_nbi(target, buf.offset + int(offset), data)
        if req is not None:
            self._track(_Pending(req, target, data))

    def get_nbi(
        self, buf: SHMEMBuffer, rank: int, dst: np.ndarray[Any, Any], offset: int = 0
    ) -> np.ndarray[Any, Any]:
        """Start reading ``rank``'s copy of ``buf`` from byte ``offset`` into ``dst`` (a
        writeable C-contiguous array of ``buf``'s dtype; ``shmem_get_nbi``): ``dst`` holds the
        data after :meth:`quiet`. Returns ``dst``."""
        heap = self._heap("get_nbi")
        target = self.world_rank(rank, "get_nbi", buf)
        buf._live("get_nbi")
        if (
            not isinstance(dst, np.ndarray)
            or dst.dtype != buf.dtype
            or not dst.flags.c_contiguous
            or not dst.flags.writeable
        ):
            raise ArgumentError(
                f"Context.get_nbi: invalid dst (got {type(dst).__name__} "
                f"{getattr(dst, 'dtype', '')}; expected a writeable C-contiguous "
                f"{dtype_name(buf.dtype)} numpy array)"
            )
        buf._check_span("get_nbi", offset, dst.nbytes)
        req = heap.get_nbi(target, buf.offset + int(offset), dst)
        if req is not None:
            self._track(_Pending(req, target, dst))
        return dst

    def put_signal(
        self,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        sig: SHMEMBuffer,
        value: int,
        op: str = "set",
        *,
        sig_index: int = 0,
        offset: int = 0,
    ) -> None:
        """Write ``src``, then update ``rank``'s signal word ``sig[sig_index]`` (a uint64
        SHMEMBuffer) by ``op`` with ``value`` (``shmem_put_signal``): a rank that sees the
        signal sees the data. Complete on return."""
        self._put_signal("put_signal", buf, rank, src, sig, value, op, sig_index, offset, True)

    def put_signal_nbi(
        self,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        sig: SHMEMBuffer,
        value: int,
        op: str = "set",
        *,
        sig_index: int = 0,
        offset: int = 0,
    ) -> None:
        """:meth:`put_signal` started non-blocking (``shmem_put_signal_nbi``): complete at
        :meth:`quiet`; the signal never arrives before the data."""
        self._put_signal("put_signal_nbi", buf, rank, src, sig, value, op, sig_index, offset, False)

    def _put_signal(
        self,
        where: str,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        sig: SHMEMBuffer,
        value: int,
        op: str,
        sig_index: int,
        offset: int,
        blocking: bool,
    ) -> None:
        heap = self._heap(where)
        target = self.world_rank(rank, where, buf)
        buf._live(where)
        sig_offset = signal_offset(sig, sig_index, f"Context.{where}")
        v = int_operand(f"Context.{where}", "signal value", value, SIGNAL_DTYPE)
        sop = check_signal_op(f"Context.{where}", op)
        data = buf._as_source(where, src)
        buf._check_span(where, offset, data.nbytes)
        timeout = self._world.config.signal.timeout_s
        if blocking:
            heap.put_bytes(target, buf.offset + int(offset), data)
            signal_word(heap, target, sig_offset, v, sop, timeout)
            return
        req = heap.put_nbi(target, buf.offset + int(offset), data)
        if req is None:
            signal_word(heap, target, sig_offset, v, sop, timeout)
            return
        deliver = _Pending(req, target, data, lambda: signal_word(heap, target, sig_offset, v, sop))
        with self._lock:
            self._ops.append(deliver)
            if self.progress not in heap.progress_hooks:  # deliver it while this rank waits
                heap.progress_hooks.append(self.progress)

    # -- non-blocking atomics ---------------------------------------------------------------

    def atomic_nbi(
        self,
        buf: SHMEMBuffer,
        rank: int,
        index: int,
        op: AtomicOp | str,
        value: float = 0,
        *,
        compare: int | None = None,
        where: str = "atomic_nbi",
    ) -> Fetched:
        """Start a fetching atomic on element ``index`` of ``rank``'s copy of ``buf``
        (``shmem_atomic_fetch_add_nbi`` and the other ``*_nbi`` forms): the old value is
        ``.value`` of the returned :class:`Fetched` after :meth:`quiet`. ``where``: the
        method errors name."""
        heap = self._heap(where)
        target = self.world_rank(rank, where, buf)
        if not isinstance(op, str) or (op != "compare_swap" and op not in _HEAP_OPS):
            raise ArgumentError(
                f"Context.{where}: invalid op (got {op!r}; expected one of "
                f"{[o.value for o in AtomicOp]})"
            )
        off = buf._atomic_offset(where, index, float_ok=op in ("fetch", "swap"))
        if op == "compare_swap":
            if compare is None:
                raise ArgumentError(f"Context.{where}: compare_swap needs compare=")
            c = int_operand(f"Context.{where}", "compare", compare, buf.dtype)
            v = int_operand(f"Context.{where}", "value", value, buf.dtype)
            old = heap.atomic_compare_swap(target, off, c, v, buf.dtype)  # served at once
            return Fetched(None, np.array([old], dtype=buf.dtype))
        heap_op = _HEAP_OPS[str(op)]
        operand: float = 1 if op == "fetch_inc" else value
        if buf.dtype in FLOAT_ATOMIC_DTYPES:
            operand = float_operand(f"Context.{where}", "value", operand, buf.dtype)
        elif op != "fetch":
            operand = int_operand(
                f"Context.{where}", "value", operand, buf.dtype, wrap_negative=True
            )
        req, result = heap.atomic_fetch_op_nbi(target, off, operand, buf.dtype, heap_op)
        fetched = Fetched(req, result)
        if req is not None:
            self._track(_Pending(req, target, fetched))
        return fetched

    # -- non-fetching atomics (shmem_ctx_atomic_add, _inc, _set, _and, _or, _xor) -----------
    # Started on this context like the other non-blocking operations: applied at the target
    # once the context's quiet() (or a barrier, for the default context) returns.

    def atomic_add(self, buf: SHMEMBuffer, rank: int, index: int, value: int) -> None:
        """``shmem_ctx_atomic_add``: add ``value`` to element ``index`` of ``rank``'s copy."""
        self.atomic_nbi(buf, rank, index, "fetch_add", value, where="atomic_add")

    def atomic_inc(self, buf: SHMEMBuffer, rank: int, index: int) -> None:
        """``shmem_ctx_atomic_inc``: add one to element ``index`` of ``rank``'s copy."""
        self.atomic_nbi(buf, rank, index, "fetch_inc", where="atomic_inc")

    def atomic_set(self, buf: SHMEMBuffer, rank: int, index: int, value: float) -> None:
        """``shmem_ctx_atomic_set`` (integer or float32/float64 buffers)."""
        self.atomic_nbi(buf, rank, index, "swap", value, where="atomic_set")

    def atomic_and(self, buf: SHMEMBuffer, rank: int, index: int, value: int) -> None:
        """``shmem_ctx_atomic_and`` (integer buffers)."""
        self.atomic_nbi(buf, rank, index, "fetch_and", value, where="atomic_and")

    def atomic_or(self, buf: SHMEMBuffer, rank: int, index: int, value: int) -> None:
        """``shmem_ctx_atomic_or`` (integer buffers)."""
        self.atomic_nbi(buf, rank, index, "fetch_or", value, where="atomic_or")

    def atomic_xor(self, buf: SHMEMBuffer, rank: int, index: int, value: int) -> None:
        """``shmem_ctx_atomic_xor`` (integer buffers)."""
        self.atomic_nbi(buf, rank, index, "fetch_xor", value, where="atomic_xor")

    # -- completion and ordering ------------------------------------------------------------

    def quiet(self, timeout: float | None = None) -> None:
        """Complete every operation started on this context (``shmem_ctx_quiet``): puts are at
        their targets, gets and fetches in their buffers, deferred signals delivered.

        Raises
        ------
        RemoteTimeoutError
            An off-node target made no MPI progress within the deadline (``timeout`` seconds,
            default ``[signal] timeout_s``); the operations stay pending.
        """
        heap = self._heap("quiet")
        if self._ops:
            with self._lock:  # what was started before this call (other threads go on)
                ops, self._ops = self._ops, []
            limit = self._world.config.signal.timeout_s if timeout is None else timeout
            from mpi4py import MPI

            reqs = [p.req for p in ops]
            if not MPI.Request.Testall(reqs):  # usually all done: one call, no clock
                deadline = time.monotonic() + limit
                poll_until(lambda: MPI.Request.Testall(reqs), deadline, heap.progress)
            for p in ops:  # completed requests test true again (null requests)
                if not p.req.Test():
                    with self._lock:
                        self._ops[:0] = ops  # still pending, in their order
                    raise RemoteTimeoutError(
                        f"Context.quiet: rank {heap.rank}: an operation on rank {p.rank} did "
                        f"not complete within {limit:g} s (rank {p.rank} made no MPI progress)",
                        peer=p.rank,
                    )
            for r in sorted({p.rank for p in ops}):
                heap.flush(r)
            self._unhook(heap)
            for p in ops:
                if p.then is not None:
                    p.then()
        heap.fence()

    def _track(self, op: _Pending) -> None:
        with self._lock:
            self._ops.append(op)

    def _unhook(self, heap: HostHeap) -> None:
        with self._lock:
            if not self._ops and self.progress in heap.progress_hooks:
                heap.progress_hooks.remove(self.progress)

    def fence(self) -> None:
        """Order this context's puts, AMOs and signals to each rank before the ones started
        after (``shmem_ctx_fence``; here as strong as :meth:`quiet` when any is pending)."""
        if self._ops:
            self.quiet()
        else:
            self._heap("fence").fence()

    def progress(self) -> None:
        """Deliver the deferred signals whose data is complete, without waiting."""
        heap = self._heap("progress")
        if not self._lock.acquire(blocking=False):
            return  # another thread is at this context's list: it makes the progress
        finished: list[_Pending] = []
        try:
            done = 0
            for p in self._ops:
                if not p.req.Test():
                    break
                done += 1
            if done:
                finished, self._ops = self._ops[:done], self._ops[done:]
        finally:
            self._lock.release()
        if finished:
            for r in sorted({p.rank for p in finished}):
                heap.flush(r)
            self._unhook(heap)
            for p in finished:
                if p.then is not None:
                    p.then()

    def close(self) -> None:
        """Complete the pending operations, then release the context (``shmem_ctx_destroy``).
        Closing twice is a no-op."""
        if self._closed:
            return
        if self._ops and not self._world.finalized:
            self.quiet()
        self._closed = True

    destroy = close

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_BUFFER_TYPES: tuple[type, ...] = ()  # (SHMEMBuffer,): registered by shmem.buffer on import


def register_buffer_type(cls: type) -> None:
    """Name :class:`~shmem.SHMEMBuffer` for the checks here: :mod:`shmem.buffer` sits above
    this module and registers it once, when it is imported (before any buffer exists)."""
    global _BUFFER_TYPES
    _BUFFER_TYPES = (cls,)


def _is_buffer(obj: object) -> bool:
    return isinstance(obj, _BUFFER_TYPES)


def signal_offset(sig: SHMEMBuffer, index: int, where: str) -> int:
    """Heap byte offset of signal word ``sig[index]`` (a uint64 SHMEMBuffer)."""
    if not _is_buffer(sig):
        raise ArgumentError(
            f"{where}: invalid signal (got {type(sig).__name__}; expected a uint64 SHMEMBuffer)"
        )
    sig._live(where.rsplit(".", 1)[-1])
    if sig.dtype != SIGNAL_DTYPE:
        raise ArgumentError(
            f"{where}: the signal must be a uint64 SHMEMBuffer (got {dtype_name(sig.dtype)}; "
            "signals are unsigned 64-bit words, as OpenSHMEM's uint64_t)"
        )
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise ArgumentError(f"{where}: invalid signal index (got {index!r})")
    if not 0 <= index < sig.count:
        raise ArgumentError(
            f"{where}: signal index out of range (got {index}; expected 0 <= index < {sig.count})"
        )
    return sig.offset + int(index) * SIGNAL_DTYPE.itemsize


def check_comparison(where: str, cmp: object) -> str:
    if not isinstance(cmp, str) or cmp not in COMPARISONS:
        raise ArgumentError(
            f"{where}: invalid comparison (got {cmp!r}; expected one of {list(COMPARISONS)})"
        )
    return str(cmp)


def atomic_dtype_ok(dtype: np.dtype[Any], float_ok: bool) -> bool:
    return dtype in ATOMIC_DTYPES or (float_ok and dtype in FLOAT_ATOMIC_DTYPES)
