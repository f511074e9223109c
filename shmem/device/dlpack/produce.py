"""The DLPack producer: :func:`to_dlpack` wraps a pointer, shape, strides, dtype and device in a
capsule (legacy or versioned); every buffer kind of the runtime exports through it."""

from __future__ import annotations

import ctypes
import math
import operator
from typing import ClassVar

from ...dtypes import DTypeLike
from ...errors import (
    DLPackArgumentError,
    DLPackError,
    DLPackMemoryError,
)
from . import _release
from ._release import (
    _LIVE,
    _call_deleter,
)
from .abi import (
    _INT64_MAX,
    _MAX_NDIM,
    _NAME_LEGACY,
    _NAME_VERSIONED,
    DLPACK_VERSION,
    FLAG_READ_ONLY,
    DLDeviceType,
    DLManagedTensor,
    DLManagedTensorVersioned,
    _dtype_to_dl,
    _Py_IncRef,
    _PyCapsule_New,
    _PyMem_Malloc,
)


class _Export:
    """What ``manager_ctx`` points at: keeps ``owner`` alive until the deleter runs."""

    __slots__ = ("address", "owner")
    _registry: ClassVar[dict[int, int]] = _LIVE  # reachable even during interpreter teardown

    def __init__(self, address: int, owner: object) -> None:
        self.address = address
        self.owner = owner

    def __del__(self) -> None:
        # Runs when the deleter drops manager_ctx (CPython keeps any in-flight exception).
        registry = self._registry
        if registry.get(self.address) == id(self):
            del registry[self.address]


def live_exports() -> int:
    """Return how many tensors exported by :func:`to_dlpack` have not been deleted yet.

    Returns
    -------
    int
        Capsules alive and unconsumed, plus consumed tensors whose consumer has not called the
        deleter.
    """
    return len(_LIVE)


def _index(value: object, what: str, where: str) -> int:
    if isinstance(value, bool):
        raise DLPackArgumentError(f"{where}: {what} must be an integer (got {value!r})")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise DLPackArgumentError(f"{where}: {what} must be an integer (got {value!r})") from None


def _index_tuple(values: object, what: str, where: str, *, nonnegative: bool) -> tuple[int, ...]:
    if not isinstance(values, tuple | list):
        raise DLPackArgumentError(f"{where}: {what} must be a tuple of int (got {values!r})")
    out = tuple(_index(v, what, where) for v in values)
    low = 0 if nonnegative else -_INT64_MAX
    if any(not low <= v <= _INT64_MAX for v in out):
        bound = "0 <= n" if nonnegative else "|n|"
        raise DLPackArgumentError(
            f"{where}: {what} out of range (got {out}; expected {bound} < 2**63)"
        )
    return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def _check_device(device: object, where: str) -> tuple[int, int]:
    if not (isinstance(device, tuple) and len(device) == 2):
        raise DLPackArgumentError(
            f"{where}: device must be a (device_type, device_id) tuple (got {device!r})"
        )
    dev_type = _index(device[0], "device_type", where)
    dev_id = _index(device[1], "device_id", where)
    if dev_type not in DLDeviceType._value2member_map_:
        raise DLPackArgumentError(
            f"{where}: unknown device type (got {dev_type}; expected a DLDeviceType, "
            "e.g. 1 (kDLCPU), 2 (kDLCUDA), 3 (kDLCUDAHost))"
        )
    if not 0 <= dev_id < 1 << 31:
        raise DLPackArgumentError(
            f"{where}: device id out of range (got {dev_id}; expected 0 <= id < 2**31)"
        )
    return dev_type, dev_id


def to_dlpack(
    ptr: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...] | None,
    dtype: DTypeLike,
    device: tuple[int, int],
    owner: object,
    *,
    versioned: bool,
    readonly: bool = False,
) -> object:
    """Wrap memory at ``ptr`` in a DLPack capsule.

    Parameters
    ----------
    ptr : int
        Address of element ``[0, ..., 0]`` (a host or a device pointer; never dereferenced
        here). May be 0 only when the tensor has no elements.
    shape : tuple of int
        Extent of each dimension (``()`` for a 0-d tensor).
    strides : tuple of int or None
        Stride of each dimension in **elements** (as DLPack counts them; may be negative or
        zero), or None for a C-contiguous tensor. Strides are always written to the tensor.
    dtype : numpy.dtype or dtype-like
        Element type; see :func:`dtype_to_dl`.
    device : tuple of int
        ``(device_type, device_id)``, e.g. ``(1, 0)`` for host memory (kDLCPU), ``(2, d)``
        for CUDA device ``d`` (kDLCUDA), ``(3, 0)`` for pinned host memory (kDLCUDAHost).
    owner : object
        Whatever keeps the memory valid (an array, a buffer, a heap allocation). The capsule,
        then the consumer, holds a reference to it until the deleter runs.
    versioned : bool
        Produce a DLPack >= 1.0 ``"dltensor_versioned"`` capsule (version 1.1) rather than a
        legacy ``"dltensor"`` one.
    readonly : bool, optional
        Set ``DLPACK_FLAG_BITMASK_READ_ONLY``. Only versioned capsules can say so.

    Returns
    -------
    PyCapsule
        A capsule named ``"dltensor_versioned"`` or ``"dltensor"``. A consumer renames it and
        calls the deleter when done; a capsule dropped unconsumed calls the deleter itself.

    Raises
    ------
    DLPackDTypeError
        Unsupported dtype.
    DLPackArgumentError
        Malformed pointer, shape, strides or device.
    DLPackError
        ``readonly=True`` with ``versioned=False``.
    """
    where = "to_dlpack"
    code, bits, lanes = _dtype_to_dl(dtype, where)
    shape_t = _index_tuple(shape, "shape", where, nonnegative=True)
    ndim = len(shape_t)
    if ndim > _MAX_NDIM:
        raise DLPackArgumentError(
            f"{where}: too many dimensions (got {ndim}; expected at most {_MAX_NDIM})"
        )
    if strides is None:
        strides_t = _contiguous_strides(shape_t)
    else:
        strides_t = _index_tuple(strides, "strides", where, nonnegative=False)
        if len(strides_t) != ndim:
            raise DLPackArgumentError(
                f"{where}: strides do not match shape (got {len(strides_t)} strides for "
                f"shape {shape_t}; expected {ndim})"
            )
    dev_type, dev_id = _check_device(device, where)
    address = _index(ptr, "ptr", where)
    if not 0 <= address < 1 << 64:
        raise DLPackArgumentError(f"{where}: pointer out of range (got {address:#x})")
    if address == 0 and math.prod(shape_t) != 0:
        raise DLPackArgumentError(
            f"{where}: null pointer for a non-empty tensor (got ptr=0, shape={shape_t})"
        )
    if readonly and not versioned:
        raise DLPackError(
            f"{where}: a legacy capsule cannot be read-only (got readonly=True, "
            "versioned=False; expected versioned=True for read-only memory)"
        )

    fns = _release._RELEASE  # looked up per export: tests swap it
    struct: type[DLManagedTensor] | type[DLManagedTensorVersioned]
    struct = DLManagedTensorVersioned if versioned else DLManagedTensor
    head = ctypes.sizeof(struct)  # 80 or 64: a multiple of 8, so int64 arrays follow aligned
    total = head + 2 * 8 * ndim
    block: int | None = _PyMem_Malloc(total)
    if not block:
        raise DLPackMemoryError(f"{where}: PyMem_Malloc({total}) failed")
    ctypes.memset(block, 0, total)

    managed = struct.from_address(block)
    tensor = managed.dl_tensor
    tensor.data = address
    tensor.device.device_type = dev_type
    tensor.device.device_id = dev_id
    tensor.ndim = ndim
    tensor.dtype.code = code
    tensor.dtype.bits = bits
    tensor.dtype.lanes = lanes
    tensor.byte_offset = 0
    if ndim:
        arrays = (ctypes.c_int64 * (2 * ndim)).from_address(block + head)
        arrays[:] = list(shape_t + strides_t)
        tensor.shape = ctypes.cast(block + head, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = ctypes.cast(block + head + 8 * ndim, ctypes.POINTER(ctypes.c_int64))
    if isinstance(managed, DLManagedTensorVersioned):
        managed.version.major, managed.version.minor = DLPACK_VERSION
        managed.flags = FLAG_READ_ONLY if readonly else 0
        deleter, destructor, name = fns.versioned_deleter, fns.versioned_destructor, _NAME_VERSIONED
    else:
        deleter, destructor, name = fns.legacy_deleter, fns.legacy_destructor, _NAME_LEGACY

    record = _Export(block, owner)
    _Py_IncRef(record)  # owned by manager_ctx; dropped by the deleter
    managed.manager_ctx = id(record)
    managed.deleter = deleter
    _LIVE[block] = id(record)
    del managed, tensor, record
    try:
        capsule: object = _PyCapsule_New(block, name, destructor)
    except Exception:
        _call_deleter(deleter, block)
        raise
    return capsule
