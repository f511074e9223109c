"""The device layer: where memory lives and code runs, with nothing of the runtime.

It holds :class:`Device` (``CPU()``, ``Accelerator(id)``), :class:`DeviceContext` (a stream
with its events, kernels and copies), :class:`Buffer` (typed memory of one device, its views
and DLPack exchange) and the cuda.core-style memory resources. Each device has a host half
(:mod:`shmem.device.host`, numpy) and a CUDA half (:mod:`shmem.device.cuda`, cuda.core and
NVRTC, loaded on first use) behind the protocols of :mod:`shmem.device.impl`.

The runtime (World, Team, SHMEMBuffer, signals, heaps) builds on this package and IPC
(:mod:`shmem.ipc`) on both; nothing here imports either.
"""

from __future__ import annotations

from typing import Any

from .context import Block, DeviceContext, Dim3, DriverVersion, Event, Function
from .devices import CPU, Accelerator, Device, DeviceAttributes, MemoryInfo, as_device, lend_kind
from .memory import Buffer
from .resources import DeviceMemoryResource, HostMemoryResource, MemoryResource


def _host() -> Any:
    from . import host

    return host


def _cuda() -> Any:
    from . import cuda  # cuda.core and NVRTC load here, when a CUDA device is first asked for

    return cuda


lend_kind("cpu", _host)
lend_kind("cuda", _cuda)

__all__ = [
    "CPU",
    "Accelerator",
    "Block",
    "Buffer",
    "Device",
    "DeviceAttributes",
    "DeviceContext",
    "DeviceMemoryResource",
    "Dim3",
    "DriverVersion",
    "Event",
    "Function",
    "HostMemoryResource",
    "MemoryInfo",
    "MemoryResource",
    "as_device",
]
