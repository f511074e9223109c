"""shmem: symmetric memory for mpirun jobs, on GPUs (NVSHMEM) and hosts (MPI-3 shared memory).

>>> import shmem
>>> with shmem.init() as world:                        # doctest: +SKIP
...     x = world.zeros((1024,), "float32")            # same heap offset on every rank
...     right = (world.rank + 1) % world.world_size
...     x.put(right, np.full(1024, world.rank), signal=(0, 1))
...     world.wait_until(0, "ge", 1)
...     x.close()

``import shmem`` needs neither a GPU nor CUDA: backends load lazily.
"""

from __future__ import annotations

from . import (
    errors,
    ipc,  # on import, IPC lends itself to the device layer below it
)
from ._version import __version__
from .arena import Arena, ArenaStats
from .backends import Backend
from .buffer import SHMEMBuffer
from .callreport import CallLine
from .config import Config, load_config, parse_size
from .device import (
    CPU,
    Accelerator,
    Block,
    Buffer,
    Device,
    DeviceAttributes,
    DeviceContext,
    Dim3,
    DriverVersion,
    Event,
    Function,
    MemoryInfo,
)
from .dtypes import SUPPORTED_DTYPES, as_dtype
from .errors import (
    ArgumentError,
    AsyncExecutionError,
    AttentionArgumentError,
    BackendUnavailableError,
    CollectiveArgumentError,
    CollectiveMismatchError,
    ConfigError,
    CudaError,
    DescriptorError,
    DeviceUnavailableError,
    DLPackArgumentError,
    DLPackDTypeError,
    DLPackError,
    DLPackMemoryError,
    ExporterGoneError,
    GpuBindingError,
    GpuCollectiveError,
    HeapExhaustedError,
    IpcPermissionError,
    KernelCompileError,
    LaunchUsageError,
    LockTimeoutError,
    NvshmemError,
    NvshmemUnsupportedError,
    OpError,
    PeerFailedError,
    RemoteTimeoutError,
    SequenceParallelError,
    ShmemError,
    ShmemStateError,
    SignalTimeoutError,
    ViewError,
)
from .job import global_exit, pcontrol
from .signals import Cmp, SignalOp, SignalPad
from .threads import ThreadLevel
from .world import World, finalize, get_world, init

__all__ = [
    "CPU",
    "SUPPORTED_DTYPES",
    "Accelerator",
    "Arena",
    "ArenaStats",
    "ArgumentError",
    "AsyncExecutionError",
    "AttentionArgumentError",
    "Backend",
    "BackendUnavailableError",
    "Block",
    "Buffer",
    "CallLine",
    "Cmp",
    "CollectiveArgumentError",
    "CollectiveMismatchError",
    "Config",
    "ConfigError",
    "CudaError",
    "DLPackArgumentError",
    "DLPackDTypeError",
    "DLPackError",
    "DLPackMemoryError",
    "DescriptorError",
    "Device",
    "DeviceAttributes",
    "DeviceContext",
    "DeviceUnavailableError",
    "Dim3",
    "DriverVersion",
    "Event",
    "ExporterGoneError",
    "Function",
    "GpuBindingError",
    "GpuCollectiveError",
    "HeapExhaustedError",
    "IpcPermissionError",
    "KernelCompileError",
    "LaunchUsageError",
    "LockTimeoutError",
    "MemoryInfo",
    "NvshmemError",
    "NvshmemUnsupportedError",
    "OpError",
    "PeerFailedError",
    "RemoteTimeoutError",
    "SHMEMBuffer",
    "SequenceParallelError",
    "ShmemError",
    "ShmemStateError",
    "SignalOp",
    "SignalPad",
    "SignalTimeoutError",
    "ThreadLevel",
    "ViewError",
    "World",
    "__version__",
    "as_dtype",
    "errors",
    "finalize",
    "get_world",
    "global_exit",
    "init",
    "ipc",
    "load_config",
    "parse_size",
    "pcontrol",
]
