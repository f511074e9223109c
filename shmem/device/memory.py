"""Buffer: an n-d typed buffer on a device (the seeds ``max.driver.Buffer``, cuda.core ``Buffer``).

A buffer is ``(storage, byte offset, shape, strides, dtype)``. Host storage is a numpy array
(ordinary, pinned, or memory-mapped); device storage is a cuda.core allocation. Indexing gives
strided views that share the storage (:mod:`shmem.device.views` does the arithmetic for both).
Operations that move data take the buffer's stream (the :class:`~shmem.DeviceContext`
it was made on) when it has one, so they stay in stream order; without one they complete
before returning.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..dtypes import DTypeLike, ShapeLike, as_dtype, as_shape, dtype_name
from ..errors import ArgumentError, ShmemStateError
from .aliases import BufferAliases
from .devices import CPU, Accelerator, Device, as_device
from .impl import mover
from .resources import context_class, lend_class
from .views import contiguous_strides, index_view, is_contiguous, single_index

if TYPE_CHECKING:
    from .context import DeviceContext

__all__ = ["Buffer"]


class Buffer(BufferAliases):
    """An n-d buffer of ``dtype`` on ``device``.

    Parameters
    ----------
    dtype : dtype or str
        Any of the runtime's dtypes (``shmem.SUPPORTED_DTYPES``).
    shape : int or tuple of int
    device : Device or str, optional
        Default: the stream's device, else the host.
    pinned : bool
        Host buffers only: page-locked memory for fast GPU transfers (when a CUDA driver is
        present; ordinary memory otherwise, and ``pinned`` then reads False).
    stream : DeviceContext, optional
        The stream the buffer's memory and data movements are ordered on.

    Raises
    ------
    ArgumentError
        When ``dtype``, ``shape`` or ``device`` is invalid, when ``stream`` is on another GPU
        than ``device``, or when ``pinned`` is asked of a device buffer.
    """

    def __init__(
        self,
        dtype: DTypeLike,
        shape: ShapeLike,
        device: Device | str | None = None,
        pinned: bool = False,
        stream: DeviceContext | None = None,
    ) -> None:
        dt = as_dtype(dtype, "Buffer")
        dims = as_shape("Buffer", shape)
        dev = (
            stream.device
            if (device is None and stream is not None)
            else as_device(device, "Buffer")
        )
        if stream is not None and not dev.is_host and stream.device != dev:
            raise ArgumentError(
                f"Buffer: the stream is on {stream.device.label}, the buffer on {dev.label} "
                "(expected the same device)"
            )
        if pinned and not dev.is_host:
            raise ArgumentError(f"Buffer: pinned applies to host buffers (got device {dev.label})")
        self._device = dev
        self._dtype = dt
        self._shape = dims
        self._strides = contiguous_strides(dims, dt.itemsize)
        self._offset = 0
        self._stream = stream
        self._closed = False
        self._array: np.ndarray[Any, Any] | None
        self._mem: Any
        self._array, self._mem, self._pinned = dev.impl.allocate(dev, dims, dt, pinned, stream)

    # -- construction without allocation ----------------------------------------------------

    @classmethod
    def _host(
        cls,
        array: np.ndarray[Any, Any],
        stream: DeviceContext | None = None,
        pinned: bool = False,
        keepalive: Any = None,
    ) -> Buffer:
        buf = cls.__new__(cls)
        buf._device = CPU()
        buf._dtype = as_dtype(array.dtype, "Buffer")
        buf._shape = tuple(array.shape)
        buf._strides = tuple(array.strides)
        buf._offset = 0
        buf._stream = stream
        buf._closed = False
        buf._mem = keepalive
        buf._array = array
        buf._pinned = pinned
        return buf

    def _adopt(self, other: Buffer) -> None:
        """Take over ``other``'s view of its memory (for subclasses that own memory made
        elsewhere, such as the IPC buffers)."""
        self._device = other._device
        self._dtype = other._dtype
        self._shape = other._shape
        self._strides = other._strides
        self._offset = other._offset
        self._stream = other._stream
        self._closed = other._closed
        self._mem = other._mem
        self._array = other._array
        self._pinned = other._pinned

    def _derive(
        self,
        offset: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: np.dtype[Any] | None = None,
        array: Any = None,
    ) -> Buffer:
        """A view sharing this buffer's storage."""
        buf = Buffer.__new__(Buffer)
        buf._device = self._device
        buf._dtype = self._dtype if dtype is None else dtype
        buf._shape = shape
        buf._strides = strides
        buf._offset = self._offset + offset
        buf._stream = self._stream
        buf._closed = False
        buf._mem = self._mem
        buf._array = array
        buf._pinned = self._pinned
        return buf

    @classmethod
    def _device_view(
        cls,
        device: Device,
        mem: Any,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int = 0,
        stream: DeviceContext | None = None,
    ) -> Buffer:
        buf = cls.__new__(cls)
        buf._device = device
        buf._dtype = dtype
        buf._shape = shape
        buf._strides = strides
        buf._offset = offset
        buf._stream = stream
        buf._closed = False
        buf._mem = mem
        buf._array = None
        buf._pinned = False
        return buf

    # -- properties ---------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def num_elements(self) -> int:
        """Number of elements (the seed's name; ``count`` is the same)."""
        return math.prod(self._shape)

    @property
    def count(self) -> int:
        """Number of elements (as ``SHMEMBuffer.count``)."""
        return math.prod(self._shape)

    @property
    def ndim(self) -> int:
        """Number of dimensions (the seed's ``rank`` is the same)."""
        return len(self._shape)

    @property
    def element_size(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.num_elements * self._dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in bytes."""
        return self._strides

    @property
    def device(self) -> Device:
        return self._device

    @property
    def stream(self) -> DeviceContext | None:
        return self._stream

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def is_host(self) -> bool:
        return self._device.is_host

    @property
    def is_contiguous(self) -> bool:
        return is_contiguous(self._shape, self._strides, self._dtype.itemsize)

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a rank-0 Buffer")
        return self._shape[0]

    def __repr__(self) -> str:
        extra = ", pinned" if self._pinned else ""
        extra += "" if self.is_contiguous else f", strides={self._strides}"
        extra += ", closed" if self._closed else ""
        return (
            f"Buffer(shape={self._shape}, dtype={dtype_name(self._dtype)}, "
            f"device={self._device.label}{extra})"
        )

    def _live(self, where: str) -> None:
        if self._closed:
            raise ShmemStateError(f"Buffer.{where}: the buffer is closed")

    def _require_contiguous(self, where: str) -> None:
        if not self.is_contiguous:
            raise ArgumentError(
                f"{where}: the buffer is not contiguous (got shape {self._shape}, strides "
                f"{self._strides}; expected a contiguous buffer: call .contiguous() first)"
            )

    def unsafe_ptr(self) -> int:
        """The address of the first element (host or device memory), as an ``int``; valid
        while the buffer is open (the seed's ``SHMEMBuffer.unsafe_ptr``).

        Returns
        -------
        int
            The address of the first element.

        Raises
        ------
        ShmemStateError
            When the buffer is closed.
        """
        self._live("unsafe_ptr")
        return self._ptr

    @property
    def _ptr(self) -> int:
        """Address of the first element (host or device)."""
        if self._array is not None:
            return int(self._array.__array_interface__["data"][0])
        return int(self._mem.ptr) + self._offset

    # -- indexing and views ---------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Buffer:
        """A strided view (numpy basic indexing: ints, slices, ``...``, ``None``)."""
        self._live("__getitem__")
        offset, shape, strides = index_view(self._shape, self._strides, key)
        if self._array is not None:
            items = key if isinstance(key, tuple) else (key,)
            if not any(it is Ellipsis for it in items):
                items = (*items, Ellipsis)  # keeps a full index a 0-d view, not a scalar
            return self._derive(offset, shape, strides, array=self._array[items])
        return self._derive(offset, shape, strides)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Set one element; several at once raise (copy into a view with
        :meth:`inplace_copy_from` instead)."""
        self._live("__setitem__")
        if not single_index(self._shape, key):
            raise ArgumentError(
                f"Buffer.__setitem__: can only set a single element (got index {key!r} on a "
                f"rank-{self.rank} buffer; expected {self.rank} integer indices). To set "
                "several, copy into a view: buf[...].inplace_copy_from(src)"
            )
        view = self[key]
        scalar = np.asarray(value).astype(self._dtype)
        if scalar.shape != ():
            raise ArgumentError(
                f"Buffer.__setitem__: expected a scalar value (got shape {scalar.shape})"
            )
        if view._array is not None:
            view._array[...] = scalar
        else:
            view._copy_from(Buffer.from_numpy(np.ascontiguousarray(scalar)), self._stream)
            view._sync_if_unordered(self._stream)

    def view(self, dtype: DTypeLike, shape: ShapeLike | None = None) -> Buffer:
        """The same bytes as ``dtype`` (and ``shape``); the buffer must be contiguous.

        Without ``shape`` the last dimension is rescaled by the ratio of item sizes.

        Parameters
        ----------
        dtype : dtype-like
            The view's dtype.
        shape : int or tuple of int, optional
            The view's shape; its bytes must equal the buffer's.

        Returns
        -------
        Buffer
            A view sharing this buffer's storage.

        Raises
        ------
        ArgumentError
            When the buffer is not contiguous, ``dtype`` or ``shape`` is invalid, the shape
            cannot be deduced (the last dimension's bytes are not a multiple of the new item
            size), or the view's bytes differ from the buffer's.
        ShmemStateError
            When the buffer is closed.
        """
        self._live("view")
        self._require_contiguous("Buffer.view")
        dt = as_dtype(dtype, "Buffer.view")
        if shape is None:
            if dt.itemsize == self._dtype.itemsize:
                dims = self._shape
            else:
                last = self._shape[-1] if self._shape else 1
                scaled = last * self._dtype.itemsize
                if not self._shape or scaled % dt.itemsize:
                    raise ArgumentError(
                        f"Buffer.view: cannot deduce a shape for {dtype_name(dt)} (last "
                        f"dimension of {scaled} bytes is not a multiple of {dt.itemsize}); "
                        "pass shape="
                    )
                dims = (*self._shape[:-1], scaled // dt.itemsize)
        else:
            dims = as_shape("Buffer.view", shape)
        if math.prod(dims) * dt.itemsize != self.nbytes:
            raise ArgumentError(
                f"Buffer.view: size mismatch (got shape {dims} of {dtype_name(dt)} = "
                f"{math.prod(dims) * dt.itemsize} bytes; expected {self.nbytes} bytes)"
            )
        strides = contiguous_strides(dims, dt.itemsize)
        if self._array is not None:
            flat = self._array.reshape(-1).view(np.uint8)
            return self._derive(0, dims, strides, dt, flat.view(dt).reshape(dims))
        return self._derive(0, dims, strides, dt)

    def contiguous(self) -> Buffer:
        """This buffer if contiguous, else a contiguous copy on the same device.

        Returns
        -------
        Buffer
            ``self``, or a new contiguous buffer with the same elements.
        """
        self._live("contiguous")
        return self if self.is_contiguous else self.copy()

    # -- copies ---------------------------------------------------------------------

    def copy(
        self, device: Device | str | None = None, stream: DeviceContext | None = None
    ) -> Buffer:
        """A contiguous deep copy, on ``device`` (or ``stream``'s device, else this device).

        Parameters
        ----------
        device : Device or str, optional
            Where the copy lives (``"cpu"``, ``"cuda:N"`` or a Device).
        stream : DeviceContext, optional
            The stream the copy is ordered on (default: this buffer's stream; with neither,
            complete on return).

        Returns
        -------
        Buffer
            The new buffer.
        """
        self._live("copy")
        if device is not None:
            dev = as_device(device, "Buffer.copy")
        elif stream is not None:
            dev = stream.device
        else:
            dev = self._device
        ctx = stream if stream is not None else self._stream
        dst_stream = ctx if ctx is not None and (dev.is_host or ctx.device == dev) else None
        out = Buffer(self._dtype, self._shape, device=dev, stream=dst_stream)
        out._copy_from(self, ctx)
        out._sync_if_unordered(ctx, self)
        return out

    def to(self, target: Any) -> Any:
        """This buffer on ``target`` (a device, a name like ``"cuda:0"``, a DeviceContext, or a
        list of them -> a list); copied only when the device differs.

        Parameters
        ----------
        target : Device or str or DeviceContext or list
            Where the buffer should be; a list or tuple gives one buffer per target.

        Returns
        -------
        Buffer or list of Buffer
            ``self`` where the device is already the target's, else a copy.
        """
        self._live("to")
        if isinstance(target, list | tuple):
            return [self.to(t) for t in target]
        if isinstance(target, context_class()):
            return self if target.device == self._device else self.copy(stream=target)
        dev = as_device(target, "Buffer.to")
        return self if dev == self._device else self.copy(device=dev)

    def inplace_copy_from(self, src: Any) -> None:
        """Copy ``src`` (a Buffer on any device, or a numpy array) into this buffer; shapes and
        dtypes must match.

        Parameters
        ----------
        src : Buffer or numpy.ndarray
            The elements to copy, of this buffer's shape and dtype.
        """
        self._live("inplace_copy_from")
        s = Buffer._coerce(src, "inplace_copy_from", "src")
        Buffer._check_copy_pair(self, s, "Buffer.inplace_copy_from", contiguous=False)
        ctx = self._stream
        self._copy_from(s, ctx)
        self._sync_if_unordered(ctx, s)

    @staticmethod
    def _coerce(obj: Any, where: str, name: str) -> Buffer:
        if isinstance(obj, Buffer):
            obj._live(where)
            return obj
        if isinstance(obj, np.ndarray):
            return Buffer.from_numpy(obj)
        raise ArgumentError(
            f"{where}: {name} must be a Buffer or a numpy array (got {type(obj).__name__})"
        )

    @staticmethod
    def _check_copy_pair(dst: Buffer, src: Buffer, where: str, contiguous: bool) -> None:
        if dst._dtype != src._dtype:
            raise ArgumentError(
                f"{where}: dtype mismatch (got dst {dtype_name(dst._dtype)}, src "
                f"{dtype_name(src._dtype)}; expected the same dtype)"
            )
        if contiguous:
            if dst.num_elements != src.num_elements:
                raise ArgumentError(
                    f"{where}: size mismatch (got dst {dst.num_elements} elements, src "
                    f"{src.num_elements}; expected equal counts)"
                )
            for buf, name in ((dst, "dst"), (src, "src")):
                if not buf.is_contiguous:
                    raise ArgumentError(
                        f"{where}: {name} is not contiguous (got strides {buf._strides}; "
                        "expected a contiguous buffer: call .contiguous() first)"
                    )
        elif dst._shape != src._shape:
            raise ArgumentError(
                f"{where}: shape mismatch (got dst {dst._shape}, src {src._shape}; expected "
                "the same shape)"
            )

    def _copy_from(self, src: Buffer, ctx: DeviceContext | None) -> None:
        """Copy ``src`` into self: ordered on ``ctx`` when given, else complete on return."""
        mover(self, src).copy(self, src, ctx)

    def _sync_if_unordered(
        self, ctx: DeviceContext | None = None, src: Buffer | None = None
    ) -> None:
        """Device work that no device stream orders (no ``ctx``, or a host one) completes
        before the call returns: wait for whichever side is device memory."""
        if ctx is not None and not ctx.device.impl.is_host:
            return
        for buf in (self, src):
            if buf is not None and not buf.device.impl.is_host:
                buf.device.impl.wait_unordered(buf.device)
                return

    def _fill(self, value: Any, ctx: DeviceContext | None) -> None:
        self._live("fill")
        scalar = np.asarray(value).astype(self._dtype)
        if scalar.shape != ():
            raise ArgumentError(f"memset: expected a scalar value (got shape {scalar.shape})")
        self._device.impl.fill(self, scalar, ctx)
        self._sync_if_unordered(ctx)

    # -- numpy ---------------------------------------------------------------------

    @classmethod
    def from_numpy(cls, array: np.ndarray[Any, Any]) -> Buffer:
        """A host buffer over ``array`` (zero-copy, strides kept).

        Parameters
        ----------
        array : numpy.ndarray
            The array; one whose strides are not multiples of its item size is copied first.

        Returns
        -------
        Buffer
            A host buffer sharing ``array``'s memory.

        Raises
        ------
        ArgumentError
            When ``array`` is not a numpy array or its dtype is unsupported.
        """
        if not isinstance(array, np.ndarray):
            raise ArgumentError(
                f"Buffer.from_numpy: expected a numpy array (got {type(array).__name__})"
            )
        as_dtype(array.dtype, "Buffer.from_numpy")
        if any(s % array.itemsize for s in array.strides):
            array = np.ascontiguousarray(array)
        return cls._host(array)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """Host buffers: a zero-copy numpy view (synchronize the buffer's stream before reading
        what queued work writes). Device buffers: a host copy, complete on return.

        Returns
        -------
        numpy.ndarray
            The view (host) or the copy (device).
        """
        self._live("to_numpy")
        if self._array is not None:
            return self._array
        host = self.copy(device="cpu")
        if self._stream is not None:
            self._stream.synchronize()
        return cast("np.ndarray[Any, Any]", host._array)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        arr = self.to_numpy()
        if dtype is not None:
            arr = arr.astype(dtype)
        return arr.copy() if copy else arr

    # -- DLPack ------------------------------------------------------------------------------------

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0) if self.is_host else (2, self._device.id)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Export (zero-copy) through DLPack, every dtype included (bfloat16, float8)."""
        from . import dlpack as _dlpack

        self._live("__dlpack__")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(
                f"Buffer.__dlpack__: cannot export to device {dl_device} (the buffer is on "
                f"{self.__dlpack_device__()}; copy it with .to() first)"
            )
        if copy:
            return self.copy().__dlpack__(max_version=max_version)
        if not self.is_host and stream != -1 and self._stream is not None:
            # DLPack: stream None means the legacy default stream, -1 asks for no sync
            self._stream.synchronize()
        itemsize = self._dtype.itemsize
        strides = tuple(s // itemsize for s in self._strides)
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return _dlpack.to_dlpack(
            self._ptr,
            self._shape,
            strides,
            self._dtype,
            self.__dlpack_device__(),
            self,
            versioned=versioned,
        )

    @classmethod
    def from_dlpack(cls, obj: Any) -> Buffer:
        """A buffer over any DLPack producer's memory (zero-copy; numpy, cupy, torch...).

        Parameters
        ----------
        obj : object
            An object with ``__dlpack__``, or a DLPack capsule.

        Returns
        -------
        Buffer
            A buffer over the producer's memory (host, pinned host or CUDA).

        Raises
        ------
        ArgumentError
            When the tensor lives on a device other than the CPU or a CUDA GPU.
        DLPackError
            When ``obj`` is no DLPack producer, or its tensor is malformed or of an
            unsupported dtype.
        """
        from . import dlpack as _dlpack

        view = _dlpack.from_dlpack(obj)
        if view.device_type in (1, 3):  # kDLCPU, kDLCUDAHost
            return CPU().impl.import_dlpack(view)
        if view.device_type == 2:  # kDLCUDA
            return Accelerator(view.device_id).impl.import_dlpack(view)
        raise ArgumentError(
            f"Buffer.from_dlpack: unsupported device type {view.device_type} (expected a CPU "
            "or CUDA tensor)"
        )

    # -- factories ---------------------------------------------------------------------

    @classmethod
    def zeros(
        cls, shape: ShapeLike, dtype: DTypeLike = "float32", device: Device | str | None = None
    ) -> Buffer:
        """A zero-filled buffer (complete on return).

        Parameters
        ----------
        shape : int or tuple of int
            The buffer's shape.
        dtype : dtype-like, default "float32"
            The elements' dtype.
        device : Device or str, optional
            Where the buffer lives (default: the host).

        Returns
        -------
        Buffer
            The new buffer, all zeros.
        """
        buf = cls(dtype, shape, device=device)
        buf._fill(0, None)
        return buf

    @classmethod
    def scalar(
        cls, value: complex | bool, dtype: DTypeLike, device: Device | str | None = None
    ) -> Buffer:
        """A rank-0 buffer holding ``value``.

        Parameters
        ----------
        value : complex or bool
            The value, cast to ``dtype``.
        dtype : dtype-like
            The element's dtype.
        device : Device or str, optional
            Where the buffer lives (default: the host).

        Returns
        -------
        Buffer
            The new rank-0 buffer.
        """
        buf = cls(dtype, (), device=device)
        buf._fill(value, None)
        return buf

    @classmethod
    def mmap(
        cls,
        filename: str | os.PathLike[str],
        dtype: DTypeLike,
        shape: ShapeLike,
        mode: str = "r+",
        offset: int = 0,
    ) -> Buffer:
        """A host buffer over a memory-mapped file (``mode`` as for ``numpy.memmap``:
        ``"r"``, ``"r+"``, ``"w+"``, ``"c"``).

        Parameters
        ----------
        filename : str or os.PathLike
            The file to map.
        dtype : dtype-like
            The elements' dtype.
        shape : int or tuple of int
            The buffer's shape.
        mode : str, default "r+"
            ``"r"`` (read-only), ``"r+"`` (read-write), ``"w+"`` (create or overwrite) or
            ``"c"`` (copy-on-write).
        offset : int, default 0
            Byte offset of the first element in the file.

        Returns
        -------
        Buffer
            A host buffer over the mapping.

        Raises
        ------
        ArgumentError
            When ``dtype``, ``shape`` or ``mode`` is invalid, or the file cannot be mapped.
        """
        dt = as_dtype(dtype, "Buffer.mmap")
        dims = as_shape("Buffer.mmap", shape)
        if mode not in ("r", "r+", "w+", "c"):
            raise ArgumentError(
                f"Buffer.mmap: invalid mode (got {mode!r}; expected 'r', 'r+', 'w+' or 'c')"
            )
        try:
            arr = np.memmap(filename, dtype=dt, mode=cast(Any, mode), offset=offset, shape=dims)
        except (OSError, ValueError) as exc:
            raise ArgumentError(
                f"Buffer.mmap: cannot map {os.fspath(filename)!r} ({exc})"
            ) from None
        return cls._host(arr)

    def item(self) -> Any:
        """The value of a rank-0 buffer as a Python scalar.

        Returns
        -------
        object
            The element as a Python scalar (int, float, complex or bool).

        Raises
        ------
        ArgumentError
            When the buffer's rank is not 0.
        ShmemStateError
            When the buffer is closed.
        """
        self._live("item")
        if self.rank != 0:
            raise ArgumentError(
                f"Buffer.item: only rank-0 buffers have an item (got shape {self._shape})"
            )
        value = self.to_numpy()[()]
        return value.item() if hasattr(value, "item") else value

    # -- lifetime ---------------------------------------------------------------------

    def close(self, stream: DeviceContext | None = None) -> None:
        """Release this buffer's reference to its memory (device memory is freed when no view
        uses it any more); with ``stream``, after the work queued on it (cuda.core's
        ``Buffer.close(stream)``).

        Parameters
        ----------
        stream : DeviceContext, optional
            Synchronized first, so queued work using the buffer finishes before release.
        """
        if stream is not None and not self._closed:
            stream.synchronize()
        self._closed = True
        self._array = None
        self._mem = None


lend_class(Buffer)
