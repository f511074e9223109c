"""CUDA kernels and streams: loading the runtime's kernels (NVRTC, cached cubins), launches,
async copies and memsets by pointer, events, and GpuStream (the CUDA StreamImpl)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ArgumentError
from ..context import DriverVersion
from ..devices import Device
from .device import CudaDevice, _cc, _check, _drv

if TYPE_CHECKING:
    from ..context import Dim3, Event, Function


def _kernel(device: CudaDevice, name: str) -> Any:
    return _compiled(device.id, "strided_copy.cu", name)


def _compiled(device_id: int, filename: str, name: str) -> Any:
    return kernel(device_id, f"shmem/kernels/{filename}", name)


@functools.cache
def kernel_module(device_id: int, relative: str) -> Any:
    from . import nvrtc as _nvrtc

    dev = CudaDevice.get(device_id)
    dev.current()
    return _nvrtc.compile_cubin(_nvrtc.source_of(relative), name=Path(relative).name, arch=dev.arch)


@functools.cache
def kernel(device_id: int, relative: str, name: str) -> Any:
    """Kernel ``name`` of the package's CUDA file ``relative`` (e.g.
    ``"collectives/kernels/allreduce.cu"``) for device ``device_id``: compiled with NVRTC
    for its architecture once per process, through the on-disk cache
    (:mod:`shmem.device.cuda.nvrtc`)."""
    return kernel_module(device_id, relative).get_kernel(name)


def device_sync(device_id: int) -> None:
    """Wait for all work queued on the device by this process, on every stream
    (``cuCtxSynchronize`` on its primary context)."""
    CudaDevice.get(device_id).current()
    _check(_drv().cuCtxSynchronize(), "cuCtxSynchronize")


def launch(
    stream: Any, fn: Any, grid: int, block: int, *args: Any, cooperative: bool = False
) -> None:
    """Launch ``fn`` on a cuda.core stream (scalars must be numpy scalars). ``cooperative``:
    the driver refuses the launch unless every block can be resident at once (kernels whose
    blocks wait for each other)."""
    cc = _cc()
    config = cc.LaunchConfig(grid=grid, block=block, is_cooperative=cooperative)
    cc.launch(stream, config, fn, *args)


def memcpy_async(dst_ptr: int, src_ptr: int, nbytes: int, stream: Any) -> None:
    """Queue ``cuMemcpyAsync`` of ``nbytes`` on a cuda.core stream."""
    if nbytes:
        _check(_drv().cuMemcpyAsync(dst_ptr, src_ptr, nbytes, stream.handle), "cuMemcpyAsync")


def memset_async(ptr: int, value: int, nbytes: int, stream: Any) -> None:
    """Queue ``cuMemsetD8Async`` of ``nbytes`` bytes on a cuda.core stream."""
    if nbytes:
        _check(_drv().cuMemsetD8Async(ptr, value, nbytes, stream.handle), "cuMemsetD8Async")


def is_capturing(stream: Any) -> bool:
    """Whether ``stream`` (a cuda.core stream) is capturing a CUDA graph now."""
    status = _check(_drv().cuStreamIsCapturing(stream.handle), "cuStreamIsCapturing")
    return int(status) != 0  # CU_STREAM_CAPTURE_STATUS_NONE is 0


def foreign_stream(device_id: int, obj: Any) -> Any:
    """A cuda.core stream over another library's stream (an object with
    ``__cuda_stream__``: a torch or cupy stream), on device ``device_id``."""
    dev = CudaDevice.get(device_id)
    dev.current()
    return _cc().Device(device_id).create_stream(obj)


def record_event(stream: Any) -> Any:
    """A cuda.core event recorded on ``stream``."""
    return stream.record()


def wait_event(stream: Any, event: Any) -> None:
    """Later work on ``stream`` waits for ``event`` (device-side)."""
    stream.wait(event)


class GpuStream:
    """The GPU side of a DeviceContext: a cuda.core Stream on one device."""

    def __init__(self, device: Device) -> None:
        self._device = CudaDevice.get(device.id)
        self._dev = self._device.current()
        # Blocking (CUDA's own default for cudaStreamCreate): ordered with the legacy default
        # stream, which allocates and frees the buffers made without a context.
        self.stream = self._dev.create_stream(options=_cc().StreamOptions(nonblocking=False))

    @property
    def handle(self) -> Any:
        return self.stream

    def record(self) -> Event:
        from ..context import Event

        self._device.current()
        return Event(self.stream.record(options=_cc().EventOptions(timing_enabled=True)))

    def wait(self, event: Event) -> None:
        if event._impl is not None:
            self.stream.wait(event._impl)
        else:  # a host event: wait on the host, then carry on (rare: mixed contexts)
            event.synchronize()

    def sync(self) -> None:
        self.stream.sync()

    def synchronize(self, label: str) -> None:
        self.stream.sync()

    def submit(self, fn: Any) -> None:
        """Host work after everything queued so far (the stream is synchronized first)."""
        self.stream.sync()
        fn()

    def compile(self, source_or_callable: object, name: str | None, options: Any) -> Function:
        from ..context import Function

        if not isinstance(source_or_callable, str) or not name:
            raise ArgumentError(
                "DeviceContext.compile_function: a GPU kernel needs CUDA C++ source text and "
                f"a kernel name (got {type(source_or_callable).__name__}, name={name!r})"
            )
        cc = _cc()
        self._device.current()
        opts = options or cc.ProgramOptions(arch=self._device.arch, std="c++17", name=name)
        program = cc.Program(source_or_callable, "c++", options=opts)
        return Function(name, self._device, program.compile("cubin").get_kernel(name))

    def launch(
        self, kernel: Any, args: tuple[Any, ...], grid: Dim3, block: Dim3, shmem_bytes: int
    ) -> None:
        from ..memory import Buffer

        cc = _cc()
        self._device.current()
        converted = []
        for arg in args:
            if isinstance(arg, Buffer):
                if arg.is_host and not arg.pinned:
                    raise ArgumentError(
                        "DeviceContext.enqueue_function: a pageable host Buffer cannot be "
                        "passed to a GPU kernel (expected device or pinned memory)"
                    )
                converted.append(arg._ptr)
            elif isinstance(arg, bool | int | float) and not isinstance(arg, np.generic):
                raise ArgumentError(
                    "DeviceContext.enqueue_function: pass scalars to GPU kernels as numpy "
                    f"scalars of the kernel's parameter type (got Python {type(arg).__name__} "
                    f"{arg!r}; e.g. np.int32(n), np.float32(x))"
                )
            else:
                converted.append(arg)
        config = cc.LaunchConfig(grid=tuple(grid), block=tuple(block), shmem_size=shmem_bytes)
        cc.launch(self.stream, config, kernel, *converted)

    def driver_version(self) -> DriverVersion:
        v = int(_check(_drv().cuDriverGetVersion(), "cuDriverGetVersion"))
        return DriverVersion(v // 1000, (v % 1000) // 10)

    def close(self) -> None:
        self.stream.close()
