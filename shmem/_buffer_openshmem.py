"""The OpenSHMEM routines of :class:`~shmem.SHMEMBuffer` beyond put and get: atomics, single
elements (``p``, ``g``), non-blocking and strided RMA, put-with-signal on a symmetric signal
word, point-to-point waits and tests, and locks. Each is a thin method over :mod:`shmem.rma`
and :mod:`shmem.sync` (the atomics over the heap's); ``ctx`` picks the communication context
(default: the World's, ``SHMEM_CTX_DEFAULT``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from . import sync
from .dtypes import Casting, dtype_name, float_operand, int_operand
from .errors import ArgumentError
from .heap import ATOMIC_DTYPES, FLOAT_ATOMIC_DTYPES
from .rma import AtomicOp, Context, Fetched, host_heap, signal_offset
from .signals import Cmp

if TYPE_CHECKING:
    from .world import World

__all__ = ["OpenShmemMethods"]


class OpenShmemMethods:
    """Mixed into :class:`~shmem.SHMEMBuffer` (see the module docstring)."""

    if TYPE_CHECKING:
        _world: World
        _dtype: np.dtype[Any]
        _count: int
        _offset: int

        def _live(self, where: str) -> None: ...
        def _check_rank(self, where: str, rank: int) -> int: ...
        def put(self, rank: int, src: Any, offset: int = 0) -> None: ...
        def get(self, rank: int, dst: Any = None, offset: int = 0) -> Any: ...

    def _ctx(self, ctx: Context | None) -> Context:
        if ctx is None:
            return self._world.default_context
        if not isinstance(ctx, Context):
            raise ArgumentError(
                f"SHMEMBuffer: invalid ctx (got {ctx!r} of type {type(ctx).__name__}; expected "
                "a Context from World.create_context or Team.create_ctx, or None)"
            )
        return ctx

    def _me(self) -> Any:
        return self

    # -- non-blocking RMA -------------------------------------------------------------------

    def put_nbi(
        self,
        rank: int,
        src: Any,
        offset: int = 0,
        *,
        casting: Casting = "same_kind",
        ctx: Context | None = None,
    ) -> None:
        """Start writing ``src`` into ``rank``'s copy at byte ``offset``
        (``shmem_put_nbi``); complete after ``quiet()`` (``world.quiet()`` or ``ctx.quiet()``).
        ``src`` must not change until then.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        src : array-like
            The data, at most the buffer's bytes from ``offset``.
        offset : int, optional
            Byte offset into ``rank``'s copy (a multiple of the item size).
        casting : {"no", "equiv", "safe", "same_kind", "unsafe"}, optional
            How a source of another dtype may be cast (numpy's rules; ``"same_kind"`` refuses values
            the buffer's dtype cannot hold).
        ctx : Context, optional
            The communication context (default: the World's).

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank or offset, a source that does not fit, or a cast ``casting``
            refuses.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        self._ctx(ctx).put_nbi(self._me(), rank, src, offset, casting=casting)

    def get_nbi(
        self,
        rank: int,
        dst: np.ndarray[Any, Any],
        offset: int = 0,
        *,
        ctx: Context | None = None,
    ) -> np.ndarray[Any, Any]:
        """Start reading ``rank``'s copy from byte ``offset`` into ``dst``
        (``shmem_get_nbi``); ``dst`` holds the data after ``quiet()``. Returns ``dst``.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        dst : numpy.ndarray
            Where to read into (writeable, C-contiguous, this dtype; ``dst.nbytes`` bytes are read).
        offset : int, optional
            Byte offset into ``rank``'s copy.
        ctx : Context, optional
            The communication context (default: the World's).

        Returns
        -------
        numpy.ndarray
            ``dst``, holding the data after ``quiet()``.

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank or offset, or a ``dst`` of another dtype, not contiguous or
            writeable, or larger than the bytes from ``offset``.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        return self._ctx(ctx).get_nbi(self._me(), rank, dst, offset)

    def put_signal(
        self,
        rank: int,
        src: Any,
        sig: Any,
        value: int,
        op: str = "set",
        *,
        sig_index: int = 0,
        offset: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """Write ``src`` into ``rank``'s copy, then set or add ``value`` to ``rank``'s signal
        word ``sig[sig_index]`` (any uint64 SHMEMBuffer; ``shmem_put_signal``). A rank that
        sees the signal (``sig.signal_wait_until``) sees the data.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        src : array-like
            The data (cast ``"same_kind"``), at most the buffer's bytes from ``offset``.
        sig : SHMEMBuffer
            The signal buffer (uint64).
        value : int
            The signal operand (uint64 range).
        op : {"set", "add"}, optional
            How ``value`` updates the signal word.
        sig_index : int, optional
            The signal word's element in ``sig``.
        offset : int, optional
            Byte offset into ``rank``'s copy.
        ctx : Context, optional
            The communication context (default: the World's).

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, offset, ``op`` or signal value, a ``sig`` that is not a uint64
            SHMEMBuffer or a ``sig_index`` out of its range, or a source that does not fit or cast.
        ShmemStateError
            This buffer, ``sig`` or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World
            finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        RemoteTimeoutError
            The signal update did not complete within ``[signal] timeout_s`` (``rank`` made no MPI
            progress).
        """
        self._ctx(ctx).put_signal(
            self._me(), rank, src, sig, value, op, sig_index=sig_index, offset=offset
        )

    def put_signal_nbi(
        self,
        rank: int,
        src: Any,
        sig: Any,
        value: int,
        op: str = "set",
        *,
        sig_index: int = 0,
        offset: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """:meth:`put_signal`, non-blocking (``shmem_put_signal_nbi``): complete after
        ``quiet()``; the signal never arrives before the data.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        src : array-like
            The data (cast ``"same_kind"``), at most the buffer's bytes from ``offset``.
        sig : SHMEMBuffer
            The signal buffer (uint64).
        value : int
            The signal operand (uint64 range).
        op : {"set", "add"}, optional
            How ``value`` updates the signal word.
        sig_index : int, optional
            The signal word's element in ``sig``.
        offset : int, optional
            Byte offset into ``rank``'s copy.
        ctx : Context, optional
            The communication context (default: the World's).

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, offset, ``op`` or signal value, a ``sig`` that is not a uint64
            SHMEMBuffer or a ``sig_index`` out of its range, or a source that does not fit or cast.
        ShmemStateError
            This buffer, ``sig`` or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World
            finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        RemoteTimeoutError
            A signal sent at once (its data already complete) did not complete within ``[signal]
            timeout_s``; a deferred one is delivered, and can time out, at ``quiet()``.
        """
        self._ctx(ctx).put_signal_nbi(
            self._me(), rank, src, sig, value, op, sig_index=sig_index, offset=offset
        )

    # -- strided RMA ------------------------------------------------------------------------

    def iput(
        self,
        rank: int,
        src: Any,
        *,
        stride: int = 1,
        src_stride: int = 1,
        count: int | None = None,
        index: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """Write ``src[::src_stride]`` (``count`` elements, default all) to elements
        ``index, index + stride, ...`` of ``rank``'s copy (``shmem_iput``, on ``ctx``:
        ``shmem_ctx_iput``).

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        src : array-like
            The data, flat (cast ``"same_kind"``).
        stride : int, optional
            Elements between the targets in ``rank``'s copy (>= 1).
        src_stride : int, optional
            Elements between the elements read from ``src`` (>= 1).
        count : int, optional
            Elements to write (default: as many as ``src[::src_stride]`` holds).
        index : int, optional
            The first target element (flat).
        ctx : Context, optional
            The communication context (default: the World's).

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, stride, ``count`` or ``index``, a source that does not cast or
            is too small, or targets past the buffer's end.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        self._ctx(ctx)._strided_put(
            "iput", self._me(), rank, src, 1, stride, src_stride, count, index
        )

    def iget(
        self,
        rank: int,
        count: int,
        *,
        stride: int = 1,
        index: int = 0,
        dst: np.ndarray[Any, Any] | None = None,
        dst_stride: int = 1,
        ctx: Context | None = None,
    ) -> np.ndarray[Any, Any]:
        """Read elements ``index, index + stride, ...`` (``count`` of them) of ``rank``'s
        copy into ``dst[::dst_stride]`` or a new array (``shmem_iget``, on ``ctx``:
        ``shmem_ctx_iget``); returns it.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        count : int
            Elements to read (>= 0).
        stride : int, optional
            Elements between the sources in ``rank``'s copy (>= 1).
        index : int, optional
            The first source element (flat).
        dst : numpy.ndarray, optional
            Where to write (writeable, C-contiguous, this dtype), else a new array.
        dst_stride : int, optional
            Elements between the elements written in ``dst`` (>= 1).
        ctx : Context, optional
            The communication context (default: the World's).

        Returns
        -------
        numpy.ndarray
            ``dst``, or the new array of ``count`` elements.

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, ``count``, stride or ``index``, sources past the buffer's end,
            or a ``dst`` of another dtype, not contiguous or writeable, or too small.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        RemoteTimeoutError
            An off-node read did not complete within the deadline (``rank`` made no MPI progress).
        """
        return self._ctx(ctx)._strided_get(
            "iget", self._me(), rank, 1, stride, count, index, dst, dst_stride
        )

    def ibput(
        self,
        rank: int,
        src: Any,
        *,
        block: int,
        stride: int,
        src_stride: int | None = None,
        nblocks: int | None = None,
        index: int = 0,
        ctx: Context | None = None,
    ) -> None:
        """Block-strided put (``shmem_ibput``): ``nblocks`` blocks of ``block`` elements,
        starts ``src_stride`` apart in ``src`` and ``stride`` apart in ``rank``'s copy.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        src : array-like
            The data, flat (cast ``"same_kind"``).
        block : int
            Elements per block (>= 1).
        stride : int
            Elements between block starts in ``rank``'s copy (>= ``block``).
        src_stride : int, optional
            Elements between block starts in ``src`` (>= ``block``; default ``block``).
        nblocks : int, optional
            Blocks to write (default: as many as ``src`` holds).
        index : int, optional
            The first target element (flat).
        ctx : Context, optional
            The communication context (default: the World's).

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, ``block``, stride, ``nblocks`` or ``index``, overlapping
            blocks, a source that does not cast or is too small, or targets past the buffer's end.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        self._ctx(ctx).ibput(
            self._me(),
            rank,
            src,
            block=block,
            stride=stride,
            src_stride=src_stride,
            nblocks=nblocks,
            index=index,
        )

    def ibget(
        self,
        rank: int,
        nblocks: int,
        *,
        block: int,
        stride: int,
        index: int = 0,
        dst: np.ndarray[Any, Any] | None = None,
        dst_stride: int | None = None,
        ctx: Context | None = None,
    ) -> np.ndarray[Any, Any]:
        """Block-strided get (``shmem_ibget``), the converse of :meth:`ibput`.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        nblocks : int
            Blocks to read (>= 0).
        block : int
            Elements per block (>= 1).
        stride : int
            Elements between block starts in ``rank``'s copy (>= ``block``).
        index : int, optional
            The first source element (flat).
        dst : numpy.ndarray, optional
            Where to write (writeable, C-contiguous, this dtype), else a new contiguous array.
        dst_stride : int, optional
            Elements between block starts in ``dst`` (>= ``block``; default ``block``).
        ctx : Context, optional
            The communication context (default: the World's).

        Returns
        -------
        numpy.ndarray
            ``dst``, or the new array of ``nblocks * block`` elements.

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, ``block``, stride, ``nblocks`` or ``index``, overlapping
            blocks, sources past the buffer's end, or a ``dst`` of another dtype, not contiguous
            or writeable, or too small.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        RemoteTimeoutError
            An off-node read did not complete within the deadline (``rank`` made no MPI progress).
        """
        return self._ctx(ctx).ibget(
            self._me(),
            rank,
            block=block,
            stride=stride,
            nblocks=nblocks,
            index=index,
            dst=dst,
            dst_stride=dst_stride,
        )

    # -- atomics ----------------------------------------------------------------------------

    def _atomic_offset(self, where: str, index: int, float_ok: bool = False) -> int:
        """Heap byte offset of element ``index`` for an atomic (dtype and index checked)."""
        self._live(where)
        if self._dtype not in ATOMIC_DTYPES and not (
            float_ok and self._dtype in FLOAT_ATOMIC_DTYPES
        ):
            floats = ", or float32/float64" if float_ok else ""
            raise ArgumentError(
                f"SHMEMBuffer.{where}: atomics need an integer buffer (got "
                f"{dtype_name(self._dtype)}; expected int32, int64, uint32 or uint64{floats})"
            )
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise ArgumentError(f"SHMEMBuffer.{where}: invalid index (got {index!r})")
        if not 0 <= index < self._count:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: index out of range (got {index}; expected 0 <= index "
                f"< {self._count})"
            )
        return self._offset + int(index) * self._dtype.itemsize

    def _atomic_args(
        self, where: str, rank: int, index: int, float_ok: bool = False
    ) -> tuple[int, int]:
        off = self._atomic_offset(where, index, float_ok)
        return self._check_rank(where, rank), off

    def _float_atomic(self, where: str, rank: int, index: int, op: str, value: object) -> float:
        """fetch/set/swap on a float32/float64 buffer (host backend)."""
        rank, off = self._atomic_args(where, rank, index, float_ok=True)
        v = float_operand(f"SHMEMBuffer.{where}", "value", value, self._dtype)
        heap = host_heap(self._world, f"SHMEMBuffer.{where}")
        return heap.atomic_value(rank, off, v, self._dtype, op)

    def atomic_fetch_add(self, rank: int, index: int, value: int) -> int:
        """Atomically add ``value`` to element ``index`` (flat) of ``rank``'s copy; return
        the old value.

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.

        Returns
        -------
        int
            The element's value before the add.
        """
        rank, off = self._atomic_args("atomic_fetch_add", rank, index)
        v = int_operand(
            "SHMEMBuffer.atomic_fetch_add", "value", value, self._dtype, wrap_negative=True
        )
        return self._world.heap.atomic_fetch_op(rank, off, v, self._dtype, "add")

    @overload
    def atomic_swap(self, rank: int, index: int, value: int) -> int: ...
    @overload
    def atomic_swap(self, rank: int, index: int, value: float) -> int | float: ...
    def atomic_swap(self, rank: int, index: int, value: float) -> int | float:
        """Atomically store ``value`` in element ``index`` of ``rank``'s copy; return the old
        (integer dtypes, and float32/float64 as OpenSHMEM's ``shmem_atomic_swap``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int or float
            The value stored.

        Returns
        -------
        int or float
            The element's value before the swap.
        """
        if self._dtype in FLOAT_ATOMIC_DTYPES:
            return self._float_atomic("atomic_swap", rank, index, "set", value)
        rank, off = self._atomic_args("atomic_swap", rank, index)
        v = int_operand("SHMEMBuffer.atomic_swap", "value", value, self._dtype)
        return self._world.heap.atomic_fetch_op(rank, off, v, self._dtype, "set")

    def atomic_compare_swap(self, rank: int, index: int, compare: int, value: int) -> int:
        """Atomically store ``value`` in element ``index`` of ``rank``'s copy if it equals
        ``compare``; return the old value (equal to ``compare`` when the swap happened).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        compare : int
            The value the element must hold for the swap.
        value : int
            The value stored.

        Returns
        -------
        int
            The element's value before the call.
        """
        rank, off = self._atomic_args("atomic_compare_swap", rank, index)
        where = "SHMEMBuffer.atomic_compare_swap"
        c = int_operand(where, "compare", compare, self._dtype)
        v = int_operand(where, "value", value, self._dtype)
        return self._world.heap.atomic_compare_swap(rank, off, c, v, self._dtype)

    def _atomic_op(self, where: str, rank: int, index: int, op: str, value: object) -> int:
        rank, off = self._atomic_args(where, rank, index)
        v = int_operand(f"SHMEMBuffer.{where}", "value", value, self._dtype, wrap_negative=True)
        return self._world.heap.atomic_fetch_op(rank, off, v, self._dtype, op)

    def atomic_fetch(self, rank: int, index: int) -> Any:
        """Atomically read element ``index`` of ``rank``'s copy (``shmem_atomic_fetch``; an
        int, or a float for float32/float64).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.

        Returns
        -------
        int or float
            The element's value.
        """
        if self._dtype in FLOAT_ATOMIC_DTYPES:
            return self._float_atomic("atomic_fetch", rank, index, "fetch", 0.0)
        rank, off = self._atomic_args("atomic_fetch", rank, index)
        return self._world.heap.atomic_fetch_op(rank, off, 0, self._dtype, "fetch")

    def atomic_set(self, rank: int, index: int, value: float) -> None:
        """Atomically store ``value`` (``shmem_atomic_set``; integer or float32/float64).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int or float
            The value stored.
        """
        self.atomic_swap(rank, index, value)

    def atomic_add(self, rank: int, index: int, value: int) -> None:
        """Atomically add ``value`` (``shmem_atomic_add``; unsigned: negative wraps, as C).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.
        """
        self._atomic_op("atomic_add", rank, index, "add", value)

    def atomic_inc(self, rank: int, index: int) -> None:
        """Atomically add one (``shmem_atomic_inc``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        """
        self._atomic_op("atomic_inc", rank, index, "add", 1)

    def atomic_fetch_inc(self, rank: int, index: int) -> int:
        """Atomically add one; return the old value (``shmem_atomic_fetch_inc``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.

        Returns
        -------
        int
            The element's value before the increment.
        """
        return self._atomic_op("atomic_fetch_inc", rank, index, "add", 1)

    def atomic_fetch_and(self, rank: int, index: int, value: int) -> int:
        """Atomically ``x &= value``; return the old ``x`` (``shmem_atomic_fetch_and``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.

        Returns
        -------
        int
            The element's value before the operation.
        """
        return self._atomic_op("atomic_fetch_and", rank, index, "and", value)

    def atomic_fetch_or(self, rank: int, index: int, value: int) -> int:
        """Atomically ``x |= value``; return the old ``x`` (``shmem_atomic_fetch_or``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.

        Returns
        -------
        int
            The element's value before the operation.
        """
        return self._atomic_op("atomic_fetch_or", rank, index, "or", value)

    def atomic_fetch_xor(self, rank: int, index: int, value: int) -> int:
        """Atomically ``x ^= value``; return the old ``x`` (``shmem_atomic_fetch_xor``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.

        Returns
        -------
        int
            The element's value before the operation.
        """
        return self._atomic_op("atomic_fetch_xor", rank, index, "xor", value)

    def atomic_and(self, rank: int, index: int, value: int) -> None:
        """Atomically ``x &= value`` (``shmem_atomic_and``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.
        """
        self._atomic_op("atomic_and", rank, index, "and", value)

    def atomic_or(self, rank: int, index: int, value: int) -> None:
        """Atomically ``x |= value`` (``shmem_atomic_or``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.
        """
        self._atomic_op("atomic_or", rank, index, "or", value)

    def atomic_xor(self, rank: int, index: int, value: int) -> None:
        """Atomically ``x ^= value`` (``shmem_atomic_xor``).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int
            The operand.
        """
        self._atomic_op("atomic_xor", rank, index, "xor", value)

    # -- single elements --------------------------------------------------------------------

    def p(self, rank: int, index: int, value: complex | bool) -> None:
        """Write one element, ``value``, at flat ``index`` of ``rank``'s copy (``shmem_p``;
        one-sided, host-blocking; lossy casts refused as for :meth:`put`).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.
        value : int or float or complex or bool
            The element's new value.
        """
        self._check_index("p", index)
        if self._dtype.kind in "iu" and isinstance(value, int | np.integer):
            value = int_operand("SHMEMBuffer.p", "value", value, self._dtype)
            src = np.asarray([value], dtype=self._dtype)
        else:
            src = np.asarray([value])
        self.put(rank, src, offset=int(index) * self._dtype.itemsize)

    def g(self, rank: int, index: int) -> Any:
        """Read one element at flat ``index`` of ``rank``'s copy as a Python scalar
        (``shmem_g``; one-sided, host-blocking).

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        index : int
            The element's flat index.

        Returns
        -------
        int or float or complex or bool
            The element's value.
        """
        self._check_index("g", index)
        out = self.get(rank, np.empty(1, self._dtype), offset=int(index) * self._dtype.itemsize)
        return np.asarray(out).reshape(-1)[0].item()

    def _check_index(self, where: str, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise ArgumentError(f"SHMEMBuffer.{where}: invalid index (got {index!r})")
        if not 0 <= index < self._count:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: index out of range (got {index}; expected 0 <= index "
                f"< {self._count})"
            )

    # -- non-blocking atomics ---------------------------------------------------------------

    def atomic_nbi(
        self,
        rank: int,
        index: int,
        op: AtomicOp | str,
        value: float = 0,
        *,
        compare: int | None = None,
        ctx: Context | None = None,
    ) -> Fetched:
        """Start a fetching atomic (``shmem_atomic_fetch_nbi``, ``..._fetch_add_nbi``,
        ``..._swap_nbi``, ``..._compare_swap_nbi``...): ``.value`` of the result after
        ``quiet()``. ``op`` is an :class:`~shmem.rma.AtomicOp`.

        Parameters
        ----------
        rank : int
            The peer, a rank of ``ctx``'s team (the world's by default).
        index : int
            The element of ``rank``'s copy.
        op : AtomicOp or str
            The atomic (``"fetch_add"``, ``"compare_swap"``...; float32/float64 buffers take
            ``"fetch"`` and ``"swap"`` only).
        value : float, optional
            The operand (unused by ``"fetch"`` and ``"fetch_inc"``).
        compare : int, optional
            The expected old value (``"compare_swap"`` only, and required there).
        ctx : Context, optional
            The communication context (default: the World's).

        Returns
        -------
        Fetched
            The old value, as ``.value`` once complete (at once for ``"compare_swap"``).

        Raises
        ------
        ArgumentError
            An invalid ``ctx``, rank, ``op``, ``index`` or operand, a dtype ``op`` does not apply
            to, or ``"compare_swap"`` without ``compare``.
        ShmemStateError
            This buffer or ``ctx`` is closed (or ``ctx``'s team destroyed), or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        return self._ctx(ctx).atomic_nbi(self._me(), rank, index, op, value, compare=compare)

    # -- signals on symmetric words ---------------------------------------------------------

    def signal(self, rank: int, value: int, op: str = "set", *, index: int = 0) -> None:
        """Set or add ``value`` to ``rank``'s signal word ``self[index]`` (a uint64 buffer;
        ``shmem_signal_set`` / ``shmem_signal_add``), after a release fence.

        Parameters
        ----------
        rank : int
            The peer (a world rank).
        value : int
            The operand (uint64 range).
        op : {"set", "add"}, optional
            How ``value`` updates the signal word.
        index : int, optional
            The signal word's element.

        Raises
        ------
        ArgumentError
            An invalid rank, ``value``, ``op`` or ``index``, or a buffer that is not uint64.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        RemoteTimeoutError
            The update did not complete within the deadline (``rank`` made no MPI progress).
        """
        from .dtypes import int_operand
        from .rma import SIGNAL_DTYPE, check_signal_op, signal_word

        heap = host_heap(self._world, "SHMEMBuffer.signal")
        off = signal_offset(self._me(), index, "SHMEMBuffer.signal")
        target = self._world.default_context.world_rank(rank, "signal")
        v = int_operand("SHMEMBuffer.signal", "value", value, SIGNAL_DTYPE)
        signal_word(heap, target, off, v, check_signal_op("SHMEMBuffer.signal", op))

    def signal_fetch(self, index: int = 0) -> int:
        """Atomically read this rank's signal word ``self[index]`` (``shmem_signal_fetch``).

        Parameters
        ----------
        index : int, optional
            The signal word's element.

        Returns
        -------
        int
            The word's value.

        Raises
        ------
        ArgumentError
            An invalid ``index``, or a buffer that is not uint64.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        off = signal_offset(self._me(), index, "SHMEMBuffer.signal_fetch")
        heap = host_heap(self._world, "SHMEMBuffer.signal_fetch")
        return heap.atomic_fetch_op(heap.rank, off, 0, np.dtype(np.uint64), "fetch")

    def signal_wait_until(
        self, cmp: Cmp | str, value: int, *, index: int = 0, timeout: float | None = None
    ) -> int:
        """Wait until this rank's signal word ``self[index]`` compares true against ``value``
        (``shmem_signal_wait_until``); return the value seen.

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int
            The value compared against.
        index : int, optional
            The signal word's element.
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Returns
        -------
        int
            The word's value once the comparison held.

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, ``value``, ``index`` or ``timeout``, or a buffer that is not uint64.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        SignalTimeoutError
            The condition did not hold within the deadline.
        """
        signal_offset(self._me(), index, "SHMEMBuffer.signal_wait_until")
        sync.wait_elements(
            self._me(), "signal_wait_until", "one", cmp, value, [index], None, timeout
        )
        return int(self._me().local().reshape(-1)[index])

    # -- point-to-point synchronisation -----------------------------------------------------

    def wait_until(
        self, cmp: Cmp | str, value: int, *, index: int = 0, timeout: float | None = None
    ) -> int:
        """Wait until element ``index`` of this rank's copy compares true against ``value``
        (``shmem_wait_until``); return the value seen.

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int
            The value compared against (in the buffer's dtype range).
        index : int, optional
            The element watched (flat).
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Returns
        -------
        int
            The element's value once the comparison held.

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, ``value``, ``index`` or ``timeout``, or a buffer of a non-integer
            dtype.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        SignalTimeoutError
            The condition did not hold within the deadline.
        """
        sync.wait_elements(self._me(), "wait_until", "one", cmp, value, [index], None, timeout)
        return int(self._me().local().reshape(-1)[index])

    def wait_until_all(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Wait until every element in ``indices`` (default all) whose ``status`` entry is 0
        compares true (``shmem_wait_until_all``; a sequence ``value`` is the ``_vector``
        form, one value per element).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int or sequence of int
            The value compared against, or one per watched element (the ``_vector`` form).
        indices : sequence of int, optional
            The elements watched (flat; default: all).
        status : sequence of int, optional
            One flag per watched element: nonzero leaves it out.
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, value, index, ``status`` or ``timeout`` (or a ``value`` or
            ``status`` of another length than the watched elements), or a non-integer buffer.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        SignalTimeoutError
            The condition did not hold within the deadline.
        """
        sync.wait_elements(
            self._me(), "wait_until_all", "all", cmp, value, indices, status, timeout
        )

    def wait_until_any(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> int | None:
        """Wait until one element compares true; return its index (the lowest satisfied), or
        None when ``status`` excludes every element (``shmem_wait_until_any[_vector]``).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int or sequence of int
            The value compared against, or one per watched element (the ``_vector`` form).
        indices : sequence of int, optional
            The elements watched (flat; default: all).
        status : sequence of int, optional
            One flag per watched element: nonzero leaves it out.
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Returns
        -------
        int or None
            The lowest satisfied index; None when ``status`` leaves out every element.

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, value, index, ``status`` or ``timeout`` (or a ``value`` or
            ``status`` of another length than the watched elements), or a non-integer buffer.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        SignalTimeoutError
            The condition did not hold within the deadline.
        """
        hits = sync.wait_elements(
            self._me(), "wait_until_any", "any", cmp, value, indices, status, timeout
        )
        return hits[0] if hits else None

    def wait_until_some(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """Wait until at least one element compares true; return every satisfied index
        (``shmem_wait_until_some[_vector]``).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int or sequence of int
            The value compared against, or one per watched element (the ``_vector`` form).
        indices : sequence of int, optional
            The elements watched (flat; default: all).
        status : sequence of int, optional
            One flag per watched element: nonzero leaves it out.
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Returns
        -------
        list of int
            Every satisfied index (``[]`` when ``status`` leaves out every element).

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, value, index, ``status`` or ``timeout`` (or a ``value`` or
            ``status`` of another length than the watched elements), or a non-integer buffer.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        SignalTimeoutError
            The condition did not hold within the deadline.
        """
        return sync.wait_elements(
            self._me(), "wait_until_some", "some", cmp, value, indices, status, timeout
        )

    def test(self, cmp: Cmp | str, value: int, *, index: int = 0) -> bool:
        """Whether element ``index`` compares true now (``shmem_test``; no waiting).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int
            The value compared against (in the buffer's dtype range).
        index : int, optional
            The element tested (flat).

        Returns
        -------
        bool
            Whether the element compares true.

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, ``value`` or ``index``, or a buffer of a non-integer dtype.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        return sync.test_elements(self._me(), "test", "one", cmp, value, [index], None) is not None

    def test_all(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
    ) -> bool:
        """Whether every unmasked element compares true now (``shmem_test_all[_vector]``).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int or sequence of int
            The value compared against, or one per watched element (the ``_vector`` form).
        indices : sequence of int, optional
            The elements watched (flat; default: all).
        status : sequence of int, optional
            One flag per watched element: nonzero leaves it out.

        Returns
        -------
        bool
            Whether every unmasked element compares true (True when none is).

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, value, index or ``status`` (or a ``value`` or ``status`` of another
            length than the watched elements), or a buffer of a non-integer dtype.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        return (
            sync.test_elements(self._me(), "test_all", "all", cmp, value, indices, status)
            is not None
        )

    def test_any(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
    ) -> int | None:
        """The lowest unmasked index comparing true now, else None (``shmem_test_any``).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int or sequence of int
            The value compared against, or one per watched element (the ``_vector`` form).
        indices : sequence of int, optional
            The elements watched (flat; default: all).
        status : sequence of int, optional
            One flag per watched element: nonzero leaves it out.

        Returns
        -------
        int or None
            The lowest unmasked index comparing true, else None.

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, value, index or ``status`` (or a ``value`` or ``status`` of another
            length than the watched elements), or a buffer of a non-integer dtype.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        hits = sync.test_elements(self._me(), "test_any", "any", cmp, value, indices, status)
        return hits[0] if hits else None

    def test_some(
        self,
        cmp: Cmp | str,
        value: int | Sequence[int],
        *,
        indices: Sequence[int] | None = None,
        status: Sequence[int] | None = None,
    ) -> list[int]:
        """Every unmasked index comparing true now (``shmem_test_some[_vector]``; may be []).

        Parameters
        ----------
        cmp : Cmp or str
            The comparison (``Cmp.GE`` or ``"ge"``...).
        value : int or sequence of int
            The value compared against, or one per watched element (the ``_vector`` form).
        indices : sequence of int, optional
            The elements watched (flat; default: all).
        status : sequence of int, optional
            One flag per watched element: nonzero leaves it out.

        Returns
        -------
        list of int
            Every unmasked index comparing true.

        Raises
        ------
        ArgumentError
            An invalid ``cmp``, value, index or ``status`` (or a ``value`` or ``status`` of another
            length than the watched elements), or a buffer of a non-integer dtype.
        ShmemStateError
            The buffer is closed or the World finalized.
        NvshmemUnsupportedError
            On the nvshmem backend (host backend only).
        """
        hits = sync.test_elements(self._me(), "test_some", "some", cmp, value, indices, status)
        return hits or []

    # -- locks ------------------------------------------------------------------------------

    def set_lock(self, index: int = 0, *, timeout: float | None = None) -> None:
        """Acquire the lock word ``self[index]`` (int64/uint64, zeroed; ``shmem_set_lock``):
        fair (first come, first served), raising :class:`~shmem.errors.LockTimeoutError`
        past the deadline.

        Parameters
        ----------
        index : int, optional
            The lock word's element (the word on rank 0's copy serves every rank).
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Raises
        ------
        ArgumentError
            An invalid ``index`` or ``timeout`` (refused before a ticket is drawn), or a buffer that
            is not int64/uint64.
        ShmemStateError
            This rank holds the lock already, the buffer is closed or the World finalized.
        LockTimeoutError
            The lock was not acquired within the deadline (it is unusable from then on).
        RemoteTimeoutError
            Rank 0, which holds the lock word, made no MPI progress within the deadline.
        """
        sync.set_lock(self._me(), index, timeout)

    def try_lock(self, index: int = 0) -> bool:
        """Acquire the lock if it is free now, without waiting: True when this call acquired
        it (the Python spelling of :meth:`test_lock`, which returns OpenSHMEM's int).

        Parameters
        ----------
        index : int, optional
            The lock word's element.

        Returns
        -------
        bool
            True when this call acquired the lock.

        Raises
        ------
        ArgumentError
            An invalid ``index``, or a buffer that is not int64/uint64.
        ShmemStateError
            The buffer is closed or the World finalized.
        RemoteTimeoutError
            Rank 0, which holds the lock word, made no MPI progress within the deadline.
        """
        return sync.try_lock(self._me(), index)

    def test_lock(self, index: int = 0) -> int:
        """``shmem_test_lock``, with its C return value: **0 when this call acquired the
        lock**, 1 when the lock was set (by another rank, or queued for). ``if
        buf.test_lock():`` therefore means "not acquired"; :meth:`try_lock` returns True
        when acquired.

        Parameters
        ----------
        index : int, optional
            The lock word's element.

        Returns
        -------
        int
            0 when this call acquired the lock, else 1.

        Raises
        ------
        ArgumentError
            An invalid ``index``, or a buffer that is not int64/uint64.
        ShmemStateError
            The buffer is closed or the World finalized.
        RemoteTimeoutError
            Rank 0, which holds the lock word, made no MPI progress within the deadline.
        """
        return 0 if sync.try_lock(self._me(), index, "test_lock") else 1

    def clear_lock(self, index: int = 0) -> None:
        """Complete outstanding puts (``quiet``), then release (``shmem_clear_lock``).

        Parameters
        ----------
        index : int, optional
            The lock word's element.

        Raises
        ------
        ArgumentError
            An invalid ``index``, or a buffer that is not int64/uint64.
        ShmemStateError
            This rank does not hold the lock (left unchanged), the buffer is closed or the World
            finalized.
        RemoteTimeoutError
            The quiet, or the update of rank 0's lock word, did not complete within the deadline.
        """
        sync.clear_lock(self._me(), index)

    def lock(self, index: int = 0, *, timeout: float | None = None) -> _Held:
        """``with buf.lock(): ...``: :meth:`set_lock` on entry, :meth:`clear_lock` on exit.

        Parameters
        ----------
        index : int, optional
            The lock word's element.
        timeout : float, optional
            Seconds to wait (default: ``[signal] timeout_s``).

        Returns
        -------
        context manager
            Acquires on entry (raising what :meth:`set_lock` raises), releases on exit.
        """
        return _Held(self, index, timeout)


class _Held:
    def __init__(self, buf: OpenShmemMethods, index: int, timeout: float | None) -> None:
        self._buf, self._index, self._timeout = buf, index, timeout

    def __enter__(self) -> None:
        self._buf.set_lock(self._index, timeout=self._timeout)

    def __exit__(self, *exc: object) -> None:
        self._buf.clear_lock(self._index)
