"""Agreement between ranks: deadline-bounded all-gathers and the argument checks built on
them, and the signatures of heap calls compared through the allocation barrier."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CollectiveMismatchError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["allgather_within", "compare_across_ranks", "describe_heap_call", "heap_signature"]

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
        raise CollectiveMismatchError(
            f"{where}: invalid arguments on other ranks: "
            + "; ".join(f"rank {r}: {e}" for r, e in bad)
        )
    if any(rec[:2] != records[0][:2] for rec in records):
        listing = "; ".join(f"rank {r}: call {c} {rec}" for r, (c, rec, _) in enumerate(records))
        raise CollectiveMismatchError(f"{where}: ranks disagree ({listing})")


_HEAP_KINDS = ("alloc", "free")


def heap_signature(record: tuple[Any, ...]) -> int:
    """``("alloc", nbytes, dtype, shape, alignment)`` or ``("free", offset, ...)`` as one
    positive int64: the kind in the top bits, then (allocations) the alignment's log2 + 1
    in five bits (0: the heap's default), then the bytes or the offset."""
    kind = _HEAP_KINDS.index(record[0]) + 1 if record and record[0] in _HEAP_KINDS else 3
    value = record[1] if len(record) > 1 and isinstance(record[1], int) else 0
    align = record[4] if kind == 1 and len(record) > 4 and isinstance(record[4], int) else 0
    shift = align.bit_length() if align else 0  # log2 + 1 for a power of two
    return kind << 60 | (shift & 0x1F) << 55 | (value & ((1 << 55) - 1))


def describe_heap_call(sig: int) -> str:
    kind, value = sig >> 60, sig & ((1 << 55) - 1)
    shift = (sig >> 55) & 0x1F
    if kind == 1:
        aligned = f" aligned to {1 << (shift - 1)}" if shift else ""
        return f"empty/zeros of {value} bytes{aligned}"
    if kind == 2:
        return f"close of the buffer at offset {value}"
    return "another heap call" if sig else "no heap call yet"
