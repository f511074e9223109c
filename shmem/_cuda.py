"""The CUDA device kind, loaded only when a CUDA device is asked for (or pinned memory).

Split by responsibility: :mod:`shmem._cuda_device` (devices, driver handles),
:mod:`shmem._cuda_memory` (memory, copies, fills, ``CudaImpl``) and :mod:`shmem._cuda_kernels`
(kernel loading, launches, ``GpuStream``). This module gathers their names. Without a driver
or without cuda.core everything degrades to "no GPU": :func:`device_count` is 0,
:func:`pinned_host_array` returns None, :func:`CudaDevice.get` raises
``DeviceUnavailableError``.
"""

from __future__ import annotations

from ._cuda_device import (
    CudaDevice,
    device_count,
    device_sync,
    kernel_sources,
)
from ._cuda_kernels import (
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
from ._cuda_memory import (
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
