"""The host heap's atomics (:class:`~shmem.backends.host.HostHeap`): fetch-and-op, compare-and-
swap and the float fetch/set, through one window so that MPI keeps them atomic with each other
(the shared window on one node, served by the origin alone or by the CPU's own atomics;
the world window across nodes, request-based and bounded by the deadline). Bitwise and/or/xor
run as compare-and-swap loops where the MPI library's accumulate does not keep them atomic."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from mpi4py import MPI

from ..errors import ArgumentError, RemoteTimeoutError
from ..heap import ATOMIC_DTYPES, FLOAT_ATOMIC_DTYPES

__all__ = ["HostAtomics"]

_MPI_ATOMIC_TYPES = {
    np.dtype(np.int32): MPI.INT32_T,
    np.dtype(np.int64): MPI.INT64_T,
    np.dtype(np.uint32): MPI.UINT32_T,
    np.dtype(np.uint64): MPI.UINT64_T,
    np.dtype(np.float32): MPI.FLOAT,  # fetch, set and swap only (OpenSHMEM's float AMOs)
    np.dtype(np.float64): MPI.DOUBLE,
}
_BITWISE: dict[str, Callable[[int, int], int]] = {
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
}
_MPI_OPS = {
    "add": MPI.SUM,
    "set": MPI.REPLACE,
    "fetch": MPI.NO_OP,
    "and": MPI.BAND,
    "or": MPI.BOR,
    "xor": MPI.BXOR,
}


def _check_atomic_dtype(where: str, dtype: np.dtype[Any], op: str = "add") -> None:
    if dtype in ATOMIC_DTYPES or (dtype in FLOAT_ATOMIC_DTYPES and op in ("fetch", "set")):
        return
    raise ArgumentError(
        f"{where}: unsupported dtype for {op!r} (got {dtype}; expected int32, int64, uint32 or "
        "uint64, or float32/float64 for fetch and set)"
    )


class HostAtomics:
    """Mixed into :class:`~shmem.backends.host.HostHeap` (see the module docstring)."""

    if TYPE_CHECKING:
        rank: int
        timeout_s: float
        _rma_win: MPI.Win | None
        _shm_win: MPI.Win
        _local_of: list[int]
        _pads: list[int]
        _rma_base: list[int]
        _bitwise_by_cas: bool
        _shm_rma: frozenset[int]
        _atomic_arrays: dict[np.dtype[Any], tuple[Any, Any, Any, Any, Any]]
        _cpu: Any
        _bases: list[int]

        def _remote_window(self) -> MPI.Win: ...
        def wait_started(self, req: Any, rank: int, what: str, timeout_s: float | None) -> None: ...
        def progress(self) -> None: ...

    def _atomic_target(self, rank: int, offset: int) -> tuple[MPI.Win, int, int]:
        """``(window, target rank in it, displacement of heap byte offset)``."""
        if self._rma_win is None:
            lr = self._local_of[rank]
            return self._shm_win, lr, self._pads[lr] + offset
        return self._remote_window(), rank, self._rma_base[rank] + offset

    def atomic_fetch_op(
        self,
        rank: int,
        offset: int,
        value: int,
        dtype: np.dtype[Any],
        op: str,
        timeout_s: float | None = None,
    ) -> int:
        """Atomically apply ``op`` and return the old value. On the world window the
        operation is request-based (``Rget_accumulate``: the request completes only once the
        target applied it) and polled against the deadline, so a peer that makes no MPI
        progress raises :class:`RemoteTimeoutError` instead of blocking."""
        win = self._rma_win
        if self._bitwise_by_cas and op in _BITWISE:
            return self._bitwise_cas(rank, offset, value, dtype, op, timeout_s)
        requests = win is not None and rank not in self._shm_rma  # (see _rget)
        if not requests or dtype not in _MPI_ATOMIC_TYPES or dtype.kind == "f":
            req, result = self.atomic_fetch_op_nbi(rank, offset, value, dtype, op)
            if req is None or req.Test():  # most complete at once: no clock, no poll loop
                return int(result[0])
        else:
            # the world window (request-based: it completes once applied at the target),
            # with reused origin/result arrays (two allocations cost as much as the MPI call)
            arrays = self._atomic_arrays.pop(dtype, None)
            if arrays is None:
                mpi_t = _MPI_ATOMIC_TYPES[dtype]
                origin, result = np.empty(1, dtype), np.empty(1, dtype)
                arrays = (origin, result, [origin, mpi_t], [result, mpi_t], mpi_t)
            arrays[0][0] = value
            result = arrays[1]
            req = cast("MPI.Win", win).Rget_accumulate(
                arrays[2],
                arrays[3],
                rank,
                (self._rma_base[rank] + offset, 1, arrays[4]),
                _MPI_OPS[op],
            )
            if req.Test():
                self._atomic_arrays[dtype] = arrays
                return int(result.item())
        self.wait_started(req, rank, "atomic_fetch_op", timeout_s)
        return int(result[0])

    def atomic_fetch_op_nbi(
        self, rank: int, offset: int, value: float, dtype: np.dtype[Any], op: str
    ) -> tuple[MPI.Request | None, np.ndarray[Any, Any]]:
        """Start an atomic ``op`` (any atomic dtype; float32/float64 for fetch and set):
        ``(request, result)``. The shared window serves it at once (request None); on the
        world window ``result[0]`` holds the old value once the request completes."""
        if dtype not in _MPI_ATOMIC_TYPES or (dtype.kind == "f" and op not in ("fetch", "set")):
            _check_atomic_dtype("atomic_fetch_op", dtype, op)
        mpi_t = _MPI_ATOMIC_TYPES[dtype]
        origin = np.array([value], dtype=dtype)
        result = np.empty(1, dtype=dtype)
        win = self._rma_win
        if win is None:  # one node: served by the origin alone, cannot block
            if self._cpu is not None:
                address = self._bases[self._local_of[rank]] + offset
                result[0] = self._cpu.fetch_op(address, value, dtype, op)
                return None, result
            win, target, offset = self._atomic_target(rank, offset)
            win.Fetch_and_op([origin, mpi_t], [result, mpi_t], target, offset, _MPI_OPS[op])
            win.Flush(target)
            return None, result
        if self._bitwise_by_cas and op in _BITWISE:  # complete at once (allowed for *_nbi)
            result[0] = self._bitwise_cas(rank, offset, int(value), dtype, op)
            return None, result
        if rank in self._shm_rma:  # complete now, no request (see _rget)
            disp = self._rma_base[rank] + offset
            win.Fetch_and_op([origin, mpi_t], [result, mpi_t], rank, disp, _MPI_OPS[op])
            win.Flush(rank)
            return None, result
        # request-based (completes once applied at the target), so callers bound it by the
        # deadline; the wait loops serve peers' operations aimed at this rank (progress)
        req = win.Rget_accumulate(
            [origin, mpi_t],
            [result, mpi_t],
            rank,
            (self._rma_base[rank] + offset, 1, mpi_t),
            _MPI_OPS[op],
        )
        return req, result

    def _bitwise_cas(
        self,
        rank: int,
        offset: int,
        value: int,
        dtype: np.dtype[Any],
        op: str,
        timeout_s: float | None = None,
    ) -> int:
        """``op`` (and, or, xor) on the world window as a compare-and-swap loop: read, then
        swap in ``old op value`` until no other rank changed the word in between. Returns the
        old value; bounded by the deadline (each compare-and-swap completes, with the TCP
        transport's progress thread, while the target computes)."""
        win = cast("MPI.Win", self._rma_win)
        disp = self._rma_base[rank] + offset
        mpi_t = _MPI_ATOMIC_TYPES[dtype]
        old = np.empty(1, dtype)
        win.Fetch_and_op([np.zeros(1, dtype), mpi_t], [old, mpi_t], rank, disp, MPI.NO_OP)
        win.Flush(rank)
        combine = _BITWISE[op]
        mask = (1 << (8 * dtype.itemsize)) - 1
        unsigned = np.dtype(f"u{dtype.itemsize}")
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        seen = np.empty(1, dtype)
        while True:
            want = combine(int(old[0]) & mask, int(value) & mask)
            new = np.array([want], unsigned).view(dtype)  # the bits, in the word's dtype
            win.Compare_and_swap([new, mpi_t], [old, mpi_t], [seen, mpi_t], rank, disp)
            win.Flush(rank)
            if seen[0] == old[0]:
                return int(seen[0])
            if time.monotonic() > deadline:
                raise RemoteTimeoutError(
                    f"atomic {op}: rank {self.rank}: the word on rank {rank} kept changing for "
                    f"{limit:g} s (compare-and-swap never succeeded)",
                    peer=rank,
                )
            old[0] = seen[0]

    def atomic_value(
        self, rank: int, offset: int, value: float, dtype: np.dtype[Any], op: str
    ) -> float:
        """:meth:`atomic_fetch_op` for float32/float64 (``"fetch"`` or ``"set"``): the old
        value as a Python float, within the deadline."""
        req, result = self.atomic_fetch_op_nbi(rank, offset, value, dtype, op)
        if req is not None:
            self.wait_started(req, rank, "atomic", None)
        return float(result[0])

    def atomic_compare_swap(
        self, rank: int, offset: int, compare: int, value: int, dtype: np.dtype[Any]
    ) -> int:
        _check_atomic_dtype("atomic_compare_swap", dtype)
        if self._cpu is not None:
            address = self._bases[self._local_of[rank]] + offset
            return int(self._cpu.compare_swap(address, compare, value, dtype))
        win, target, offset = self._atomic_target(rank, offset)
        self.progress()
        origin = np.array([value], dtype=dtype)
        cmp = np.array([compare], dtype=dtype)
        result = np.empty(1, dtype=dtype)
        mpi_t = _MPI_ATOMIC_TYPES[dtype]
        win.Compare_and_swap([origin, mpi_t], [cmp, mpi_t], [result, mpi_t], target, offset)
        win.Flush(target)
        return int(result[0])

    @property
    def atomics_need_progress(self) -> bool:
        """True when atomics aimed at this rank are served by its MPI progress engine."""
        return self._rma_win is not None
