"""The deleters and capsule destructors of exported DLPack tensors.

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
import sys
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ...errors import (
    DLPackMemoryError,
)
from .abi import (
    _CALLBACK,
    _DELETER_CALL,
    _LEGACY_CTX_OFFSET,
    _LEGACY_DELETER_OFFSET,
    _NAME_LEGACY,
    _NAME_VERSIONED,
    _VERSIONED_CTX_OFFSET,
    _VERSIONED_DELETER_OFFSET,
    DLManagedTensor,
    DLManagedTensorVersioned,
    _immortal,
    _Py_DecRef,
    _Py_IncRef,
    _PyCapsule_GetDestructor,
    _PyCapsule_GetPointer,
    _PyCapsule_GetPointer_raw,
    _PyCapsule_IsValid,
    _PyCapsule_IsValid_raw,
    _PyMem_Free,
    _PyMem_Malloc,
)

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
