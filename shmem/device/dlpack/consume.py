"""The DLPack consumer: :func:`from_dlpack` turns a capsule (or any ``__dlpack__`` object)
into a :class:`DLPackView`, whose ``to_numpy`` is a zero-copy view of host memory."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import (
    DLPackError,
)
from ._release import (
    _call_deleter,
)
from .abi import (
    _CAPSULE_TYPE,
    _HOST_DEVICES,
    _MAX_NDIM,
    _NAME_LEGACY,
    _NAME_LEGACY_USED,
    _NAME_VERSIONED,
    _NAME_VERSIONED_USED,
    DLPACK_VERSION,
    FLAG_READ_ONLY,
    DLDeviceType,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLTensor,
    _dl_to_dtype,
    _PyCapsule_GetName,
    _PyCapsule_GetPointer,
    _PyCapsule_IsValid,
    _PyCapsule_SetName,
)
from .produce import _contiguous_strides

# --------------------------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------------------------


class _Consumed:
    """Holds a consumed tensor; calls its deleter exactly once when garbage-collected."""

    __slots__ = ("__weakref__", "_finalizer")

    def __init__(self, deleter: int | None, managed: int) -> None:
        self._finalizer = weakref.finalize(self, _call_deleter, deleter, managed)
        # At exit, leak rather than free memory that arrays may still point at.
        self._finalizer.atexit = False


@dataclass(frozen=True)
class DLPackView:
    """A consumed DLPack tensor, which keeps the producer's memory alive.

    The producer's deleter is called once, when the view and every array made by
    :meth:`to_numpy` are gone.

    Attributes
    ----------
    ptr : int
        ``DLTensor.data`` (0 when NULL); the first element is at ``ptr + byte_offset``.
    shape : tuple of int
        Extent of each dimension.
    strides : tuple of int
        Stride of each dimension in **elements**, as DLPack counts them (filled in when the
        producer passed NULL); also available as ``strides_in_elements``, and in bytes as
        ``byte_strides``.
    dtype : numpy.dtype
        Element type (bfloat16 and float8 come from ``ml_dtypes``).
    device_type, device_id : int
        ``DLDevice`` of the memory (``DLDeviceType`` values: 1 CPU, 2 CUDA, 3 CUDA host...).
    byte_offset : int
        ``DLTensor.byte_offset``.
    readonly : bool
        The producer set ``DLPACK_FLAG_BITMASK_READ_ONLY`` (versioned capsules only).
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]
    device_type: int
    device_id: int
    byte_offset: int
    readonly: bool
    _keepalive: object = field(repr=False, compare=False)

    @property
    def device(self) -> tuple[int, int]:
        """``(device_type, device_id)``, as ``__dlpack_device__`` returns it."""
        return self.device_type, self.device_id

    @property
    def data_ptr(self) -> int:
        """Address of element ``[0, ..., 0]``: ``ptr + byte_offset``."""
        return self.ptr + self.byte_offset

    @property
    def strides_in_elements(self) -> tuple[int, ...]:
        """Strides in elements: the same as ``strides``."""
        return self.strides

    @property
    def byte_strides(self) -> tuple[int, ...]:
        """Strides in bytes, as numpy counts them."""
        return tuple(s * self.dtype.itemsize for s in self.strides)

    def to_numpy(self) -> np.ndarray[Any, np.dtype[Any]]:
        """Return a zero-copy numpy array of this tensor (host-accessible memory only).

        The array keeps this view, hence the producer's memory, alive. It is read-only when
        the tensor is.

        Returns
        -------
        numpy.ndarray
            Same dtype (bfloat16 and float8 included), shape and strides (in bytes).

        Raises
        ------
        DLPackError
            The memory is on a device the CPU cannot address (e.g. kDLCUDA).
        """
        if self.device_type not in _HOST_DEVICES:
            try:
                dev_name = DLDeviceType(self.device_type).name
            except ValueError:
                dev_name = "unknown"
            raise DLPackError(
                "DLPackView.to_numpy: memory is not host-accessible (got device "
                f"({self.device_type}, {self.device_id}) {dev_name}; expected one of "
                + ", ".join(f"{int(d)} ({d.name})" for d in sorted(_HOST_DEVICES))
                + ")"
            )
        if math.prod(self.shape) == 0:
            empty = np.empty(self.shape, dtype=self.dtype)
            empty.flags.writeable = not self.readonly
            return empty
        holder = _HostArray(self)
        base = np.asarray(holder)
        return base.view(self.dtype)


class _HostArray:
    """Exposes a view's host memory through ``__array_interface__``; the array's base."""

    __slots__ = ("__array_interface__", "view")

    def __init__(self, view: DLPackView) -> None:
        self.view = view
        self.__array_interface__ = {
            "version": 3,
            "shape": view.shape,
            # Raw bytes of the element size: numpy then reinterprets them as view.dtype,
            # which also covers dtypes with no typestr of their own (bfloat16, float8).
            "typestr": f"|V{view.dtype.itemsize}",
            "data": (view.data_ptr, view.readonly),
            "strides": view.byte_strides,
        }


def _consume(capsule: object, used_name: int) -> None:
    """Rename a capsule ``"used_..."``: the consumer now owns the tensor and its deleter."""
    if _PyCapsule_SetName(capsule, used_name) != 0:  # pragma: no cover - cannot fail
        raise DLPackError("from_dlpack: PyCapsule_SetName failed")


def from_dlpack(obj: object) -> DLPackView:
    """Consume a DLPack tensor: a capsule, or an object with ``__dlpack__``.

    ``obj.__dlpack__(max_version=(1, 1))`` is called, or ``obj.__dlpack__()`` when the
    producer does not take ``max_version``. The capsule is renamed ``"used_dltensor"`` /
    ``"used_dltensor_versioned"`` as the protocol requires, and the producer's deleter is
    called once the returned view and all arrays made from it are gone.

    Long because the capsule's ownership passes in one straight sequence (obtain, check the
    name, read the header, check the version, check the tensor, rename, wrap), and each
    refusal on the way must leave the capsule consumed or not exactly as the protocol says.

    Parameters
    ----------
    obj : object
        A ``"dltensor"`` or ``"dltensor_versioned"`` capsule, or an object with ``__dlpack__``.

    Returns
    -------
    DLPackView

    Raises
    ------
    DLPackError
        Not a DLPack object or capsule, capsule already consumed, unsupported major version,
        or malformed tensor. A capsule passed in directly is left unconsumed when the tensor
        is rejected (its destructor then frees it); one obtained from ``__dlpack__``, or of
        an unsupported major version (as dlpack.h says), is consumed and deleted.
    DLPackDTypeError
        The tensor's dtype is not supported.
    """
    where = "from_dlpack"
    owned = False
    if type(obj) is _CAPSULE_TYPE:
        capsule = obj
    else:
        method = getattr(obj, "__dlpack__", None)
        if method is None:
            raise DLPackError(
                f"{where}: not a DLPack object (got {type(obj).__name__}; expected an "
                "object with __dlpack__ or a DLPack capsule)"
            )
        try:
            capsule = method(max_version=DLPACK_VERSION)
        except TypeError:  # a producer older than DLPack 1.0 takes no max_version
            capsule = method()
        owned = True
        if type(capsule) is not _CAPSULE_TYPE:
            raise DLPackError(
                f"{where}: __dlpack__ returned no capsule (got {type(capsule).__name__})"
            )

    if _PyCapsule_IsValid(capsule, _NAME_VERSIONED):
        versioned, name, used_name = True, _NAME_VERSIONED, _NAME_VERSIONED_USED
    elif _PyCapsule_IsValid(capsule, _NAME_LEGACY):
        versioned, name, used_name = False, _NAME_LEGACY, _NAME_LEGACY_USED
    else:
        raw_name = _PyCapsule_GetName(capsule)
        got = raw_name.decode(errors="replace") if raw_name is not None else None
        if got in ("used_dltensor", "used_dltensor_versioned"):
            raise DLPackError(
                f"{where}: capsule already consumed (got a capsule named {got!r}; expected "
                "'dltensor' or 'dltensor_versioned')"
            )
        raise DLPackError(
            f"{where}: not a DLPack capsule (got a capsule named {got!r}; expected "
            "'dltensor' or 'dltensor_versioned')"
        )

    managed: int = _PyCapsule_GetPointer(capsule, name)
    flags = 0
    if versioned:
        head = DLManagedTensorVersioned.from_address(managed)
        deleter = head.deleter
        if head.version.major != DLPACK_VERSION[0]:
            # dlpack.h: only the fields up to `flags` may be read; call the deleter.
            got_version = (head.version.major, head.version.minor)
            _consume(capsule, used_name)
            _call_deleter(deleter, managed)
            raise DLPackError(
                f"{where}: unsupported DLPack version (got {got_version}; expected major "
                f"version {DLPACK_VERSION[0]})"
            )
        flags = head.flags
        tensor = head.dl_tensor
    else:
        legacy = DLManagedTensor.from_address(managed)
        deleter = legacy.deleter
        tensor = legacy.dl_tensor

    try:
        fields = _read_tensor(tensor, where)
    except DLPackError:
        if owned:  # nobody else can consume it: free it now, with no exception in flight
            _consume(capsule, used_name)
            _call_deleter(deleter, managed)
        raise

    _consume(capsule, used_name)
    keep = _Consumed(deleter, managed)
    ptr, shape, strides, dtype, dev_type, dev_id, byte_offset = fields
    return DLPackView(
        ptr=ptr,
        shape=shape,
        strides=strides,
        dtype=dtype,
        device_type=dev_type,
        device_id=dev_id,
        byte_offset=byte_offset,
        readonly=bool(flags & FLAG_READ_ONLY),
        _keepalive=keep,
    )


def _read_tensor(
    tensor: DLTensor, where: str
) -> tuple[int, tuple[int, ...], tuple[int, ...], np.dtype[Any], int, int, int]:
    ndim = tensor.ndim
    if not 0 <= ndim <= _MAX_NDIM:
        raise DLPackError(
            f"{where}: unsupported number of dimensions (got {ndim}; expected 0..{_MAX_NDIM})"
        )
    dtype = _dl_to_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes, where)
    if ndim and not tensor.shape:
        raise DLPackError(f"{where}: malformed tensor (got ndim={ndim} and a NULL shape)")
    shape = tuple(tensor.shape[i] for i in range(ndim))
    if any(n < 0 for n in shape):
        raise DLPackError(f"{where}: malformed tensor (got negative shape {shape})")
    strides = (
        tuple(tensor.strides[i] for i in range(ndim))
        if ndim and tensor.strides
        else _contiguous_strides(shape)
    )
    ptr = tensor.data or 0
    if ptr == 0 and math.prod(shape) != 0:
        raise DLPackError(f"{where}: malformed tensor (got a NULL data pointer for shape {shape})")
    return (
        ptr,
        shape,
        strides,
        dtype,
        tensor.device.device_type,
        tensor.device.device_id,
        tensor.byte_offset,
    )
