"""Point-to-point synchronisation on symmetric variables, and distributed locks.

``wait_until`` / ``test`` and their ``_all`` / ``_any`` / ``_some`` (and ``_vector``) forms
watch elements of this rank's copy of an integer :class:`~shmem.SHMEMBuffer` that peers
update with puts, atomics or signals (OpenSHMEM's ``shmem_wait_until*`` / ``shmem_test*``).
A ``status`` mask excludes the elements whose entry is non-zero. Waits poll with the same
backoff and deadline as the World's signal waits (``[signal] timeout_s``) and raise
:class:`~shmem.errors.SignalTimeoutError` naming the elements and last values; every
satisfied wait ends with an acquire fence.

Locks (``shmem_set_lock`` / ``shmem_test_lock`` / ``shmem_clear_lock``) are fair ticket locks
in one 64-bit word of rank 0's copy: the high half hands out tickets, the low half says whose
turn it is, so ranks acquire in the order they asked.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .dtypes import dtype_name, int_operand
from .errors import ArgumentError, LockTimeoutError, ShmemStateError, SignalTimeoutError
from .flight import recorded
from .rma import check_comparison
from .signals import _SYMBOLS, COMPARISONS, check_timeout, poll_until, spin_seconds

if TYPE_CHECKING:
    from .buffer import SHMEMBuffer

__all__ = ["clear_lock", "set_lock", "test_elements", "try_lock", "wait_elements"]

Mode = Literal["one", "all", "any", "some"]
_LOW = 0xFFFFFFFF
_TICKET = 1 << 32


def _targets(
    buf: SHMEMBuffer,
    where: str,
    cmp: object,
    value: object,
    indices: Sequence[int] | None,
    status: Sequence[int] | None,
) -> tuple[np.ndarray[Any, Any], list[int], list[int]]:
    """``(flat local view, indices watched, value per index)`` after the checks."""
    buf._live(where)
    check_comparison(f"SHMEMBuffer.{where}", cmp)
    if buf.dtype.kind not in "iu":
        raise ArgumentError(
            f"SHMEMBuffer.{where}: waits need an integer buffer (got {dtype_name(buf.dtype)})"
        )
    heap = buf.world.heap
    if heap.device_memory:
        from .rma import host_heap

        host_heap(buf.world, f"SHMEMBuffer.{where}")  # raises: device memory is not polled yet
    flat = heap.local_view(buf.offset, buf.nbytes).view(buf.dtype)
    idx = list(range(buf.count)) if indices is None else _indices(buf, where, indices)
    if isinstance(value, Sequence | np.ndarray) and not isinstance(value, str | bytes):
        values = list(value)  # the _vector forms: one value per watched element
        if len(values) != len(idx):
            raise ArgumentError(
                f"SHMEMBuffer.{where}: one value per element (got {len(values)} values for "
                f"{len(idx)} elements)"
            )
    else:
        values = [value] * len(idx)
    checked = [int_operand(f"SHMEMBuffer.{where}", "value", v, buf.dtype) for v in values]
    if status is not None:
        if not isinstance(status, Sequence | np.ndarray) or isinstance(status, str | bytes):
            raise ArgumentError(
                f"SHMEMBuffer.{where}: invalid status (got {status!r}; expected a sequence "
                "of 0/1 flags, one per element)"
            )
        mask = list(status)
        bad = [m for m in mask if not isinstance(m, int | np.integer)]  # bools are ints
        if bad:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: invalid status entry (got {bad[0]!r}; expected 0 or "
                "1: nonzero leaves the element out)"
            )
        if len(mask) != len(idx):
            raise ArgumentError(
                f"SHMEMBuffer.{where}: one status entry per element (got {len(mask)} for "
                f"{len(idx)} elements)"
            )
        keep = [k for k, m in enumerate(mask) if not m]
        idx = [idx[k] for k in keep]
        checked = [checked[k] for k in keep]
    return flat, idx, checked


def _indices(buf: SHMEMBuffer, where: str, indices: object) -> list[int]:
    """The watched element indices, each an integer in range (no truncation of 1.5)."""
    if not isinstance(indices, Sequence | np.ndarray) or isinstance(indices, str | bytes):
        raise ArgumentError(
            f"SHMEMBuffer.{where}: invalid indices (got {indices!r}; expected a sequence of "
            "element indices)"
        )
    idx: list[int] = []
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise ArgumentError(
                f"SHMEMBuffer.{where}: invalid index (got {i!r} of type {type(i).__name__}; "
                "expected an integer)"
            )
        if not 0 <= i < buf.count:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: index out of range (got {i}; expected 0 <= index < "
                f"{buf.count})"
            )
        idx.append(int(i))
    return idx


def _satisfied(flat: np.ndarray[Any, Any], idx: list[int], vals: list[int], cmp: str) -> list[int]:
    test = COMPARISONS[cmp]
    return [i for i, v in zip(idx, vals, strict=True) if test(int(flat[i]), v)]


def _done(mode: Mode, hits: list[int], idx: list[int]) -> bool:
    return len(hits) == len(idx) if mode in ("one", "all") else bool(hits)


def test_elements(
    buf: SHMEMBuffer,
    where: str,
    mode: Mode,
    cmp: object,
    value: object,
    indices: Sequence[int] | None,
    status: Sequence[int] | None,
) -> list[int] | None:
    """The satisfied indices when the condition holds for ``mode``, else None (no waiting)."""
    flat, idx, vals = _targets(buf, where, cmp, value, indices, status)
    buf.world.heap.progress()
    hits = _satisfied(flat, idx, vals, str(cmp))
    if not _done(mode, hits, idx):  # "any"/"some" with every element masked: never done
        return None
    buf.world.heap.fence()  # acquire
    return hits


@recorded("wait_until")
def wait_elements(
    buf: SHMEMBuffer,
    where: str,
    mode: Mode,
    cmp: object,
    value: object,
    indices: Sequence[int] | None,
    status: Sequence[int] | None,
    timeout: float | None,
) -> list[int]:
    """Block until the condition holds for ``mode`` (``"one"``/``"all"``: every watched
    element; ``"any"``/``"some"``: at least one); return the satisfied indices (``[]`` when
    the mask excludes everything)."""
    if timeout is not None:
        check_timeout(f"SHMEMBuffer.{where}", timeout)
    flat, idx, vals = _targets(buf, where, cmp, value, indices, status)
    if not idx:
        return []
    world = buf.world
    heap = world.heap
    c = str(cmp)
    hits = _satisfied(flat, idx, vals, c)
    if not _done(mode, hits, idx):
        limit = (
            world.config.signal.timeout_s
            if timeout is None
            else check_timeout(f"SHMEMBuffer.{where}", timeout)
        )
        found: list[list[int]] = [hits]

        def probe() -> bool:
            found[0] = _satisfied(flat, idx, vals, c)
            return _done(mode, found[0], idx)

        ok = poll_until(
            probe, time.monotonic() + limit, heap.progress, spin_seconds(world.heap.host_size)
        )
        if not ok:
            last = {i: int(flat[i]) for i in idx[:8]}
            waiting = [i for i in idx if i not in found[0]][:8]
            raise SignalTimeoutError(
                f"SHMEMBuffer.{where}: rank {world.rank} timed out after {limit:g} s waiting "
                f"for {mode} of elements {idx[:8]}{'...' if len(idx) > 8 else ''} "
                f"{_SYMBOLS[c]} {vals[:8]} (still waiting on {waiting}; last values {last})",
                operation=where,
                slot=waiting[0] if waiting else -1,
                expected=f"{_SYMBOLS[c]} {vals[0]}",
                last_value=last.get(waiting[0], 0) if waiting else 0,
                peers=(),
            )
        hits = found[0]
    heap.fence()  # acquire: later loads see what was written before the update
    return hits


# -- locks ----------------------------------------------------------------------------------


def _lock_offset(buf: SHMEMBuffer, where: str, index: int) -> int:
    buf._live(where)
    if buf.dtype not in (np.dtype(np.int64), np.dtype(np.uint64)):
        raise ArgumentError(
            f"SHMEMBuffer.{where}: a lock is a 64-bit word (got {dtype_name(buf.dtype)}; "
            "expected an int64 or uint64 SHMEMBuffer, zeroed, as OpenSHMEM's long lock)"
        )
    return buf._atomic_offset(where, index)


def _word(buf: SHMEMBuffer, value: int) -> int:
    """``value`` (any Python int) as the buffer dtype's representation of its low 64 bits."""
    v = value & ((1 << 64) - 1)
    if buf.dtype.kind == "i" and v >= 1 << 63:
        v -= 1 << 64
    return v


@recorded("set_lock")
def set_lock(buf: SHMEMBuffer, index: int, timeout: float | None) -> None:
    """Draw a ticket and wait for its turn (``shmem_set_lock``), within the deadline."""
    off = _lock_offset(buf, "set_lock", index)
    world = buf.world
    # every argument checked before the ticket is drawn: a ticket never served would leave
    # the lock unusable for every rank
    limit = (
        world.config.signal.timeout_s
        if timeout is None
        else check_timeout("SHMEMBuffer.set_lock", timeout)
    )
    if index in buf._locks_held:
        raise ShmemStateError(
            f"SHMEMBuffer.set_lock: rank {world.rank} already holds lock element {index} "
            "(OpenSHMEM locks are not recursive: this would wait for itself)"
        )
    heap = world.heap
    old = heap.atomic_fetch_op(0, off, _word(buf, _TICKET), buf.dtype, "add")
    ticket = (old >> 32) & _LOW
    seen = [old & _LOW]

    def my_turn() -> bool:
        seen[0] = heap.atomic_fetch_op(0, off, 0, buf.dtype, "fetch") & _LOW
        return seen[0] == ticket

    if seen[0] != ticket and not poll_until(my_turn, time.monotonic() + limit, heap.progress):
        raise LockTimeoutError(
            f"SHMEMBuffer.set_lock: rank {world.rank} timed out after {limit:g} s waiting "
            f"for lock element {index} (ticket {ticket}, now serving {seen[0]}; its holder "
            "did not call clear_lock); the lock is unusable from now on",
            operation="set_lock",
            slot=int(index),
            expected=f"== {ticket}",
            last_value=int(seen[0]),
            peers=(),
        )
    buf._locks_held.add(index)
    heap.fence()  # acquire


def try_lock(buf: SHMEMBuffer, index: int, where: str = "try_lock") -> bool:
    """Take the lock if it is free, without waiting: True when this call took it."""
    off = _lock_offset(buf, where, index)
    heap = buf.world.heap
    if index in buf._locks_held:
        return False  # held by this rank (test_lock never waits, nor deadlocks)
    word = heap.atomic_fetch_op(0, off, 0, buf.dtype, "fetch")
    if (word >> 32) & _LOW != word & _LOW:
        return False  # held, or others are queued: fairness says wait your turn
    if heap.atomic_compare_swap(0, off, word, _word(buf, word + _TICKET), buf.dtype) != word:
        return False
    buf._locks_held.add(index)
    heap.fence()
    return True


def clear_lock(buf: SHMEMBuffer, index: int) -> None:
    """Complete this rank's outstanding puts, then pass the lock on (``shmem_clear_lock``)."""
    off = _lock_offset(buf, "clear_lock", index)
    world = buf.world
    if index not in buf._locks_held:
        raise ShmemStateError(
            f"SHMEMBuffer.clear_lock: rank {world.rank} does not hold lock element {index} "
            "(only the rank that set it may clear it; the lock is unchanged)"
        )
    world.quiet()  # may time out: the lock is then still ours, and clear_lock may be retried
    heap = world.heap
    word = heap.atomic_fetch_op(0, off, 0, buf.dtype, "fetch")
    while True:  # bump the low half without carrying into the tickets
        new = _word(buf, (word & ~_LOW) | ((word + 1) & _LOW))
        old = heap.atomic_compare_swap(0, off, word, new, buf.dtype)
        if old == word:
            buf._locks_held.discard(index)  # passed on: no longer ours
            return
        word = old  # a ticket was drawn meanwhile: retry
