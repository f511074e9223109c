"""The CUDA device kind, loaded only when a CUDA device is asked for (or pinned memory).

Split by responsibility, bottom up: :mod:`.device` (devices, driver handles), :mod:`.kernels`
(kernel loading, launches, ``GpuStream``), :mod:`.memory` (memory, copies, fills,
``CudaImpl``), and :mod:`.nvrtc` (compiling ``.cu`` sources). This module gathers their names
and lends ``CUDA`` to :class:`CudaDevice` (the device module sits below the implementation).
Without a driver or without cuda.core everything degrades to "no GPU": :func:`device_count`
is 0, :func:`pinned_host_array` returns None, :func:`CudaDevice.get` raises
``DeviceUnavailableError``.
"""

from __future__ import annotations

from .device import (
    CudaDevice,
    device_count,
    device_sync,
    kernel_sources,
)
from .kernels import (
    GpuStream,
    foreign_stream,
    is_capturing,
    kernel,
    kernel_module,
    launch,
    memcpy_async,
    memset_async,
    record_event,
    wait_event,
)
from .memory import (
    CUDA,
    CudaImpl,
    allocate,
    buffer_from_dlpack,
    copy,
    default_sync,
    fill,
    pinned_host_array,
)

__all__ = [
    "CUDA",
    "CudaDevice",
    "CudaImpl",
    "GpuStream",
    "allocate",
    "buffer_from_dlpack",
    "copy",
    "default_sync",
    "device_count",
    "device_sync",
    "fill",
    "foreign_stream",
    "is_capturing",
    "kernel",
    "kernel_module",
    "kernel_sources",
    "launch",
    "memcpy_async",
    "memset_async",
    "pinned_host_array",
    "record_event",
    "wait_event",
]

CudaDevice.lend_impl(CUDA)
