"""Agreement between ranks: deadline-bounded all-gathers and the argument checks built on
them, and the signatures of heap calls compared through the allocation barrier."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CollectiveMismatchError, HeapExhaustedError

if TYPE_CHECKING:
    from mpi4py import MPI

    from .world import World

__all__ = [
    "BARRIER_SIGNATURE",
    "allgather_within",
    "alloc_after_collecting",
    "compare_across_ranks",
    "describe_heap_record",
    "heap_mismatch",
    "heap_signature",
]

_ABANDONED: list[object] = []  # exchanges given up on: MPI still owns their buffers


def allgather_within(
    comm: MPI.Intracomm,
    obj: Any,
    timeout_s: float,
    where: str,
    progress: Callable[[], None] | None = None,
) -> list[Any]:
    """``comm.allgather(obj)`` with a deadline: two non-blocking exchanges (the pickled
    sizes, then the bytes) polled until ``timeout_s``, so a rank that never arrives raises
    :class:`~shmem.errors.SignalTimeoutError` here instead of blocking the others.
    ``progress`` (a heap's) is called between polls, so peers' one-sided operations aimed
    at this rank are served meanwhile."""
    import pickle

    from mpi4py import MPI

    from .errors import SignalTimeoutError
    from .signals import poll_until

    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    size = comm.Get_size()
    sizes = np.zeros(size, np.int64)
    mine = np.array([data.size], np.int64)
    deadline = time.monotonic() + timeout_s
    for step in range(2):
        if step == 0:
            req = comm.Iallgather([mine, MPI.INT64_T], [sizes, MPI.INT64_T])
            keep: tuple[object, ...] = (mine, sizes)
        else:
            counts = [int(n) for n in sizes]
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
            out = np.empty(int(sizes.sum()), np.uint8)
            req = comm.Iallgatherv([data, MPI.BYTE], [out, (counts, displs), MPI.BYTE])
            keep = (data, out)
        if not poll_until(req.Test, deadline, progress):
            _ABANDONED.append((req, keep))
            raise SignalTimeoutError(
                f"{where}: rank {comm.Get_rank()} timed out after {timeout_s:g} s waiting for "
                "every rank's arguments (a rank did not arrive; the ranks are out of step now)",
                operation=where,
                slot=-1,
                expected="every rank",
                last_value=0,
                peers=(),
            )
    return [pickle.loads(out[d : d + c].tobytes()) for c, d in zip(counts, displs, strict=True)]


def compare_across_ranks(
    comm: MPI.Intracomm,
    where: str,
    call: int,
    record: tuple[Any, ...],
    error: Exception | None,
    timeout_s: float | None = None,
    progress: Callable[[], None] | None = None,
) -> None:
    """Debug check of a collective call (collective): all-gather ``(call number, arguments,
    local argument error)`` and raise on every rank when any rank has an error (its own on
    that rank) or when ranks disagree (``CollectiveMismatchError`` listing each rank's).
    With ``timeout_s`` the exchange has a deadline (``SignalTimeoutError``)."""
    mine = (call, record, None if error is None else str(error))
    if timeout_s is None:
        records = comm.allgather(mine)
    else:
        records = allgather_within(comm, mine, timeout_s, where, progress)
    if error is not None:
        raise error
    bad = [(r, e) for r, (_, _, e) in enumerate(records) if e is not None]
    if bad:
        others = CollectiveMismatchError(
            f"{where}: invalid arguments on other ranks: "
            + "; ".join(f"rank {r}: {e}" for r, e in bad)
        )
        # every rank knows every rank's error: nothing more to exchange (a rank with an
        # invalid argument raises its own error, and takes part in no report)
        others.agreed = True  # type: ignore[attr-defined]
        raise others
    if any(rec[:2] != records[0][:2] for rec in records):
        listing = "; ".join(f"rank {r}: call {c} {rec}" for r, (c, rec, _) in enumerate(records))
        raise CollectiveMismatchError(f"{where}: ranks disagree ({listing})")


_HEAP_KINDS = ("alloc", "free", "barrier")


def heap_signature(record: tuple[Any, ...]) -> int:
    """``("alloc", nbytes, dtype, shape, alignment)`` or ``("free", offset, ...)`` as one
    positive int64: the kind in the top bits, then (allocations) the alignment's log2 + 1
    in five bits (0: the heap's default), then the bytes or the offset."""
    kind = _HEAP_KINDS.index(record[0]) + 1 if record and record[0] in _HEAP_KINDS else 4
    value = record[1] if len(record) > 1 and isinstance(record[1], int) else 0
    align = record[4] if kind == 1 and len(record) > 4 and isinstance(record[4], int) else 0
    shift = align.bit_length() if align else 0  # log2 + 1 for a power of two
    return kind << 60 | (shift & 0x1F) << 55 | (value & ((1 << 55) - 1))


BARRIER_SIGNATURE = heap_signature(("barrier",))
"""What a rank's heap-call word says while its next collective call is a barrier."""


def describe_heap_record(where: str, record: tuple[Any, ...]) -> str:
    """A heap call as its rank describes it, from its record (:meth:`World._agree`'s):
    ``World.empty(shape=(16,), dtype=float32): 64 bytes``."""
    if len(record) == 5 and record[0] == "alloc":
        _, nbytes, dtype, dims, align = record
        aligned = f", alignment={align}" if align else ""
        return f"{where}(shape={tuple(dims)}, dtype={dtype}{aligned}): {nbytes} bytes"
    if len(record) == 3 and record[0] == "free":
        return f"{where}() of the buffer at offset {record[1]} ({record[2]} bytes)"
    return f"{where}(invalid arguments)"


def heap_mismatch(
    world: World, where: str, record: tuple[Any, ...], found: Exception | None = None
) -> CollectiveMismatchError:
    """The error of a heap call whose signature differs on some rank (every rank found it
    in the same barrier, or the same all-gather: each of them calls this): every rank's own
    account of its call, exchanged now (:mod:`shmem.callreport`), numbered by the flight
    recorder's World stream. ``found``: the error that found it (its traceback is kept)."""
    from . import flight
    from .callreport import mismatch_error

    rec = flight.recorder()
    call = rec.calls(0) or world._calls
    rec.fail_current(0)  # (before the wait for the others' lines: see fail_current)
    reporter = world._reporter
    reporter.progress = world.heap.progress
    lines = reporter.exchange(call, describe_heap_record(where, record))
    outcome = "nothing was allocated or freed"
    absent = [str(line.rank) for line in lines if not line.seen]
    if absent:  # in no heap call (a World.barrier, say): this rank's count of them moved on
        world._out_of_step = f"{where} met rank(s) {', '.join(absent)} in no heap call"
        outcome += f"; the World is out of step ({world._out_of_step}): finalize it"
    error = mismatch_error(where, lines, outcome)
    return error if found is None else error.with_traceback(found.__traceback__)


def alloc_after_collecting(world: World, record: tuple[Any, ...]) -> int:
    """The heap is full while closed buffers are held for their views: the allocation of
    ``record`` (:meth:`World.empty`'s) tried once more after every rank has collected its
    garbage (collective); returns its offset.

    A view kept only by a reference cycle (an exception's traceback keeps the frames that
    made it: ``pytest.raises``, an ``except`` that stores the error) is gone once the
    garbage collector runs, which each rank does at moments of its own, and a held block is
    freed only when no rank has a view of it (:mod:`shmem.quarantine`). Every rank finds
    the heap full at the same call (their heaps are identical), so every rank collects now
    and the ranks settle the held blocks again in one more allocation barrier before the
    allocation is tried again; it raises ``HeapExhaustedError`` if the heap is still full.
    """
    gc.collect()
    world._agree("World.empty", record, None)
    try:
        return world._arena.alloc(record[1], record[4])
    except HeapExhaustedError as exc:
        held = world._quarantine.held_nbytes
        if not held:
            raise
        error = HeapExhaustedError(
            f"World.empty: {exc} ({held} bytes belong to closed buffers that views are "
            "still alive for: they are freed at the next heap call after the last view "
            "is gone)",
            requested=exc.requested,
            free_total=exc.free_total,
            largest_free=exc.largest_free,
        )
    raise error
