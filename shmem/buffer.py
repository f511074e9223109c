"""SHMEMBuffer: a typed, shaped view of one allocation of the symmetric heap."""

from __future__ import annotations

import math
import warnings
import weakref
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ._buffer_openshmem import OpenShmemMethods
from .buffer_views import ViewMethods
from .device.memory import Buffer
from .dtypes import Casting, dtype_name
from .errors import ArgumentError, ShmemStateError
from .quarantine import ViewRef, anchored
from .rma import register_buffer_type
from .signals import signal_value

if TYPE_CHECKING:
    from .device.context import DeviceContext
    from .heap import DeviceSymmetricHeap
    from .world import World

__all__ = ["SHMEMBuffer"]

_KDLCPU = 1


_LOW_FLOATS = frozenset(
    np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
)
_Dst = TypeVar("_Dst", bound="np.ndarray[Any, Any] | Buffer")


class SHMEMBuffer(ViewMethods, OpenShmemMethods):
    """A buffer at the same offset of every rank's symmetric heap.

    Made collectively by :meth:`World.empty` / :meth:`World.zeros`; released collectively by
    :meth:`close` (or the ``with`` statement). Garbage collection never frees it: ``__del__``
    only warns with ``ResourceWarning``.

    Every rank has its own copy; :meth:`local` is this rank's, :meth:`peer` another rank's
    (zero-copy where load/store reachable), and :meth:`put` / :meth:`get` move data one-sided.

    Not constructed directly: :meth:`World.empty` and :meth:`World.zeros` make them.

    Parameters
    ----------
    world : World
        The World whose heap holds the buffer.
    offset : int
        The byte offset in every rank's heap slab (the same on every rank).
    shape : tuple of int
        The array shape.
    dtype : numpy.dtype
        The element type.
    root : SHMEMBuffer, optional
        The allocation a view is made from (None for an allocation).
    """

    def __init__(
        self,
        world: World,
        offset: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        root: SHMEMBuffer | None = None,
    ) -> None:
        self._world = world
        # a view (view(), [...]) has the allocation it came from as its root; the root
        # knows its views: closing it closes them, and their numpy views count as its own
        self._root = root
        self._views: weakref.WeakSet[SHMEMBuffer] = weakref.WeakSet()
        self._offset = offset
        self._shape = shape
        self._dtype = dtype
        self._count = math.prod(shape)
        self._nbytes = self._count * dtype.itemsize
        self._closed = False
        # flat typed views of each rank's copy, made on first use (None: not reachable)
        self._flat: dict[int, np.ndarray[Any, Any] | None] = {}
        # (Win.Put, Win.Flush, displacement) of each rank copy a put reaches through MPI
        # RMA, made on first use; only for dtypes MPI knows (the put fast path), emptied by
        # close() and finalize()
        self._remote: dict[int, tuple[Any, Any, int]] = {}
        # the same in C where shmem._rmafast is built (shmem.backends.rma_accel): its
        # Putter, and that Putter's bound put (None until a rank is reached through RMA)
        self._putter: Any = None
        self._fast: Any = None
        self._locks_held: set[int] = set()  # lock elements this rank holds (shmem.sync)
        # the arrays every view given out is made from (by rank copy), held weakly: alive
        # exactly while a view is, so close() knows (shmem.quarantine)
        self._anchors: dict[int, ViewRef] = {}
        self._sources: dict[int, memoryview] = {}  # each rank copy's bytes, to make them from
        # each rank copy's typed view of its anchor, held (strongly) until close(): local()
        # and peer() reshape it (0.5 us) instead of making an anchor and a view (1.2 us)
        self._typed: dict[int, np.ndarray[Any, Any]] = {}

    # -- properties -------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def count(self) -> int:
        """Number of elements."""
        return self._count

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def offset(self) -> int:
        """Byte offset in the symmetric heap (the same on every rank)."""
        return self._offset

    @property
    def world(self) -> World:
        return self._world

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d SHMEMBuffer")
        return self._shape[0]

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"offset={self._offset}"
        if self._root is not None:
            state += f", a view of the allocation at offset {self._root._offset}"
        return (
            f"SHMEMBuffer(shape={self._shape}, dtype={dtype_name(self._dtype)}, "
            f"nbytes={self._nbytes}, {state})"
        )

    def _live(self, where: str) -> None:
        if self._closed:
            raise ShmemStateError(f"SHMEMBuffer.{where}: the buffer is closed")
        self._world._check_open(f"SHMEMBuffer.{where}")

    def _check_rank(self, where: str, rank: int) -> int:
        size = self._world.world_size
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < size:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: invalid rank (got {rank!r}; expected 0 <= rank < {size})"
            )
        return int(rank)

    def _check_span(self, where: str, offset: int, nbytes: int) -> None:
        if (
            isinstance(offset, bool)
            or not isinstance(offset, int | np.integer)
            or offset < 0
            or offset % self._dtype.itemsize
        ):
            raise ArgumentError(
                f"SHMEMBuffer.{where}: invalid offset (got {offset!r}; expected a non-negative "
                f"byte offset that is a multiple of the item size {self._dtype.itemsize})"
            )
        if offset + nbytes > self._nbytes:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: out of bounds (got {nbytes} bytes at offset {offset}; "
                f"expected offset + nbytes <= {self._nbytes})"
            )

    # -- views --------------------------------------------------------------------------------

    def unsafe_ptr(self) -> int:
        """Address of this rank's copy (valid until :meth:`close`).

        Returns
        -------
        int
            The address (a device pointer on the nvshmem backend).
        """
        self._live("unsafe_ptr")
        return self._world.heap.address(self._offset)

    def local(self) -> Any:
        """This rank's copy, zero-copy: a numpy array of ``shape`` and ``dtype`` on the host
        backend; a GPU :class:`~shmem.Buffer` on the nvshmem backend (DLPack: cupy, torch).

        Returns
        -------
        numpy.ndarray or Buffer
            This rank's copy.
        """
        self._live("local")
        heap: Any = self._world.heap
        if heap.device_memory:
            return self._device_buffer(heap.address(self._offset))
        return self._view_of(self._world.rank)

    def peer(self, rank: int) -> Any:
        """Rank ``rank``'s copy, zero-copy (a numpy array; a GPU Buffer on the nvshmem
        backend), or None when not load/store reachable (a peer on another node): use
        :meth:`put` / :meth:`get` then.

        Parameters
        ----------
        rank : int
            The peer (may be this rank).

        Returns
        -------
        numpy.ndarray or Buffer or None
            The peer's copy, or None off the node.
        """
        return self._peer("peer", rank)

    def _peer(self, where: str, rank: int) -> Any:
        self._live(where)
        rank = self._check_rank(where, rank)
        heap: Any = self._world.heap
        if heap.device_memory:
            ptr = heap.peer_address(rank, self._offset)
            return None if ptr is None else self._device_buffer(ptr)
        if not heap.is_local(rank):
            return None
        return self._view_of(rank)

    def _view_of(self, rank: int) -> np.ndarray[Any, Any]:
        """A new view (``shape``, ``dtype``) of rank ``rank``'s copy, made from its anchor."""
        typed = self._typed.get(rank)
        if typed is None:
            typed = self._typed[rank] = self._anchored(rank).view(self._dtype)
        return typed.reshape(self._shape)

    def _anchored(self, rank: int) -> np.ndarray[Any, Any]:
        """The array (bytes) every view of rank ``rank``'s copy is made from: the one still
        alive, or a new one (a view outlives ``close()`` without aliasing what comes next)."""
        ref = self._anchors.get(rank)
        base = None if ref is None else ref()
        if base is None:
            source = self._sources.get(rank)
            if source is None:
                raw = self._world.heap.peer_view(rank, self._offset, self._nbytes)
                if raw is None:  # pragma: no cover - callers checked reachability
                    raise ShmemStateError(f"SHMEMBuffer: rank {rank} is not load/store reachable")
                source = self._sources[rank] = raw.data
            base = anchored(source)
            self._anchors[rank] = weakref.ref(base)
        return base

    def _view_refs(self) -> tuple[ViewRef, ...]:
        """Weak references to the arrays behind the views given out, through this buffer and
        the typed views made from it (for close())."""
        refs = list(self._anchors.values())
        for v in self._views:
            refs.extend(v._anchors.values())
        return tuple(refs)

    def _device_buffer(self, ptr: int) -> Buffer:
        from .device.cuda.memory import _DeviceMemory
        from .device.views import contiguous_strides

        heap = self._world.heap
        return Buffer._device_view(
            cast("DeviceSymmetricHeap", heap).device,
            _DeviceMemory(ptr, self._nbytes, self),
            self._dtype,
            self._shape,
            contiguous_strides(self._shape, self._dtype.itemsize),
            stream=self._world.ctx,
        )

    def _zero(self) -> None:
        heap = self._world.heap
        if heap.device_memory:
            cast("DeviceSymmetricHeap", heap).memset(self._offset, self._nbytes)
        else:
            self.local()[...] = 0

    # -- one-sided data movement -------------------------------------------------------------

    def _as_source(
        self, where: str, src: Any, casting: Casting = "same_kind"
    ) -> np.ndarray[Any, Any]:
        """``src`` as a contiguous array of this buffer's dtype. ``"same_kind"`` casts refuse
        values the target cannot hold (an int64 ``2**40`` into int32, a finite float64 that
        overflows float32), which numpy's own cast would wrap or turn into inf silently;
        ``"unsafe"`` keeps numpy's C semantics."""
        arr = np.asarray(src)
        if arr.dtype != self._dtype:
            rule = casting
            if casting == "same_kind" and arr.dtype.kind in "iu" and self._dtype.kind in "iu":
                rule = "unsafe"  # signed <-> unsigned: allowed when every value fits (below)
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                    cast_arr = arr.astype(self._dtype, casting=rule)
            except TypeError:
                raise ArgumentError(
                    f"SHMEMBuffer.{where}: cannot cast the source (got dtype {arr.dtype}; "
                    f"expected {dtype_name(self._dtype)} or a {casting} cast)"
                ) from None
            if casting != "unsafe":
                _check_lossless(where, arr, cast_arr, self._dtype)
            arr = cast_arr
        return np.ascontiguousarray(arr)

    def _flat_view(self, rank: int) -> np.ndarray[Any, Any] | None:
        try:
            return self._flat[rank]
        except KeyError:
            heap = self._world.heap
            raw = heap.peer_view(rank, self._offset, self._nbytes)
            flat = None if raw is None else raw.view(self._dtype)
            self._flat[rank] = flat
            target = heap.rma_target(rank, self._offset) if flat is None else None
            if target is not None and self._dtype.isbuiltin:
                self._remote[rank] = (target[0].Put, target[0].Flush, target[1])
                if self._putter is None:
                    self._putter = heap.rma_putter(self._nbytes, self._dtype)
                if self._putter is not None:
                    for r, armed in self._remote.items():  # (another thread's ranks too)
                        self._putter.enable(r, armed[2])
                    self._fast = self._putter.put
            return flat

    def _forget_remote(self) -> None:
        """Drop the put fast path's windows (close(), finalize(): the window goes)."""
        self._remote.clear()
        self._fast = None
        if self._putter is not None:
            self._putter.clear()
            self._putter = None

    def put(
        self,
        rank: int,
        src: npt.ArrayLike | Buffer,
        offset: int = 0,
        signal: tuple[int, int] | tuple[int, int, str] | None = None,
        *,
        casting: Casting = "same_kind",
    ) -> None:
        """Write ``src`` into ``rank``'s copy at byte ``offset`` (one-sided, host-blocking).

        With ``signal=(slot, value[, op])`` the signal is raised on ``rank`` after the data:
        a rank that sees the signal through ``wait_until`` sees the data (put-with-signal).
        A source of another dtype is cast (``casting`` as numpy's); the default
        ``"same_kind"`` refuses values the buffer's dtype cannot hold instead of wrapping
        them, ``"unsafe"`` allows any cast with numpy's C semantics.

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        src : array-like or Buffer
            The data, at most the buffer's bytes from ``offset``.
        offset : int, optional
            Byte offset into ``rank``'s copy.
        signal : tuple, optional
            ``(slot, value)`` or ``(slot, value, op)``: a world signal raised on ``rank`` after the
            data.
        casting : {"no", "equiv", "safe", "same_kind", "unsafe"}, optional
            How a source of another dtype may be cast (numpy's rules).

        Raises
        ------
        ArgumentError
            An invalid rank, offset or signal, a source that does not fit, or a cast ``casting``
            refuses.
        """
        fast = self._fast
        if fast is not None:
            # C (shmem._rmafast): the checks below and Put + Flush; False leaves the call
            # to the general path (close() and finalize() drop it, so a live buffer is implied)
            if signal is None and fast(rank, src, offset):
                return
        elif type(src) is np.ndarray and type(rank) is int and signal is None:
            remote = self._remote.get(rank)  # a rank off this node, already checked once
            if (
                remote is not None
                and src.dtype is self._dtype
                and src.ndim == 1  # MPI takes it as it is when contiguous (else BufferError)
                and type(offset) is int
                and 0 <= offset <= self._nbytes - src.nbytes
                and not offset % src.itemsize
            ):
                # the RMA fast path (these checks are all the general path makes here);
                # close() and finalize() empty _remote, so a live buffer is implied
                try:
                    remote[0](src, rank, remote[2] + offset)  # Win.Put
                except BufferError:  # a strided 1-D view: the general path copies it
                    pass
                else:
                    remote[1](rank)  # Win.Flush
                    return
        if self._closed or self._world._finalized:
            self._live("put")
        if type(rank) is not int or not 0 <= rank < self._world.world_size:
            rank = self._check_rank("put", rank)
        if type(src) is np.ndarray and src.dtype == self._dtype:
            data: np.ndarray[Any, Any] = src
        else:
            data = self._as_source("put", src, casting)
        if offset or data.nbytes > self._nbytes or type(offset) is not int:
            self._check_span("put", offset, data.nbytes)
        sig = self._check_signal(signal) if signal is not None else None
        heap = self._world.heap
        if heap.device_memory:
            self._put_device(rank, src, int(offset), casting)
        else:
            flat = self._flat_view(rank)
            if flat is not None:
                start = offset // self._dtype.itemsize
                flat[start : start + data.size] = data.reshape(-1)
            else:
                heap.put_bytes(rank, self._offset + offset, np.ascontiguousarray(data))
        if sig is not None:
            self._world.signals.signal(rank, *sig)

    def _put_device(self, rank: int, src: Any, offset: int, casting: Casting = "same_kind") -> None:
        heap: Any = self._world.heap
        if isinstance(src, Buffer) and not src.is_host:
            src._require_contiguous("SHMEMBuffer.put")
            if src.dtype != self._dtype:
                raise ArgumentError(
                    f"SHMEMBuffer.put: source dtype {dtype_name(src.dtype)} does not match "
                    f"the buffer's {dtype_name(self._dtype)}"
                )
            self._check_span("put", offset, src.nbytes)
            if src.stream is not None:
                src.stream.synchronize()  # the source's producer has finished
            heap.put_device(rank, self._offset + offset, src._ptr, src.nbytes)
            return
        data = self._as_source("put", src.to_numpy() if isinstance(src, Buffer) else src, casting)
        self._check_span("put", offset, data.nbytes)
        heap.put_bytes(rank, self._offset + offset, data)

    def _check_signal(self, signal: Any) -> tuple[int, int, str]:
        if not isinstance(signal, tuple) or len(signal) not in (2, 3):
            raise ArgumentError(
                f"SHMEMBuffer.put: invalid signal (got {signal!r}; expected (slot, value) or "
                "(slot, value, op))"
            )
        op = signal[2] if len(signal) == 3 else "set"
        slot = signal[0]
        if isinstance(slot, bool) or not isinstance(slot, int | np.integer):
            raise ArgumentError(
                f"SHMEMBuffer.put: invalid signal slot (got {slot!r}; expected an int slot of "
                "the World's signal pad)"
            )
        slots = self._world.signals.slots
        if not 0 <= slot < slots:
            raise ArgumentError(
                f"SHMEMBuffer.put: invalid signal slot (got {slot}; expected 0 <= slot < "
                f"{slots}, the World's signal pad)"
            )
        if not isinstance(op, str) or op not in ("set", "add"):
            raise ArgumentError(
                f"SHMEMBuffer.put: invalid signal op (got {op!r}; expected 'set' or 'add')"
            )
        value = signal_value("SHMEMBuffer.put", signal[1], "signal value")
        return int(slot), value, str(op)

    @overload
    def get(self, rank: int, dst: None = None, offset: int = 0) -> np.ndarray[Any, Any]: ...
    @overload
    def get(self, rank: int, dst: _Dst, offset: int = 0) -> _Dst: ...
    def get(
        self, rank: int, dst: np.ndarray[Any, Any] | Buffer | None = None, offset: int = 0
    ) -> np.ndarray[Any, Any] | Buffer:
        """Read ``rank``'s copy from byte ``offset`` (one-sided, host-blocking).

        Into ``dst`` (a C-contiguous writable array of this dtype; ``dst.nbytes`` bytes are
        read) when given, else into a new array: of ``shape`` when ``offset == 0``, else the
        flat remainder. Returns the array.

        Parameters
        ----------
        rank : int
            The peer (may be this rank).
        dst : numpy.ndarray or Buffer, optional
            Where to read into (C-contiguous, writable, this dtype).
        offset : int, optional
            Byte offset into ``rank``'s copy.

        Returns
        -------
        numpy.ndarray or Buffer
            ``dst``, or the new array.

        Raises
        ------
        ArgumentError
            An invalid rank or offset, or a ``dst`` of another dtype, not contiguous or writable,
            or larger than the bytes from ``offset``.
        """
        self._live("get")
        rank = self._check_rank("get", rank)
        if dst is None:
            self._check_span("get", offset, 0)
            if offset == 0:
                out = np.empty(self._shape, dtype=self._dtype)
            else:
                out = np.empty((self._nbytes - offset) // self._dtype.itemsize, self._dtype)
        elif isinstance(dst, Buffer) and not dst.is_host:
            heap: Any = self._world.heap
            if not heap.device_memory:
                raise ArgumentError(
                    "SHMEMBuffer.get: a GPU dst needs the nvshmem backend (got a device Buffer "
                    "on the host backend; pass a numpy array)"
                )
            dst._require_contiguous("SHMEMBuffer.get")
            if dst.dtype != self._dtype:
                raise ArgumentError(
                    f"SHMEMBuffer.get: dst dtype {dtype_name(dst.dtype)} does not match the "
                    f"buffer's {dtype_name(self._dtype)}"
                )
            self._check_span("get", offset, dst.nbytes)
            heap.get_device(rank, self._offset + int(offset), dst._ptr, dst.nbytes)
            return dst
        else:
            if not isinstance(dst, np.ndarray):
                raise ArgumentError(
                    f"SHMEMBuffer.get: dst must be a numpy array (got {type(dst).__name__})"
                )
            if dst.dtype != self._dtype or not dst.flags.c_contiguous or not dst.flags.writeable:
                raise ArgumentError(
                    f"SHMEMBuffer.get: invalid dst (got dtype {dst.dtype}, contiguous "
                    f"{dst.flags.c_contiguous}, writeable {dst.flags.writeable}; expected a "
                    f"writeable C-contiguous {dtype_name(self._dtype)} array)"
                )
            out = dst
        self._check_span("get", offset, out.nbytes)
        self._world.heap.get_bytes(rank, self._offset + int(offset), out)
        return out

    def get_type_name(self) -> str:
        """The element type's name (``"float32"``, ``"bfloat16"``...; the seed's
        ``SHMEMBuffer.get_type_name``).

        Returns
        -------
        str
            The dtype's canonical name.
        """
        return dtype_name(self._dtype)

    def _from_pointer(self, where: str, ptr: Any) -> Any:
        """A raw host address (``int``, as the seed passes) as a host Buffer of this buffer's
        dtype and shape; anything else as is."""
        if isinstance(ptr, int | np.integer) and not isinstance(ptr, bool):
            raw = Buffer.from_handle(int(ptr), self._nbytes)
            return raw.view(self._dtype, self._shape)
        return ptr

    def enqueue_copy_to(
        self, host_array: np.ndarray[Any, Any] | Buffer | int, ctx: DeviceContext | None = None
    ) -> None:
        """Copy this rank's copy into ``host_array`` (a numpy array or host Buffer of the same
        dtype and element count, or the address of ``nbytes`` of host memory as an ``int``),
        stream-ordered on ``ctx`` (default: the World's context): synchronize it before
        reading ``host_array``.

        Parameters
        ----------
        host_array : numpy.ndarray or Buffer or int
            The destination (an ``int`` is a host address).
        ctx : DeviceContext, optional
            The stream; the World's context when None.
        """
        self._live("enqueue_copy_to")
        host_array = self._from_pointer("enqueue_copy_to", host_array)
        self._check_host_array("enqueue_copy_to", host_array)
        (ctx or self._world.ctx).enqueue_copy(host_array, self.local())

    def enqueue_copy_from(
        self, host_array: npt.ArrayLike | Buffer | int, ctx: DeviceContext | None = None
    ) -> None:
        """Copy ``host_array`` (same dtype and element count, or the address of ``nbytes``
        of host memory as an ``int``) into this rank's copy, stream-ordered on ``ctx``
        (default: the World's context).

        Parameters
        ----------
        host_array : array-like or Buffer or int
            The source (an ``int`` is a host address).
        ctx : DeviceContext, optional
            The stream; the World's context when None.

        Raises
        ------
        ArgumentError
            A source of another dtype or element count.
        """
        self._live("enqueue_copy_from")
        src = self._from_pointer("enqueue_copy_from", host_array)
        if not isinstance(src, np.ndarray | Buffer):
            src = self._as_source("enqueue_copy_from", src)
        count = src.num_elements if isinstance(src, Buffer) else src.size
        if count != self._count:
            raise ArgumentError(
                f"SHMEMBuffer.enqueue_copy_from: wrong element count (got {count}; "
                f"expected {self._count})"
            )
        if isinstance(src, np.ndarray) and src.dtype != self._dtype:
            src = self._as_source("enqueue_copy_from", src)
        (ctx or self._world.ctx).enqueue_copy(self.local(), src)

    def _check_host_array(self, where: str, arr: Any) -> None:
        if isinstance(arr, Buffer):
            arr = arr.to_numpy()
        if not isinstance(arr, np.ndarray):
            raise ArgumentError(
                f"SHMEMBuffer.{where}: expected a numpy array or host Buffer (got "
                f"{type(arr).__name__})"
            )
        if arr.dtype != self._dtype or arr.size != self._count or not arr.flags.writeable:
            raise ArgumentError(
                f"SHMEMBuffer.{where}: incompatible array (got dtype {arr.dtype}, "
                f"{arr.size} elements; expected a writeable {dtype_name(self._dtype)} array "
                f"of {self._count} elements)"
            )

    # -- DLPack -----------------------------------------------------------------------------

    def as_buffer(self) -> Buffer:
        """This rank's copy as a :class:`~shmem.Buffer` (zero-copy, host or device): every
        Buffer operation, and the one DLPack producer every buffer kind exports through.

        Returns
        -------
        Buffer
            This rank's copy, zero-copy.
        """
        arr = self.local()
        return arr if isinstance(arr, Buffer) else Buffer._host(arr, keepalive=self)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """This rank's copy as numpy: a zero-copy view on the host backend (the same as
        :meth:`local`), a host copy of the GPU memory on the nvshmem backend.

        Returns
        -------
        numpy.ndarray
            A view (host backend) or a copy (nvshmem backend).
        """
        self._live("to_numpy")
        return self.as_buffer().to_numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        return self.as_buffer().__array__(dtype, copy)

    def __dlpack__(self, **kwargs: Any) -> Any:
        """Export this rank's copy (zero-copy), every dtype included (bfloat16, float8), through
        the same producer as :meth:`shmem.Buffer.__dlpack__`."""
        self._live("__dlpack__")
        return self.as_buffer().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._world.heap.device_memory:
            return self.local().__dlpack_device__()  # type: ignore[no-any-return]
        return (_KDLCPU, 0)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release the allocation (collective: every rank must call it, in the same order).
        Closing twice is a no-op.

        A view that outlives ``close()`` (from :meth:`local` or :meth:`peer`, or anything made
        from one: slices, Buffers, DLPack tensors) keeps the memory on every rank, unchanged
        by later allocations; the block is freed at the first heap call after the last such
        view on every rank is gone (:mod:`shmem.quarantine`). Raw addresses
        (:meth:`unsafe_ptr`) are not tracked: they are valid until ``close()``.

        Raises
        ------
        ShmemStateError
            This is a view: close the allocation it came from.
        """
        if self._closed:
            return
        if self._root is not None:
            raise ShmemStateError(
                "SHMEMBuffer.close: this is a view of an allocation (view() or [...]); close "
                "the allocation it came from, which closes its views"
            )
        for v in (self, *self._views):
            v._typed.clear()  # only the views given out may keep the anchors alive now
        self._world._free(self)
        self._drop()

    def _drop(self) -> None:
        """Unusable from now on, with every view made from it (close(), finalize())."""
        for v in list(self._views):
            v._drop()
        self._closed = True
        self._flat.clear()
        self._forget_remote()
        self._sources.clear()

    def __enter__(self) -> SHMEMBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        # on an exception the collective free could hang the other ranks: leave it

    def __del__(self) -> None:
        if (
            not getattr(self, "_closed", True)
            and getattr(self, "_root", None) is None  # views own nothing
            and not self._world.finalized
        ):
            warnings.warn(
                f"{self!r} was garbage-collected without close(); its heap memory stays "
                "allocated (a collective free cannot run from __del__)",
                ResourceWarning,
                stacklevel=2,
            )


def _check_lossless(
    where: str, src: np.ndarray[Any, Any], cast: np.ndarray[Any, Any], dtype: np.dtype[Any]
) -> None:
    """Raise unless every value of ``src`` survived the cast to ``dtype`` (integers in range,
    finite values still finite; float rounding is not a loss)."""
    if dtype.kind in "iub" and src.dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        if info is not None and src.size and (src.min() < info.min or src.max() > info.max):
            bad = src[(src < info.min) | (src > info.max)].reshape(-1)[0]
            raise ArgumentError(
                f"SHMEMBuffer.{where}: value {bad} does not fit {dtype_name(dtype)} (got a "
                f"{src.dtype} source; expected values in [{info.min}, {info.max}], or pass "
                "casting='unsafe' to wrap them as C does)"
            )
    elif dtype.kind in "fc" or dtype in _LOW_FLOATS:
        # a finite value that did not stay finite: inf, or NaN where the format has no
        # infinity (float8_e4m3fn saturates to NaN); complex: either part
        if dtype.kind == "c" or src.dtype.kind == "c":
            grew = ~np.isfinite(cast) & np.isfinite(src)
        else:
            grew = ~np.isfinite(cast.astype(np.float64)) & np.isfinite(src.astype(np.float64))
        if grew.any():
            bad = src.reshape(-1)[int(np.argmax(grew.reshape(-1)))]
            raise ArgumentError(
                f"SHMEMBuffer.{where}: value {bad} overflows {dtype_name(dtype)} (got a "
                f"{src.dtype} source; expected finite values in range, or pass "
                "casting='unsafe' to let them become inf)"
            )


register_buffer_type(SHMEMBuffer)  # rma's and sync's checks know it without importing this
