"""Strided transfers of a communication context (``shmem_ctx_iput``, ``iget``, ``ibput``,
``ibget``): blocks of elements a stride apart, moved as peer stores through a strided view on
the node and as one ``Put``/``Rget`` with an MPI vector datatype off it (the heap's
``put_strided``/``get_strided``). Complete on return."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import dtype_name
from .errors import ArgumentError

if TYPE_CHECKING:
    from .backends.host import HostHeap
    from .buffer import SHMEMBuffer

__all__ = ["StridedMethods"]


class StridedMethods:
    """Mixed into :class:`~shmem.rma.Context` (see the module docstring)."""

    if TYPE_CHECKING:

        def _heap(self, where: str) -> HostHeap: ...
        def world_rank(self, rank: int, where: str, buf: SHMEMBuffer | None = None) -> int: ...

    def ibput(
        self,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        *,
        block: int = 1,
        stride: int = 1,
        src_stride: int | None = None,
        nblocks: int | None = None,
        index: int = 0,
    ) -> None:
        """Write ``nblocks`` blocks of ``block`` elements of ``src`` (flat; block starts
        ``src_stride`` elements apart, default ``block``) into ``rank``'s copy of ``buf`` from
        flat element ``index``, block starts ``stride`` apart (``shmem_ibput``; ``block=1``
        is ``shmem_iput``). Complete on return."""
        self._strided_put("ibput", buf, rank, src, block, stride, src_stride, nblocks, index)

    def iput(
        self,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        *,
        stride: int = 1,
        src_stride: int = 1,
        count: int | None = None,
        index: int = 0,
    ) -> None:
        """``shmem_ctx_iput``: :meth:`SHMEMBuffer.iput` with a rank of this context's team."""
        self._strided_put("iput", buf, rank, src, 1, stride, src_stride, count, index)

    def iget(
        self,
        buf: SHMEMBuffer,
        rank: int,
        count: int,
        *,
        stride: int = 1,
        index: int = 0,
        dst: np.ndarray[Any, Any] | None = None,
        dst_stride: int = 1,
    ) -> np.ndarray[Any, Any]:
        """``shmem_ctx_iget``: :meth:`SHMEMBuffer.iget` with a rank of this context's team."""
        return self._strided_get("iget", buf, rank, 1, stride, count, index, dst, dst_stride)

    def _strided_put(
        self,
        where: str,
        buf: SHMEMBuffer,
        rank: int,
        src: Any,
        block: int,
        stride: int,
        src_stride: int | None,
        nblocks: int | None,
        index: int,
    ) -> None:
        """:meth:`ibput`, its errors naming ``where`` (``ibput`` or ``iput``)."""
        heap = self._heap(where)
        target = self.world_rank(rank, where, buf)
        buf._live(where)
        flat = buf._as_source(where, src).reshape(-1)
        sst = block if src_stride is None else src_stride
        n = _strided_count(f"Context.{where}", flat.size, block, sst, nblocks, "src_stride")
        _check_strided(f"Context.{where}", buf, index, block, n, stride)
        from .backends.host import strided_view

        data = np.ascontiguousarray(strided_view(flat, block, n, sst)) if n else flat[:0]
        heap.put_strided(target, buf.offset + index * buf.dtype.itemsize, data, block, n, stride)

    def ibget(
        self,
        buf: SHMEMBuffer,
        rank: int,
        *,
        block: int = 1,
        stride: int = 1,
        nblocks: int,
        index: int = 0,
        dst: np.ndarray[Any, Any] | None = None,
        dst_stride: int | None = None,
    ) -> np.ndarray[Any, Any]:
        """Read ``nblocks`` blocks of ``block`` elements of ``rank``'s copy of ``buf`` (from flat
        element ``index``, starts ``stride`` apart) into ``dst`` (flat, starts ``dst_stride``
        apart, default ``block``), or into a new contiguous array (``shmem_ibget``;
        ``block=1`` is ``shmem_iget``). Returns the array."""
        return self._strided_get("ibget", buf, rank, block, stride, nblocks, index, dst, dst_stride)

    def _strided_get(
        self,
        where: str,
        buf: SHMEMBuffer,
        rank: int,
        block: int,
        stride: int,
        nblocks: int,
        index: int,
        dst: np.ndarray[Any, Any] | None,
        dst_stride: int | None,
    ) -> np.ndarray[Any, Any]:
        """:meth:`ibget`, its errors naming ``where`` (``ibget`` or ``iget``)."""
        heap = self._heap(where)
        target = self.world_rank(rank, where, buf)
        buf._live(where)
        n = _strided_count(f"Context.{where}", None, block, block, nblocks)
        _check_strided(f"Context.{where}", buf, index, block, n, stride)
        data = np.empty(n * block, dtype=buf.dtype)
        heap.get_strided(target, buf.offset + index * buf.dtype.itemsize, data, block, n, stride)
        if dst is None:
            return data
        dst_flat = _strided_destination(dst, buf.dtype, f"Context.{where}")
        dst_st = block if dst_stride is None else dst_stride
        _strided_count(f"Context.{where}", dst_flat.size, block, dst_st, n, "dst_stride")
        if n:
            from .backends.host import strided_view

            strided_view(dst_flat, block, n, dst_st)[...] = data.reshape(n, block)
        return dst


def _positive(where: str, name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ArgumentError(
            f"{where}: invalid {name} (got {value!r}; expected an integer >= {minimum})"
        )
    return int(value)


def _strided_count(
    where: str,
    size: int | None,
    block: int,
    stride: int,
    nblocks: int | None,
    stride_name: str = "stride",
) -> int:
    """Blocks to move: ``nblocks``, or as many as a flat array of ``size`` holds (whose block
    starts are ``stride`` apart: the argument ``stride_name``)."""
    block = _positive(where, "block", block)
    stride = _positive(where, stride_name, stride)
    if stride < block:
        raise ArgumentError(
            f"{where}: blocks overlap (got {stride_name} {stride} < block {block}; expected "
            f"{stride_name} >= block)"
        )
    if nblocks is None:
        if size is None:
            raise ArgumentError(f"{where}: nblocks is required")
        return 0 if size < block else (size - block) // stride + 1
    n = _positive(f"{where}", "nblocks", nblocks, 0)
    if size is not None and n and (n - 1) * stride + block > size:
        raise ArgumentError(
            f"{where}: the local array is too small (got {size} elements; expected at least "
            f"{(n - 1) * stride + block} for {n} blocks of {block}, {stride} apart)"
        )
    return n


def _check_strided(
    where: str, buf: SHMEMBuffer, index: int, block: int, nblocks: int, stride: int
) -> None:
    _positive(where, "index", index, 0)
    stride = _positive(where, "stride", stride)
    if stride < block:
        raise ArgumentError(
            f"{where}: blocks overlap (got stride {stride} < block {block}; expected stride >= "
            "block)"
        )
    if nblocks and index + (nblocks - 1) * stride + block > buf.count:
        raise ArgumentError(
            f"{where}: out of bounds (got {nblocks} blocks of {block} from index {index}, "
            f"{stride} apart, reaching element {index + (nblocks - 1) * stride + block - 1}; "
            f"expected < {buf.count})"
        )


def _strided_destination(
    dst: object, dtype: np.dtype[Any], where: str = "ibget"
) -> np.ndarray[Any, Any]:
    if (
        not isinstance(dst, np.ndarray)
        or dst.dtype != dtype
        or not dst.flags.c_contiguous
        or not dst.flags.writeable
    ):
        raise ArgumentError(
            f"{where}: invalid dst (got {type(dst).__name__}; expected a writeable C-contiguous "
            f"{dtype_name(dtype)} numpy array)"
        )
    return dst.reshape(-1)
