"""Signal pads: symmetric arrays of 64-bit flags, and barriers built on them.

Ordering rule (release/acquire)
-------------------------------
Data written before ``signal()`` is visible to any rank that observes the signal through
``wait_until()``. It is enforced as follows:

* ``signal`` (release) first calls the heap's ``fence()`` (``MPI.Win.Sync``: a full memory
  barrier), so every earlier store, through a peer view or a local view, is globally visible
  before the flag is written. One-sided puts to off-node peers complete (``Win.Flush``)
  before ``put`` returns, so they are ordered before any later signal as well.
* ``wait_until`` (acquire) calls ``fence()`` after it sees the awaited value and before it
  returns, so the caller's later loads see the data.

A slot receives either ``"set"`` from one writer at a time, or ``"add"`` from any number of
writers; do not mix the two on one slot concurrently. ``"set"`` to a node-local peer is a
single aligned 8-byte store; ``"add"`` and every signal to an off-node peer are MPI atomics.

Every wait has a deadline (``[signal] timeout_s`` by default) and raises
:class:`~shmem.errors.SignalTimeoutError` naming the operation, slot, expectation, last
value seen and the peer(s) that did not arrive.
"""

from __future__ import annotations

import enum
import math
import operator
import os
import time
from collections.abc import Callable
from typing import Any, Literal, cast

import numpy as np

from .dtypes import int_operand
from .errors import ArgumentError, RemoteTimeoutError, SignalTimeoutError
from .heap import SymmetricHeap

__all__ = [
    "COMPARISONS",
    "Cmp",
    "CmpName",
    "SignalOp",
    "SignalOpName",
    "SignalPad",
    "check_timeout",
    "poll_until",
]


class Cmp(enum.StrEnum):
    """A comparison for waits: ``Cmp.GE`` and ``"ge"`` are interchangeable everywhere
    (OpenSHMEM's ``SHMEM_CMP_GE``)."""

    EQ = "eq"
    NE = "ne"
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"


class SignalOp(enum.StrEnum):
    """How a signal updates its slot: ``SignalOp.SET`` (``"set"``) or ``SignalOp.ADD``."""

    SET = "set"
    ADD = "add"


CmpName = Literal["eq", "ne", "gt", "ge", "lt", "le"]
SignalOpName = Literal["set", "add"]

COMPARISONS: dict[str, Callable[[int, int], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
}
_CMP_CODES = {name: code for code, name in enumerate(COMPARISONS)}  # shmem._rmafast.spin's
_SYMBOLS = {"eq": "==", "ne": "!=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}
SIGNAL_OPS = ("set", "add")
SLOT_DTYPE = np.dtype(np.int64)  # the storage; the words are unsigned (OpenSHMEM's signals)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_WORDS = np.dtype(np.uint64)
_MASK = (1 << 64) - 1
_INLINE_SPINS = 64  # loads a wait makes before its clocked poll loop (tens of microseconds)
_C_SPINS = 256  # the same in C (shmem._rmafast.spin: a load and an MPI_Iprobe, 0.1-0.3 us)
_C_YIELDS = 64  # the barrier's loads in C with sched_yield between them, when it does not spin
_BARRIER_ROUNDS = 64  # dissemination rounds: enough for 2**64 ranks

# Backoff: spin (cheap polls) briefly, then yield the core, then sleep with growing pauses.
# With more ranks than cores a spin starves the very rank we are waiting for, so oversubscribed
# nodes yield at once (measured on 2 cores: 4 ranks, ping-pong 6 us with no spin vs 51 us with
# a 20 us spin; 2 ranks, 1.4 us with a 2 us spin).
_SPIN_S = 2e-6
_YIELD_S = 2e-3
# a wait on a heap with ranks on other nodes: their one-sided operations on this rank may
# need its MPI progress (Open MPI's osc/rdma over TCP, AM-based accumulates), which a
# sleeping waiter does not make: it yields for longer and sleeps less (a stream of signals
# to a waiting rank on Open MPI took 0.77 ms a signal with the 1 ms sleeps)
_REMOTE_YIELD_S = 0.1
_REMOTE_SLEEP_MAX_S = 50e-6
_SLEEP_MAX_S = 1e-3


def _int64_view(arr: np.ndarray[Any, Any]) -> memoryview:
    return memoryview(cast(Any, arr)).cast("B").cast("q")


def signal_value(where: str, value: object, name: str = "value") -> int:
    """A signal value as its slot's stored int64 bit pattern: any integer ``0 <= v < 2**64``
    (the slots are unsigned 64-bit words, as OpenSHMEM's signals; a negative value is taken
    modulo ``2**64``, as C's ``uint64_t``: ``-1`` is ``2**64 - 1``)."""
    v = int_operand(where, name, value, _WORDS, wrap_negative=True)
    return v - (1 << 64) if v > _INT64_MAX else v


def check_timeout(where: str, timeout: object) -> float:
    """``timeout`` as seconds: a number >= 0 (``inf`` waits for ever); NaN, negative or
    non-numbers raise :class:`~shmem.errors.ArgumentError`."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float | np.integer | np.floating)
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise ArgumentError(
            f"{where}: invalid timeout (got {timeout!r}; expected a number of seconds >= 0)"
        )
    return float(timeout)


def spin_seconds(local_size: int) -> float:
    """How long a wait spins before yielding: none when the node's ranks outnumber its cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = 0
    if cores <= 1:  # pinned to one core (Open MPI binds each rank to its own): the machine's
        cores = os.cpu_count() or 1
    return 0.0 if local_size > cores else _SPIN_S


def poll_until(
    probe: Callable[[], bool],
    deadline: float,
    progress: Callable[[], None] | None = None,
    spin_s: float = _SPIN_S,
    yield_s: float = _YIELD_S,
    sleep_max_s: float = _SLEEP_MAX_S,
) -> bool:
    """Call ``probe`` with backoff until it returns True (-> True) or ``deadline`` passes.

    ``deadline`` is a ``time.monotonic()`` value. ``progress`` is called between probes.
    Polls spin for ``spin_s``, then yield the core until ``yield_s`` (2 ms), then sleep up
    to ``sleep_max_s`` (1 ms) between probes. A probe that drives a transfer (an MPI
    request's ``Test``: MPI moves a large message only while it is called) wants a long
    ``yield_s``: a sleeping poller stalls the transfer.
    """
    start = time.monotonic()
    pause = 20e-6
    while True:
        if probe():
            return True
        now = time.monotonic()
        if now >= deadline:
            return probe()
        if progress is not None:
            progress()
        waited = now - start
        if waited < spin_s:
            continue
        if waited < yield_s:
            os.sched_yield()
            continue
        time.sleep(min(pause, max(deadline - now, 0.0)))
        pause = min(pause * 2, sleep_max_s)


class SignalPad:
    """A symmetric pad of ``slots`` int64 flags at ``offset`` of every rank's heap slab.

    The pad also holds private slots for :meth:`barrier`. Created and released collectively
    by the owner of the heap memory (the World or a Communicator); all slots start at 0.

    Parameters
    ----------
    heap : SymmetricHeap
        The heap whose slabs hold the pad.
    offset : int
        The pad's byte offset in every rank's slab (the same on every rank).
    slots : int
        User slots (the barrier's private slots come after them).
    timeout_s : float
        The default deadline of :meth:`wait_until` and :meth:`barrier`, in seconds.
    """

    # in C where shmem._rmafast is built: signals off the node (user slots, every slot), barrier
    _fast: Any = None
    _fast_raw: Any = None
    _fast_barrier: Any = None

    def __init__(self, heap: SymmetricHeap, offset: int, slots: int, timeout_s: float) -> None:
        self._heap = heap
        self.offset = offset
        self.slots = slots
        self.timeout_s = timeout_s
        nbytes = self.nbytes_for(slots)
        self._flags = heap.local_view(offset, nbytes).view(SLOT_DTYPE)
        self._flags[...] = 0
        self._epoch = 0
        self._size = heap.world_size
        self._spin_s = spin_seconds(heap.host_size)
        # memoryviews load and store an int64 in ~15 ns, several times faster than numpy
        self._mine = _int64_view(self._flags)
        self._words = self._mine.cast("B").cast("Q")  # the same words, loaded unsigned
        self._peers: list[memoryview | None] = []
        for r in range(self._size):
            view = heap.peer_view(r, offset, nbytes)
            self._peers.append(None if view is None else _int64_view(view))
        user = heap.rma_signaller(offset, slots)
        every = heap.rma_signaller(offset, slots + _BARRIER_ROUNDS)
        if user is not None and every is not None:  # (their bound methods keep them alive)
            self._fast, self._fast_raw = user.signal, every.signal
        # waits off the node: the inline spin in C, MPI's progress between loads
        # (not where the node's ranks outnumber its cores: the peer may need this one)
        self._spin = heap.rma_spinner() if self._spin_s else None
        # (yield, sleep) of waits that outlast the spin: longer yields and short sleeps
        # where ranks on other nodes may need this rank's MPI progress
        remote = heap.num_nodes > 1
        self._backoff = (
            (_REMOTE_YIELD_S, _REMOTE_SLEEP_MAX_S) if remote else (_YIELD_S, _SLEEP_MAX_S)
        )
        self._address = int(self._flags.ctypes.data)
        # the barrier's rounds in C (shmem._rmafast.Barrier) where it is built; its waits
        # spin as long as the Python inline spin or longer (loads alone are ns, not us)
        self._fast_barrier = None
        barrier = heap.rma_barrier(offset, slots, every)
        if barrier is not None:
            self._fast_barrier = barrier.run
        self._barrier_spins, self._barrier_yields = 0, _C_YIELDS  # (more ranks than cores)
        if self._spin_s:
            self._barrier_spins = _C_SPINS if self._spin is not None else 16 * _C_SPINS

    @staticmethod
    def nbytes_for(slots: int) -> int:
        """Heap bytes a pad of ``slots`` user slots occupies (barrier slots included).

        Parameters
        ----------
        slots : int
            User slots.

        Returns
        -------
        int
            Heap bytes for the pad: the user slots and the barrier slots, 8 bytes each.
        """
        return (slots + _BARRIER_ROUNDS) * SLOT_DTYPE.itemsize

    # -- arguments --------------------------------------------------------------------------

    def _check_rank(self, where: str, rank: int) -> None:
        if (
            isinstance(rank, bool)
            or not isinstance(rank, int | np.integer)
            or not 0 <= rank < self._heap.world_size
        ):
            raise ArgumentError(
                f"{where}: invalid rank (got {rank!r}; expected 0 <= rank < "
                f"{self._heap.world_size})"
            )

    def _check_slot(self, where: str, slot: int) -> None:
        if (
            isinstance(slot, bool)
            or not isinstance(slot, int | np.integer)
            or not 0 <= slot < self.slots
        ):
            raise ArgumentError(
                f"{where}: invalid slot (got {slot!r}; expected 0 <= slot < {self.slots})"
            )

    # -- signal / wait ----------------------------------------------------------------------

    def signal(self, rank: int, slot: int, value: int, op: SignalOp | str = "set") -> None:
        """Set or add ``value`` to ``slot`` of ``rank``'s pad (release: orders prior writes).

        Parameters
        ----------
        rank : int
            The rank whose flag changes (may be this rank).
        slot : int
            ``0 <= slot < slots``.
        value : int
            ``0 <= value < 2**64``: slots are unsigned 64-bit words (a negative value is
            taken modulo ``2**64``, as C's ``uint64_t``).
        op : {"set", "add"}

        Raises
        ------
        ArgumentError
            ``rank``, ``slot`` or ``op`` out of range or unknown.
        """
        fast = self._fast
        # C: these checks, the fence and the atomic (off the node)
        if fast is not None and self._c_signal(fast, rank, slot, value, op, self.timeout_s):
            return
        if type(rank) is not int or not 0 <= rank < self._size:
            self._check_rank("signal", rank)
        if type(slot) is not int or not 0 <= slot < self.slots:
            self._check_slot("signal", slot)
        if op != "set" and op != "add":  # noqa: PLR1714 - faster than a set lookup here
            raise ArgumentError(
                f"signal: invalid op (got {op!r}; expected one of {list(SIGNAL_OPS)})"
            )
        if type(value) is not int or not 0 <= value <= _INT64_MAX:
            value = signal_value("signal", value)
        self._raw_signal(int(rank), int(slot), value, op)

    def _c_signal(self, fast: Any, rank: int, slot: int, value: int, op: str, limit: float) -> bool:
        """Signal through the C Signaller ``fast``: True once sent (off the node), False
        where the arguments are not for it (the caller goes on). A signal before it still
        in flight is completed first (within ``limit`` s), then this one is sent."""
        started = fast(rank, slot, value, op)
        while started is not True and started is not False:
            self._heap.wait_started(started, started.rank, "signal", limit)
            started = fast(rank, slot, value, op)
        return started is True

    def _raw_signal(
        self, rank: int, slot: int, value: int, op: str, timeout_s: float | None = None
    ) -> None:
        heap = self._heap
        fast = self._fast_raw
        if fast is not None:
            limit = self.timeout_s if timeout_s is None else timeout_s
            if self._c_signal(fast, rank, slot, value, op, limit):
                return
            heap.complete_signals(timeout_s)  # applied before this one, as every signal
        heap.fence()
        if op == "set":
            peer = self._peers[rank]
            if peer is not None:
                peer[slot] = value  # one aligned 8-byte store
                return
        byte_offset = self.offset + slot * SLOT_DTYPE.itemsize
        heap.atomic_fetch_op(
            rank,
            byte_offset,
            value,
            SLOT_DTYPE,
            op,
            self.timeout_s if timeout_s is None else timeout_s,
        )

    def read(self, slot: int) -> int:
        """The current value of this rank's ``slot``, unsigned (no ordering implied).

        Parameters
        ----------
        slot : int
            ``0 <= slot < slots``.

        Returns
        -------
        int
            The slot's value, as an unsigned 64-bit integer.
        """
        self._check_slot("read", slot)
        return int(self._words[slot])

    def wait_until(
        self,
        slot: int,
        cmp: Cmp | str,
        value: int,
        timeout: float | None = None,
        *,
        peers: tuple[int, ...] = (),
    ) -> int:
        """Block until this rank's ``slot`` compares true against ``value``; return the value.
        Slots are unsigned 64-bit words and compare unsigned.

        Parameters
        ----------
        slot : int
        cmp : {"eq", "ne", "gt", "ge", "lt", "le"}
        value : int
            ``0 <= value < 2**64`` (a negative value is taken modulo ``2**64``).
        timeout : float, optional
            Seconds; the pad's default (``[signal] timeout_s``) when None.
        peers : tuple of int, optional
            The ranks expected to signal, named in the error on timeout.

        Returns
        -------
        int
            The slot's value that satisfied the comparison (unsigned).

        Raises
        ------
        SignalTimeoutError
            The deadline passed first.
        ArgumentError
            ``slot``, ``cmp`` or ``timeout`` invalid.
        """
        if type(slot) is not int or not 0 <= slot < self.slots:
            self._check_slot("wait_until", slot)
        if cmp not in COMPARISONS:
            raise ArgumentError(
                f"wait_until: invalid comparison (got {cmp!r}; expected one of {list(COMPARISONS)})"
            )
        if type(value) is not int or not 0 <= value <= _INT64_MAX:
            value = signal_value("wait_until", value) & _MASK
        if timeout is not None:
            timeout = check_timeout("wait_until", timeout)
        return self._raw_wait("wait_until", int(slot), cmp, value, timeout, peers)

    def _raw_wait(
        self,
        operation: str,
        slot: int,
        cmp: Cmp | str,
        value: int,
        timeout: float | None,
        peers: tuple[int, ...],
        context: str = "",
    ) -> int:
        test = COMPARISONS[cmp]
        flags = self._words  # unsigned loads: the words compare unsigned
        # fast path: already there
        seen = flags[slot]
        if not test(seen, value) and self._spin is not None:
            # off the node: the inline spin in C (MPI_Iprobe between loads)
            passed = self._spin(self._address + 8 * slot, _CMP_CODES[cmp], value, _C_SPINS)
            if passed is not None:
                self._heap.fence()  # acquire
                return int(passed)
        if not test(seen, value):
            # a short inline spin first (the peer is usually a few microseconds away): no
            # clock, no closure, the transport's progress between loads
            start = time.monotonic()
            progress = self._heap.progress
            for _ in range(_INLINE_SPINS if self._spin_s else 0):
                progress()
                seen = flags[slot]
                if test(seen, value):
                    self._heap.fence()  # acquire
                    return seen
            timeout_s = self.timeout_s if timeout is None else check_timeout(operation, timeout)
            last = [seen]

            def probe() -> bool:
                last[0] = flags[slot]
                return test(last[0], value)

            deadline = start + timeout_s
            if not poll_until(probe, deadline, progress, self._spin_s, *self._backoff):
                self._timeout(operation, slot, cmp, value, last[0], timeout_s, peers, context)
            seen = last[0]
        self._heap.fence()  # acquire: later loads see what was written before the signal
        return seen

    def _timeout(
        self,
        operation: str,
        slot: int,
        cmp: Cmp | str,
        value: int,
        last: int,
        timeout_s: float,
        peers: tuple[int, ...],
        context: str,
    ) -> None:
        expected = f"{_SYMBOLS[cmp]} {value}"
        who = (
            f"; no signal from rank(s) {list(peers)}"
            if peers
            else "; no writer named (pass peers= to name the ranks expected to signal)"
        )
        raise SignalTimeoutError(
            f"{operation}: rank {self._heap.rank} timed out after {timeout_s:g} s{context} "
            f"waiting on slot {slot} (expected {expected}; last value seen {last}{who})",
            operation=operation,
            slot=slot,
            expected=expected,
            last_value=last,
            peers=peers,
        )

    # -- barrier ----------------------------------------------------------------------------

    def barrier(self, timeout: float | None = None) -> None:
        """Block until every rank has entered this barrier (collective).

        A dissemination barrier on epoch flags: in round ``k`` rank ``r`` sets its epoch in
        rank ``(r + 2**k) % P``'s round-``k`` flag and waits for ``(r - 2**k) % P`` to do the
        same to its own. Epochs only grow, so flags are never reset and a fast rank entering
        the next barrier cannot confuse a slow one. ``ceil(log2 P)`` rounds.

        After a :class:`SignalTimeoutError` the barrier may be retried: calling ``barrier()``
        again resumes the same barrier (its signals are idempotent), so a late peer is still
        met.

        Parameters
        ----------
        timeout : float, optional
            Seconds; the pad's default (``[signal] timeout_s``) when None.

        Raises
        ------
        SignalTimeoutError
            A round's peer did not signal in time (the message names the round and the peer).
        ArgumentError
            ``timeout`` is not a number of seconds >= 0.
        """
        heap = self._heap
        size, rank = heap.world_size, heap.rank
        self._epoch += 1
        epoch = self._epoch
        k, sent = 0, False
        fast = self._fast_barrier
        if fast is not None and size > 1:  # C: the rounds while each peer is on time
            got = fast(epoch, self._barrier_spins, self._barrier_yields)
            if got is None:
                return
            if got is not False:  # round k's wait (k >= 0) or signal (-(k + 1)) is ours
                k, sent = (got, True) if got >= 0 else (-got - 1, False)
        distance = 1 << k
        try:
            while distance < size:
                slot = self.slots + k
                dst = (rank + distance) % size
                try:
                    if not sent:
                        self._raw_signal(dst, slot, epoch, "set", timeout)
                    sent = False
                except RemoteTimeoutError as exc:
                    t = self.timeout_s if timeout is None else timeout
                    late = exc.peer  # (dst, or the target of the signal before)
                    raise SignalTimeoutError(
                        f"barrier: rank {rank} timed out after {t:g} s in round {k} of barrier "
                        f"{epoch}: its signal to rank {late} did not complete (rank {late} "
                        "made no MPI progress)",
                        operation="barrier",
                        slot=slot,
                        expected=f">= {epoch}",
                        last_value=int(self._flags[slot]),
                        peers=(late,),
                    ) from exc
                src = (rank - distance) % size
                self._raw_wait(
                    "barrier",
                    slot,
                    "ge",
                    epoch,
                    timeout,
                    (src,),
                    f" in round {k} of barrier {epoch}",
                )
                distance *= 2
                k += 1
        except SignalTimeoutError:
            self._epoch -= 1  # a retry resumes this barrier
            raise
        if size == 1:
            heap.fence()

    def flags_view(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """This rank's user slots as an int64 array (read-only view).

        Returns
        -------
        numpy.ndarray
            A read-only int64 view of this rank's ``slots`` user flags (live: it sees later
            signals).
        """
        out = self._flags[: self.slots]
        out = out.view()
        out.flags.writeable = False
        return out
