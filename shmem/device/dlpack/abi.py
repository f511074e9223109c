"""The DLPack ABI: structs, enums, capsule names and dtype codes of dlpack.h (DLPack 1.1),
and the CPython C API calls the producer and consumer make through ctypes."""

from __future__ import annotations

import ctypes
import datetime
import enum
from typing import Any, Final, TypeVar, cast

import ml_dtypes
import numpy as np

from ...dtypes import DTypeLike
from ...errors import (
    DLPackDTypeError,
)

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
    (np.dtype(np.complex64), _C.kDLComplex, 64),
    (np.dtype(np.complex128), _C.kDLComplex, 128),
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
