"""Strided RMA to a rank off the node: one MPI operation with a vector datatype, or, where the
MPI library leaks on those, one contiguous operation per block.

Open MPI 5.0.11's ``osc/rdma`` (the component a ``Win_create`` window gets) keeps memory that a
``Put``, ``Get``, ``Rput`` or ``Accumulate`` with a non-contiguous target datatype allocates,
and memory for contiguous operations when more than a few hundred are outstanding: 2.9 MiB
per put of 8192 blocks with a vector type, 1.1 MiB for 8192 one-block puts under one
``Flush`` (the soak across simulated nodes grew by 2.4 GiB in five minutes and the kernel
killed it). With a ``Flush`` after every 128 one-block operations it keeps about 8 KiB per
8192 (measured: 2 ranks, 1000 calls), at 11 ms per 8192 blocks against 4 ms for the vector.
So there the blocks of a put go one by one, flushed every 128; a get reads the whole span
contiguously where it is at most a few times the data (one operation), else block by block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["BATCH", "SPAN_FACTOR", "get_blocks", "put_blocks", "vector_leaks", "vector_type"]

BATCH = 128  # one-block operations between flushes
SPAN_FACTOR = 8  # a strided get reads its whole span when it is at most this times the data


def vector_leaks() -> bool:
    """Whether this MPI leaks on vector-datatype RMA (Open MPI; MPICH does not)."""
    return MPI.get_vendor()[0] != "MPICH"


def vector_type(itemsize: int, block: int, nblocks: int, stride: int) -> MPI.Datatype:
    """``nblocks`` blocks of ``block`` elements, block starts ``stride`` elements apart."""
    return MPI.BYTE.Create_vector(nblocks, block * itemsize, stride * itemsize).Commit()


def put_blocks(
    win: MPI.Win, rank: int, disp: int, src: np.ndarray[Any, Any], block: int, nblocks: int,
    stride: int,
) -> None:  # fmt: skip
    """The contiguous ``src`` as ``nblocks`` blocks of ``block`` elements, ``stride`` apart,
    at byte ``disp`` of ``rank``'s window: a ``Put`` per block, a ``Flush`` every
    :data:`BATCH` and at the end."""
    data, step = src.reshape(-1).view(np.uint8), block * src.dtype.itemsize
    for b in range(nblocks):
        at = disp + b * stride * src.dtype.itemsize
        win.Put([data[b * step : (b + 1) * step], MPI.BYTE], rank, (at, step, MPI.BYTE))
        if b % BATCH == BATCH - 1:
            win.Flush(rank)
    win.Flush(rank)


def get_blocks(
    win: MPI.Win, rank: int, disp: int, dst: np.ndarray[Any, Any], block: int, nblocks: int,
    stride: int,
) -> None:  # fmt: skip
    """Read what :func:`put_blocks` writes into the contiguous ``dst``: the whole span in
    one contiguous ``Get`` when it is at most :data:`SPAN_FACTOR` times the data (reading
    the bytes between the blocks changes nothing), else a ``Get`` per block, a ``Flush``
    every :data:`BATCH` and at the end."""
    isz = dst.dtype.itemsize
    span = ((nblocks - 1) * stride + block) * isz if nblocks else 0
    if span <= SPAN_FACTOR * max(dst.nbytes, 1):
        tmp = np.empty(span, np.uint8)
        win.Get([tmp, MPI.BYTE], rank, (disp, span, MPI.BYTE))
        win.Flush(rank)
        rows = np.lib.stride_tricks.as_strided(
            tmp, (nblocks, block * isz), (stride * isz, 1), writeable=False
        )
        dst.reshape(-1).view(np.uint8).reshape(nblocks, block * isz)[...] = rows
        return
    data, step = dst.reshape(-1).view(np.uint8), block * isz
    for b in range(nblocks):
        at = disp + b * stride * dst.dtype.itemsize
        win.Get([data[b * step : (b + 1) * step], MPI.BYTE], rank, (at, step, MPI.BYTE))
        if b % BATCH == BATCH - 1:
            win.Flush(rank)
    win.Flush(rank)
