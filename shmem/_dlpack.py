"""The DLPack producer and consumer moved to :mod:`shmem.dlpack` (``abi``, ``produce``,
``consume``, ``_release``); this module keeps the old import path working."""

from __future__ import annotations

from .dlpack import (
    DLPACK_VERSION,
    DLDataType,
    DLDataTypeCode,
    DLDevice,
    DLDeviceType,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLPackView,
    DLTensor,
    dl_to_dtype,
    dtype_to_dl,
    from_dlpack,
    live_exports,
    to_dlpack,
)
from .errors import DLPackArgumentError, DLPackDTypeError, DLPackError

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
