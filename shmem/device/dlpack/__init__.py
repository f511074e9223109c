"""A self-contained DLPack producer and consumer (pure Python and ctypes).

numpy cannot export or import ``bfloat16`` or float8 through DLPack, and device buffers
(plain integer pointers) have no producer at all, so this module builds and reads DLPack
capsules itself: :func:`to_dlpack` wraps any pointer, shape, strides, dtype and device in a
capsule, and :func:`from_dlpack` turns a capsule (or any object with ``__dlpack__``) into a
:class:`DLPackView`, whose :meth:`~DLPackView.to_numpy` gives a zero-copy array of host memory.

The layouts and codes follow ``include/dlpack/dlpack.h`` of DLPack 1.1 (dmlc/dlpack); both the
legacy ``DLManagedTensor`` (capsule name ``"dltensor"``) and ``DLManagedTensorVersioned``
(``"dltensor_versioned"``) are produced and consumed.

Modules: ``abi`` (the structs, codes and dtype tables of dlpack.h), ``produce``
(:func:`to_dlpack`), ``consume`` (:func:`from_dlpack`, :class:`DLPackView`) and ``_release`` (the
deleters and capsule destructors of exported tensors, including the numpy-deleter trick).
"""

from __future__ import annotations

from .abi import (
    DLPACK_VERSION,
    DLDataType,
    DLDataTypeCode,
    DLDevice,
    DLDeviceType,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
    dl_to_dtype,
    dtype_to_dl,
)
from .consume import DLPackView, from_dlpack
from .produce import live_exports, to_dlpack

__all__ = [
    "DLPACK_VERSION",
    "DLDataType",
    "DLDataTypeCode",
    "DLDevice",
    "DLDeviceType",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "DLPackVersion",
    "DLPackView",
    "DLTensor",
    "dl_to_dtype",
    "dtype_to_dl",
    "from_dlpack",
    "live_exports",
    "to_dlpack",
]
