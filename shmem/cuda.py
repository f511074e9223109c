"""Public CUDA helpers for code built on the runtime (the GPU collectives, benchmarks).

The runtime's own kernels (``*.cu`` files shipped in the ``shmem`` and ``collectives``
packages) are compiled with NVRTC for the device's architecture once per process, through an
on-disk cubin cache. These functions load and launch them and move bytes by device pointer on
a cuda.core stream. Importing this module needs no GPU; CUDA loads on the first call.

All copies and memsets here are stream-ordered (``*_async``): they are queued on ``stream``
and complete in order with the work on it.
"""

from __future__ import annotations

from typing import Protocol

from .device import cuda as _cuda
from .device.cuda import nvrtc as _nvrtc
from .device.devices import Device

__all__ = [
    "CudaStream",
    "Kernel",
    "as_stream",
    "compile_module",
    "default_stream_synchronize",
    "device_synchronize",
    "is_capturing",
    "launch",
    "load_kernel",
    "make_current",
    "memcpy_async",
    "memset_async",
    "record_event",
    "wait_event",
]


class CudaStream(Protocol):
    """A cuda.core ``Stream`` (what the functions here need of it)."""

    @property
    def handle(self) -> object: ...

    def sync(self) -> None: ...


class Kernel(Protocol):
    """A loaded kernel (cuda.core ``Kernel``)."""


def compile_module(device_id: int, relative: str) -> None:
    """Compile (or load from the kernel cache) the package file ``relative`` (e.g.
    ``"collectives/kernels/allreduce.cu"``) for device ``device_id`` now, so a later
    :func:`load_kernel` does not compile while peers wait."""
    _cuda.kernel_module(device_id, relative)


def load_kernel(device_id: int, relative: str, name: str) -> Kernel:
    """Kernel ``name`` of the package's CUDA file ``relative`` for device ``device_id``
    (compiled once per process, cached on disk)."""
    return _cuda.kernel(device_id, relative, name)  # type: ignore[no-any-return]


def launch(
    stream: CudaStream,
    kernel: Kernel,
    grid: int,
    block: int,
    *args: object,
    cooperative: bool = False,
) -> None:
    """Queue ``kernel`` on ``stream`` (scalars as numpy scalars: ``np.uint64``, ``np.int32``).
    ``cooperative``: the driver refuses the launch unless every block can be resident at
    once (kernels whose blocks wait for each other)."""
    _cuda.launch(stream, kernel, grid, block, *args, cooperative=cooperative)


def memcpy_async(dst_ptr: int, src_ptr: int, nbytes: int, stream: CudaStream) -> None:
    """Queue a copy of ``nbytes`` between device, pinned or (synchronously for the host)
    pageable addresses on ``stream``."""
    _cuda.memcpy_async(dst_ptr, src_ptr, nbytes, stream)


def memset_async(ptr: int, value: int, nbytes: int, stream: CudaStream) -> None:
    """Queue setting ``nbytes`` bytes at device address ``ptr`` to ``value`` on ``stream``."""
    _cuda.memset_async(ptr, value, nbytes, stream)


def record_event(stream: CudaStream) -> object:
    """An event recorded on ``stream`` now (for :func:`wait_event` on another stream)."""
    return _cuda.record_event(stream)


def wait_event(stream: CudaStream, event: object) -> None:
    """Make later work on ``stream`` wait for ``event`` (no host blocking)."""
    _cuda.wait_event(stream, event)


def make_current(device_id: int) -> None:
    """Make device ``device_id``'s primary context current in the calling thread (a worker
    thread that launches kernels or allocates). cuda.core's ``Device`` objects are per
    thread: this one's must be made current in this thread."""
    from cuda.core import Device

    Device(device_id).set_current()


def device_synchronize(device_id: int) -> None:
    """Wait on the host for all work this process queued on the device, on every stream."""
    _cuda.device_sync(device_id)


def kernel_cache_dir() -> str | None:
    """The on-disk cubin cache directory, or None when the cache is off."""
    path = _nvrtc.cache_dir()
    return None if path is None else str(path)


def as_stream(stream: object, device: Device, where: str) -> CudaStream | None:
    """The cuda.core stream a GPU call is queued on: None for None (the caller picks its
    default), a GPU :class:`~shmem.DeviceContext`'s stream (it must be on ``device``), or a
    stream of another library (any object with ``__cuda_stream__``: torch, cupy).
    Anything else raises :class:`~shmem.errors.ArgumentError` naming ``where``."""
    from .device.context import DeviceContext
    from .errors import ArgumentError

    if stream is None:
        return None
    if isinstance(stream, DeviceContext):
        if stream.device != device or stream.api != "cuda":
            raise ArgumentError(
                f"{where}: stream must be on this rank's GPU (got a DeviceContext of "
                f"{stream.device.label}; expected one on {device.label})"
            )
        return stream.stream  # type: ignore[no-any-return]
    if hasattr(stream, "__cuda_stream__"):
        return _cuda.foreign_stream(device.id, stream)  # type: ignore[no-any-return]
    raise ArgumentError(
        f"{where}: invalid stream (got {type(stream).__name__}; expected None, a GPU "
        "DeviceContext or an object with __cuda_stream__, e.g. a torch or cupy stream)"
    )


def is_capturing(stream: CudaStream) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (a call must not wait on the host then)."""
    return bool(_cuda.is_capturing(stream))


def default_stream_synchronize(device: Device) -> None:
    """Wait for the work queued on ``device``'s default stream, where Buffers are allocated
    stream-ordered: before another stream uses a new Buffer, so its allocation came first."""
    _cuda.default_sync(device)
