"""Shared steps of the collective family: argument handling and the node-local exchange.

Every collective of the family has the same shape on one node: this rank makes its input
readable (zero-copy for a SHMEMBuffer, else staged into its scratch), raises ``READY``, reads
what it needs from peers through peer views, raises ``DONE``, and, when its input was the
caller's SHMEMBuffer, waits for every peer's ``DONE`` before returning. Across nodes they use
MPI (non-blocking, within the deadline): multi-node scale comes from MPI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shmem.dtypes import dtype_name
from shmem.errors import ShmemError

from .communicator import DONE, READY, Communicator, Operand, output_array

__all__ = ["exchange", "prepare"]


def prepare(
    comm: Communicator,
    where: str,
    x: Any,
    out: Any,
    out_count: Callable[[int], int],
    extra: tuple[Any, ...] = (),
    validate: Callable[[Operand], None] | None = None,
    default_out_is_x: bool = False,
) -> tuple[Operand, Any, np.ndarray[Any, Any]]:
    """Validate identically on every rank (and compare across ranks in debug mode)."""
    error: Exception | None = None
    xin: Operand | None = None
    ret: Any = None
    dst: np.ndarray[Any, Any] | None = None
    record: tuple[Any, ...] = (where, "invalid")
    try:
        xin = Operand(x, where, "x")
        if validate is not None:
            validate(xin)
        target = x if (out is None and default_out_is_x) else out
        ret, dst = output_array(comm, target, out_count(xin.count), xin.dtype, where, xin)
        record = (where, xin.count, dtype_name(xin.dtype), *extra)
    except (ValueError, TypeError, ShmemError) as exc:  # also closed buffers
        error = exc
    comm.check(where, record, error)
    assert xin is not None and dst is not None
    return xin, ret, dst


def exchange(
    comm: Communicator,
    where: str,
    xin: Operand,
    dst: np.ndarray[Any, Any],
    read: Callable[[int, np.ndarray[Any, Any], np.ndarray[Any, Any]], None],
    peers: list[int] | None = None,
) -> None:
    """One node-local round: publish my input, ``read(rank, input_of_rank, tmp_or_dst)`` for
    each rank in ``peers`` (default: every local rank, in rank order), then DONE.

    When ``dst`` overlaps my zero-copy input, reads go to a temporary copied into ``dst`` once
    every peer has finished reading my input.
    """
    s = comm._next_call()
    staged = xin.shmem is None
    comm._wait_peers(DONE, s - 1, where)
    comm.publish(s, xin, xin.count * xin.dtype.itemsize)
    readers = comm.local_peers if peers is None else peers
    comm._wait_peers(READY, s, where, readers)
    aside = (not staged) and np.may_share_memory(dst, xin.array)
    target = np.empty_like(dst) if aside else dst
    for r in readers:
        read(r, comm.peer_input(r, xin.count, xin.dtype), target)
    comm._post(DONE, s)
    if not staged:  # the caller owns x again once every peer has read it
        comm._wait_peers(DONE, s, where)
        if aside:
            np.copyto(dst, target)
