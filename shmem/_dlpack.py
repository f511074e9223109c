"""A self-contained DLPack producer and consumer (pure Python and ctypes).

numpy cannot export or import ``bfloat16`` or float8 through DLPack, and device buffers
(plain integer pointers) have no producer at all, so this module builds and reads DLPack
capsules itself: :func:`to_dlpack` wraps any pointer, shape, strides, dtype and device in a
capsule, and :func:`from_dlpack` turns a capsule (or any object with ``__dlpack__``) into a
:class:`DLPackView`, whose :meth:`~DLPackView.to_numpy` gives a zero-copy array of host memory.

The layouts and codes follow ``include/dlpack/dlpack.h`` of DLPack 1.1 (dmlc/dlpack); both the
legacy ``DLManagedTensor`` (capsule name ``"dltensor"``) and ``DLManagedTensorVersioned``
(``"dltensor_versioned"``) are produced and consumed.

Memory management of exported tensors
-------------------------------------
Each export is one ``PyMem_Malloc`` block holding the managed tensor and its shape and strides;
``manager_ctx`` holds a strong reference to a small record that keeps ``owner`` alive. The
deleter frees the block and drops that reference; the capsule destructor calls the deleter when
the capsule dies unconsumed. Consumers may call the deleter, and CPython calls the capsule
destructor, while an exception is propagating; Python code run then (a ctypes callback) cannot
leave that exception in place, and CPython replaces it with a ``SystemError``. So where numpy's
own DLPack exporter has exactly these semantics (numpy 2.1 to 2.x: the deleter does
``PyMem_Free(self); Py_XDECREF(self->manager_ctx)`` and the capsule destructor calls
``managed->deleter`` unless the capsule was renamed), its C functions are used as deleter and
capsule destructor, and checked once at import. Otherwise equivalent ctypes callbacks are used,
which behave the same except while an exception is propagating.
"""

from __future__ import annotations

import ctypes
import datetime
import enum
import math
import operator
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeVar, cast

import ml_dtypes
import numpy as np

from .dtypes import DTypeLike
from .errors import (
    DLPackArgumentError,
    DLPackDTypeError,
    DLPackError,
    DLPackMemoryError,
)

__all__ = [
    "DLPACK_VERSION",
    "DLDataType",
    "DLDataTypeCode",
    "DLDevice",
    "DLDeviceType",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "DLPackArgumentError",
    "DLPackDTypeError",
    "DLPackError",
    "DLPackVersion",
    "DLPackView",
    "DLTensor",
    "dl_to_dtype",
    "dtype_to_dl",
    "from_dlpack",
    "live_exports",
    "to_dlpack",
]

#: The DLPack version this module implements (stamped into versioned capsules).
DLPACK_VERSION: Final = (1, 1)

#: ``DLPACK_FLAG_BITMASK_READ_ONLY`` and ``DLPACK_FLAG_BITMASK_IS_COPIED`` of dlpack.h.
FLAG_READ_ONLY: Final = 1 << 0
FLAG_IS_COPIED: Final = 1 << 1

_MAX_NDIM: Final = 64
_INT64_MAX: Final = (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# dlpack.h: enums and structures
# --------------------------------------------------------------------------------------------


class DLDeviceType(enum.IntEnum):
    """``DLDeviceType`` of dlpack.h (DLPack 1.1)."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17
    kDLTrn = 18


class DLDataTypeCode(enum.IntEnum):
    """``DLDataTypeCode`` of dlpack.h (DLPack 1.1)."""

    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLOpaqueHandle = 3
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6
    kDLFloat8_e3m4 = 7
    kDLFloat8_e4m3 = 8
    kDLFloat8_e4m3b11fnuz = 9
    kDLFloat8_e4m3fn = 10
    kDLFloat8_e4m3fnuz = 11
    kDLFloat8_e5m2 = 12
    kDLFloat8_e5m2fnuz = 13
    kDLFloat8_e8m0fnu = 14
    kDLFloat6_e2m3fn = 15
    kDLFloat6_e3m2fn = 16
    kDLFloat4_e2m1fn = 17


#: Devices whose memory the CPU can read and write directly (what numpy also accepts).
_HOST_DEVICES: Final = frozenset(
    {
        DLDeviceType.kDLCPU,
        DLDeviceType.kDLCUDAHost,
        DLDeviceType.kDLROCMHost,
        DLDeviceType.kDLCUDAManaged,
    }
)


class DLPackVersion(ctypes.Structure):
    """``DLPackVersion``: ``uint32_t major, minor``."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]
    major: int
    minor: int


class DLDevice(ctypes.Structure):
    """``DLDevice``: ``DLDeviceType device_type`` (an ``int32_t`` enum), ``int32_t device_id``."""

    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
    device_type: int
    device_id: int


class DLDataType(ctypes.Structure):
    """``DLDataType``: ``uint8_t code, bits``, ``uint16_t lanes``."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
    code: int
    bits: int
    lanes: int


class DLTensor(ctypes.Structure):
    """``DLTensor``; ``strides`` count elements, not bytes, and may be NULL (compact)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]
    data: int | None
    device: DLDevice
    ndim: int
    dtype: DLDataType
    shape: ctypes._Pointer[ctypes.c_int64]
    strides: ctypes._Pointer[ctypes.c_int64]
    byte_offset: int


class DLManagedTensor(ctypes.Structure):
    """Legacy ``DLManagedTensor`` (capsule name ``"dltensor"``).

    ``deleter`` is a ``void (*)(DLManagedTensor *)``, held here as its address.
    """

    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]
    dl_tensor: DLTensor
    manager_ctx: int | None
    deleter: int | None


class DLManagedTensorVersioned(ctypes.Structure):
    """``DLManagedTensorVersioned`` (DLPack >= 1.0, capsule name ``"dltensor_versioned"``).

    ``deleter`` is a ``void (*)(DLManagedTensorVersioned *)``, held here as its address.
    """

    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]
    version: DLPackVersion
    manager_ctx: int | None
    deleter: int | None
    flags: int
    dl_tensor: DLTensor


def _offset(struct: type[ctypes.Structure], name: str) -> int:
    offset: int = cast(Any, struct).__dict__[name].offset
    return offset


_LEGACY_CTX_OFFSET: Final = _offset(DLManagedTensor, "manager_ctx")
_LEGACY_DELETER_OFFSET: Final = _offset(DLManagedTensor, "deleter")
_VERSIONED_CTX_OFFSET: Final = _offset(DLManagedTensorVersioned, "manager_ctx")
_VERSIONED_DELETER_OFFSET: Final = _offset(DLManagedTensorVersioned, "deleter")


# --------------------------------------------------------------------------------------------
# The C API through ctypes. Private prototypes bound to ctypes.pythonapi's symbols, so the
# shared ``ctypes.pythonapi.X.argtypes`` other libraries may set are left alone. PYFUNCTYPE
# keeps the GIL held during the call (PyMem_* and PyCapsule_* need it).
# --------------------------------------------------------------------------------------------

_api = ctypes.pythonapi
_c_void_p = ctypes.c_void_p
_py_object = ctypes.py_object

_PyCapsule_New = ctypes.PYFUNCTYPE(_py_object, _c_void_p, _c_void_p, _c_void_p)(
    ("PyCapsule_New", _api)
)
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, _py_object, _c_void_p)(
    ("PyCapsule_IsValid", _api)
)
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(_c_void_p, _py_object, _c_void_p)(
    ("PyCapsule_GetPointer", _api)
)
_PyCapsule_GetName = ctypes.PYFUNCTYPE(ctypes.c_char_p, _py_object)(("PyCapsule_GetName", _api))
_PyCapsule_SetName = ctypes.PYFUNCTYPE(ctypes.c_int, _py_object, _c_void_p)(
    ("PyCapsule_SetName", _api)
)
_PyCapsule_GetDestructor = ctypes.PYFUNCTYPE(_c_void_p, _py_object)(
    ("PyCapsule_GetDestructor", _api)
)
# Raw-pointer variants for capsule destructors: the capsule is being deallocated there (its
# reference count is zero), so it must not be wrapped in a py_object (that would revive it).
_PyCapsule_IsValid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, _c_void_p, _c_void_p)(
    ("PyCapsule_IsValid", _api)
)
_PyCapsule_GetPointer_raw = ctypes.PYFUNCTYPE(_c_void_p, _c_void_p, _c_void_p)(
    ("PyCapsule_GetPointer", _api)
)
_PyMem_Malloc = ctypes.PYFUNCTYPE(_c_void_p, ctypes.c_size_t)(("PyMem_Malloc", _api))
_PyMem_Free = ctypes.PYFUNCTYPE(None, _c_void_p)(("PyMem_Free", _api))
_Py_IncRef = ctypes.PYFUNCTYPE(None, _py_object)(("Py_IncRef", _api))
_Py_DecRef = ctypes.PYFUNCTYPE(None, _c_void_p)(("Py_DecRef", _api))

# Prototype used to call a producer's deleter: with the GIL held (some deleters assume it).
_DELETER_CALL = ctypes.PYFUNCTYPE(None, _c_void_p)
# Prototype of the ctypes callbacks (deleters and capsule destructors): void f(void *).
_CALLBACK = ctypes.CFUNCTYPE(None, _c_void_p)

_T = TypeVar("_T")
_CAPSULE_TYPE: Final[type] = type(datetime.datetime_CAPI)


def _immortal(obj: _T) -> _T:
    """Take one reference to ``obj`` that is never dropped, and return ``obj``.

    Capsule names are stored by pointer (never copied) and capsules can outlive this module at
    interpreter exit, so their names and the ctypes callbacks must never be freed.
    """
    _Py_IncRef(obj)
    return obj


def _static_cstring(text: bytes) -> int:
    buf = _immortal(ctypes.create_string_buffer(text))
    return ctypes.addressof(buf)


_NAME_LEGACY: Final = _static_cstring(b"dltensor")
_NAME_LEGACY_USED: Final = _static_cstring(b"used_dltensor")
_NAME_VERSIONED: Final = _static_cstring(b"dltensor_versioned")
_NAME_VERSIONED_USED: Final = _static_cstring(b"used_dltensor_versioned")


# --------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------

_C = DLDataTypeCode
_DTYPE_TABLE: Final[tuple[tuple[np.dtype[Any], int, int], ...]] = (
    (np.dtype(np.float16), _C.kDLFloat, 16),
    (np.dtype(np.float32), _C.kDLFloat, 32),
    (np.dtype(np.float64), _C.kDLFloat, 64),
    (np.dtype(ml_dtypes.bfloat16), _C.kDLBfloat, 16),
    (np.dtype(ml_dtypes.float8_e4m3fn), _C.kDLFloat8_e4m3fn, 8),
    (np.dtype(ml_dtypes.float8_e5m2), _C.kDLFloat8_e5m2, 8),
    (np.dtype(np.int8), _C.kDLInt, 8),
    (np.dtype(np.int16), _C.kDLInt, 16),
    (np.dtype(np.int32), _C.kDLInt, 32),
    (np.dtype(np.int64), _C.kDLInt, 64),
    (np.dtype(np.uint8), _C.kDLUInt, 8),
    (np.dtype(np.uint16), _C.kDLUInt, 16),
    (np.dtype(np.uint32), _C.kDLUInt, 32),
    (np.dtype(np.uint64), _C.kDLUInt, 64),
    (np.dtype(np.bool_), _C.kDLBool, 8),
)
_TO_DL: Final = {dt: (int(code), bits) for dt, code, bits in _DTYPE_TABLE}
_FROM_DL: Final = {(int(code), bits): dt for dt, code, bits in _DTYPE_TABLE}
_SUPPORTED_NAMES: Final = ", ".join(sorted(dt.name for dt, _, _ in _DTYPE_TABLE))


def _dtype_to_dl(dtype: DTypeLike, where: str) -> tuple[int, int, int]:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is not None and dt in _TO_DL:
        code, bits = _TO_DL[dt]
        return code, bits, 1
    if dt is not None and not dt.isnative and dt.newbyteorder("=") in _TO_DL:
        raise DLPackDTypeError(
            f"{where}: unsupported dtype (got {dt.str}, non-native byte order; "
            "expected native byte order, as DLPack requires)"
        )
    got = dt.name if dt is not None else repr(dtype)
    raise DLPackDTypeError(
        f"{where}: unsupported dtype (got {got}; expected one of {_SUPPORTED_NAMES})"
    )


def dtype_to_dl(dtype: DTypeLike) -> tuple[int, int, int]:
    """Return the DLPack ``(code, bits, lanes)`` of a numpy dtype.

    Parameters
    ----------
    dtype : numpy.dtype or dtype-like
        One of float16/32/64, bfloat16, float8_e4m3fn, float8_e5m2, int8-64, uint8-64, bool
        (``ml_dtypes`` provides the bfloat16 and float8 dtypes), in native byte order.

    Returns
    -------
    tuple of int
        ``(code, bits, lanes)``, e.g. ``(4, 16, 1)`` for bfloat16; ``lanes`` is always 1.

    Raises
    ------
    DLPackDTypeError
        The dtype is not supported (a ``ValueError`` and ``BufferError``).
    """
    return _dtype_to_dl(dtype, "dtype_to_dl")


def _dl_to_dtype(code: int, bits: int, lanes: int, where: str) -> np.dtype[Any]:
    dt = _FROM_DL.get((code, bits)) if lanes == 1 else None
    if dt is None:
        try:
            code_name = DLDataTypeCode(code).name
        except ValueError:
            code_name = "unknown"
        raise DLPackDTypeError(
            f"{where}: unsupported dtype (got code={code} ({code_name}), bits={bits}, "
            f"lanes={lanes}; expected lanes=1 and one of {_SUPPORTED_NAMES})"
        )
    return dt


def dl_to_dtype(code: int, bits: int, lanes: int) -> np.dtype[Any]:
    """Return the numpy dtype of a DLPack ``(code, bits, lanes)`` (inverse of `dtype_to_dl`).

    Parameters
    ----------
    code : int
        A ``DLDataTypeCode`` value (``kDLFloat`` = 2, ``kDLBfloat`` = 4, ...).
    bits : int
        Bits per lane.
    lanes : int
        Vector lanes; only 1 is supported.

    Returns
    -------
    numpy.dtype

    Raises
    ------
    DLPackDTypeError
        No supported dtype has this code and width, or ``lanes != 1``.
    """
    return _dl_to_dtype(code, bits, lanes, "dl_to_dtype")


# --------------------------------------------------------------------------------------------
# Release functions: the deleters and capsule destructors of exported tensors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReleaseFns:
    """Addresses of the C functions that free exported tensors."""

    legacy_deleter: int
    versioned_deleter: int
    legacy_destructor: int
    versioned_destructor: int
    native: bool  # numpy's C functions (exception-safe) rather than ctypes callbacks


def _call_deleter(deleter: int | None, managed: int) -> None:
    """Call a producer's ``deleter(managed)`` with the GIL held (nothing when it is NULL)."""
    if deleter:
        _DELETER_CALL(deleter)(managed)


def _free_export(managed: int | None, ctx_offset: int) -> None:
    # What numpy's deleters do: free the single block, then drop manager_ctx.
    if not managed:
        return
    ctx = ctypes.c_void_p.from_address(managed + ctx_offset).value
    _PyMem_Free(managed)
    if ctx:
        _Py_DecRef(ctx)


def _legacy_deleter(managed: int | None) -> None:
    _free_export(managed, _LEGACY_CTX_OFFSET)


def _versioned_deleter(managed: int | None) -> None:
    _free_export(managed, _VERSIONED_CTX_OFFSET)


def _destroy_capsule(capsule: int | None, name: int, deleter_offset: int) -> None:
    # As the DLPack spec mandates: a capsule that still has its original name (not consumed)
    # owns the tensor, so its destructor calls the deleter.
    if capsule and _PyCapsule_IsValid_raw(capsule, name):
        managed: int = _PyCapsule_GetPointer_raw(capsule, name)
        _call_deleter(ctypes.c_void_p.from_address(managed + deleter_offset).value, managed)


def _legacy_destructor(capsule: int | None) -> None:
    _destroy_capsule(capsule, _NAME_LEGACY, _LEGACY_DELETER_OFFSET)


def _versioned_destructor(capsule: int | None) -> None:
    _destroy_capsule(capsule, _NAME_VERSIONED, _VERSIONED_DELETER_OFFSET)


def _callback_address(fn: Any) -> int:
    callback = _CALLBACK(fn)
    _immortal(callback)
    address = ctypes.cast(callback, ctypes.c_void_p).value
    if not address:  # pragma: no cover - ctypes never makes a NULL callback
        raise DLPackMemoryError("_dlpack: could not create a ctypes callback")
    return address


_CTYPES_RELEASE: Final = _ReleaseFns(
    legacy_deleter=_callback_address(_legacy_deleter),
    versioned_deleter=_callback_address(_versioned_deleter),
    legacy_destructor=_callback_address(_legacy_destructor),
    versioned_destructor=_callback_address(_versioned_destructor),
    native=False,
)


class _Probe:
    pass


def _deleter_frees_like_numpy(
    deleter: int, struct: type[ctypes.Structure], ctx_offset: int
) -> bool:
    """Check that ``deleter`` drops ``manager_ctx`` (and frees the block with ``PyMem_Free``)."""
    size = ctypes.sizeof(struct)
    block: int | None = _PyMem_Malloc(size)
    if not block:
        return False
    ctypes.memset(block, 0, size)
    token = _Probe()
    before = sys.getrefcount(token)
    _Py_IncRef(token)
    ctypes.c_void_p.from_address(block + ctx_offset).value = id(token)
    _call_deleter(deleter, block)
    return sys.getrefcount(token) == before


def _numpy_release() -> _ReleaseFns | None:
    """numpy's C deleters and capsule destructors, where their semantics are known."""
    version = np.lib.NumpyVersion(np.__version__)
    if not (version >= "2.1.0" and version < "3.0.0.dev0"):
        return None
    arr = np.zeros(1, dtype=np.uint8)
    try:
        legacy = arr.__dlpack__()
        versioned = arr.__dlpack__(max_version=(1, 0))
    except (TypeError, BufferError):
        return None
    if not (
        _PyCapsule_IsValid(legacy, _NAME_LEGACY) and _PyCapsule_IsValid(versioned, _NAME_VERSIONED)
    ):
        return None
    legacy_managed = DLManagedTensor.from_address(_PyCapsule_GetPointer(legacy, _NAME_LEGACY))
    versioned_managed = DLManagedTensorVersioned.from_address(
        _PyCapsule_GetPointer(versioned, _NAME_VERSIONED)
    )
    fns = _ReleaseFns(
        legacy_deleter=legacy_managed.deleter or 0,
        versioned_deleter=versioned_managed.deleter or 0,
        legacy_destructor=_PyCapsule_GetDestructor(legacy) or 0,
        versioned_destructor=_PyCapsule_GetDestructor(versioned) or 0,
        native=True,
    )
    del legacy_managed, versioned_managed, legacy, versioned  # numpy frees its own exports
    if not all(
        (fns.legacy_deleter, fns.versioned_deleter, fns.legacy_destructor, fns.versioned_destructor)
    ):
        return None
    if not (
        _deleter_frees_like_numpy(fns.legacy_deleter, DLManagedTensor, _LEGACY_CTX_OFFSET)
        and _deleter_frees_like_numpy(
            fns.versioned_deleter, DLManagedTensorVersioned, _VERSIONED_CTX_OFFSET
        )
    ):
        return None
    return fns


_RELEASE: _ReleaseFns = _numpy_release() or _CTYPES_RELEASE


# --------------------------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------------------------

#: Exported tensors whose deleter has not run: block address -> id of its _Export record.
_LIVE: dict[int, int] = {}


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

    fns = _RELEASE
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
