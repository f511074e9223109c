"""CUDA devices, streams, memory and kernels through cuda.core: the GPU half of
:mod:`shmem.device`, :mod:`shmem.context` and :mod:`shmem.memory`.

Imported only when a CUDA device is asked for (or pinned memory). Without a driver or without
cuda.core everything degrades to "no GPU": :func:`device_count` is 0, :func:`pinned_host_array`
returns None, :func:`CudaDevice.get` raises :class:`DeviceUnavailableError`.

cuda.core facts used here (cuda-core 1.2.2, cuda-bindings 13.4): ``Device(i).set_current()``
before streams or allocations; ``allocate(size, stream=...)`` with the stream required;
``launch`` passes a Python int as a 64-bit pointer, so scalars go as numpy scalars;
event subtraction needs ``EventOptions(timing_enabled=True)``; ``cuda.core.system`` queries
need NVML, so devices are counted with ``Device.get_all_devices()``.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .context import DriverVersion
from .device import Device, DeviceAttributes, MemoryInfo
from .errors import ArgumentError, CudaError, DeviceUnavailableError
from .views import is_contiguous

if TYPE_CHECKING:
    from .context import DeviceContext, Dim3, Event, Function
    from .dlpack import DLPackView
    from .memory import Buffer

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
    "kernel",
    "kernel_sources",
    "launch",
    "pinned_host_array",
]

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
_THREADS = 256
_PEER_ALREADY_ENABLED = 704  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


def _cc() -> Any:
    return importlib.import_module("cuda.core")


def _drv() -> Any:
    return importlib.import_module("cuda.bindings.driver")


def _check(result: Any, call: str) -> Any:
    """Unpack a cuda.bindings ``(err, *values)`` tuple, raising on error."""
    err, *values = result
    if int(err) != 0:
        _, text = _drv().cuGetErrorString(err)
        raise CudaError(f"{call}: CUDA error {int(err)} ({text.decode() if text else '?'})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _driver_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


@functools.cache
def device_count() -> int:
    """CUDA devices visible to this process; 0 without a driver or cuda.core."""
    if not _driver_present():
        return 0
    try:
        return len(_cc().Device.get_all_devices())
    except Exception:  # no cuda.core, no driver, a broken install: no GPU
        return 0


def kernel_sources() -> dict[str, str]:
    """The runtime's own CUDA C++ sources, by file name (compiled on first use)."""
    return {p.name: p.read_text() for p in sorted(KERNEL_DIR.glob("*.cu"))}


# -- devices ------------------------------------------------------------------------------------


class CudaDevice(Device):
    """A CUDA device, backed by ``cuda.core.Device``."""

    api = "cuda"
    _instances: dict[int, CudaDevice] = {}  # noqa: RUF012 - one per id, process-wide
    _lock = threading.Lock()

    def __init__(self, id: int) -> None:
        super().__init__(id)
        self._dev = _cc().Device(id)

    @classmethod
    def get(cls, device_id: int) -> CudaDevice:
        count = device_count()
        if not 0 <= device_id < count:
            raise DeviceUnavailableError(
                f"Accelerator({device_id}): no such CUDA device (got id {device_id}; this "
                f"process sees {count} device(s); without a GPU, driver or the 'gpu' extra "
                "it sees none)"
            )
        with cls._lock:
            if device_id not in cls._instances:
                cls._instances[device_id] = cls(device_id)
            return cls._instances[device_id]

    @property
    def impl(self) -> CudaImpl:
        return CUDA

    def current(self) -> Any:
        """Make this device current in this thread and return the cuda.core Device."""
        self._dev.set_current()
        return self._dev

    @property
    def cc_device(self) -> Any:
        return self._dev

    @property
    def name(self) -> str:
        return str(self._dev.name)

    @property
    def memory_info(self) -> MemoryInfo:
        self.current()
        free, total = _check(_drv().cuMemGetInfo(), "cuMemGetInfo")
        return MemoryInfo(free=int(free), total=int(total))

    @property
    def attributes(self) -> DeviceAttributes:
        props = self._dev.properties
        cc = self._dev.compute_capability
        return DeviceAttributes(
            multiprocessor_count=int(props.multiprocessor_count),
            compute_capability=(int(cc.major), int(cc.minor)),
            max_threads_per_block=int(props.max_threads_per_block),
        )

    @property
    def arch(self) -> str:
        """``"sm_90"`` for an H100."""
        return f"sm_{self._dev.arch}"

    @property
    def pci_bus_id(self) -> str:
        raw = _check(_drv().cuDeviceGetPCIBusId(32, self.id), "cuDeviceGetPCIBusId")
        return bytes(raw).split(b"\0", 1)[0].decode()

    @property
    def is_compatible(self) -> bool:
        cc = self._dev.compute_capability
        return (int(cc.major), int(cc.minor)) >= (7, 0)

    def can_access(self, peer: Device) -> bool:
        if peer.api != "cuda":
            return False
        return peer.id == self.id or bool(self._dev.can_access_peer(peer.id))

    def enable_peer_access(self, peer: Device) -> None:
        if peer == self:
            return
        if not self.can_access(peer):
            raise DeviceUnavailableError(
                f"Device.enable_peer_access: {self.label} cannot reach {peer.label} directly "
                "(no P2P path between them; copy through a DeviceContext instead)"
            )
        peer_dev = CudaDevice.get(peer.id)
        peer_cc = peer_dev.current()
        peer_ctx = peer_cc.context.handle
        # Buffers come from the peer's memory pool (cuMemAllocFromPoolAsync), which
        # cuCtxEnablePeerAccess does not map: the pool grants access itself.
        pool = peer_cc.memory_resource
        if hasattr(pool, "peer_accessible_by"):
            pool.peer_accessible_by.add(self.id)
        self.current()
        err, *_ = _drv().cuCtxEnablePeerAccess(peer_ctx, 0)
        if int(err) not in (0, _PEER_ALREADY_ENABLED):
            _check((err,), "cuCtxEnablePeerAccess")


# -- memory -------------------------------------------------------------------------------------


class _DeviceMemory:
    """Device memory: a cuda.core Buffer (or a foreign pointer kept alive by its owner)."""

    def __init__(self, ptr: int, nbytes: int, owner: Any) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.owner = owner


class _PinnedHolder:
    """Exposes pinned memory to numpy; keeps the cuda.core Buffer alive as the array's base."""

    def __init__(self, buf: Any, nbytes: int) -> None:
        self._buf = buf
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (int(buf.handle), False),
            "version": 3,
        }


def pinned_host_array(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
    """Page-locked host memory as a uint8 array, or None when there is no CUDA device."""
    if device_count() == 0:
        return None
    CudaDevice.get(0).current()
    buf = _cc().LegacyPinnedMemoryResource().allocate(max(nbytes, 1))
    return np.asarray(_PinnedHolder(buf, nbytes))


def _stream_of(device: Device, ctx: Any) -> Any:
    """``ctx``'s stream when it is a GPU context on ``device``, else ``device``'s default
    stream: kernels and allocations need a stream of the device they run on."""
    impl = None if ctx is None else ctx.stream_impl
    if isinstance(impl, GpuStream) and ctx.device == device:
        return impl.stream
    return CudaDevice.get(device.id).current().default_stream


def _foreign(device: Device, ctx: Any) -> bool:
    """``ctx`` is a GPU context on another device than ``device``."""
    return ctx is not None and isinstance(ctx.stream_impl, GpuStream) and ctx.device != device


def allocate(device: Device, nbytes: int, ctx: Any) -> _DeviceMemory:
    """Device memory of ``nbytes`` (stream-ordered on ``ctx``, else the default stream)."""
    dev = CudaDevice.get(device.id)
    stream = _stream_of(device, ctx)
    buf = dev.current().allocate(max(nbytes, 1), stream=stream)
    return _DeviceMemory(int(buf.handle), nbytes, buf)


def default_sync(device: Device) -> None:
    """Wait for work issued on ``device``'s default stream."""
    if not device.is_host:
        CudaDevice.get(device.id).current().default_stream.sync()


def buffer_from_dlpack(view: DLPackView) -> Buffer:
    """A device Buffer over a DLPack tensor's memory (zero-copy; ``view`` keeps it alive)."""
    from .memory import Buffer

    itemsize = view.dtype.itemsize
    shape = tuple(view.shape)
    strides = tuple(s * itemsize for s in view.strides)
    extent = sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) + itemsize
    mem = _DeviceMemory(view.ptr, extent if math.prod(shape) else 0, view)
    return Buffer._device_view(
        CudaDevice.get(view.device_id), mem, view.dtype, shape, strides, view.byte_offset
    )


# -- copies and fills ------------------------------------------------------------------------------


def _kernel(device: CudaDevice, name: str) -> Any:
    return _compiled(device.id, "strided_copy.cu", name)


def _compiled(device_id: int, filename: str, name: str) -> Any:
    return kernel(device_id, f"shmem/kernels/{filename}", name)


@functools.cache
def kernel_module(device_id: int, relative: str) -> Any:
    from . import _nvrtc

    dev = CudaDevice.get(device_id)
    dev.current()
    return _nvrtc.compile_cubin(_nvrtc.source_of(relative), name=Path(relative).name, arch=dev.arch)


@functools.cache
def kernel(device_id: int, relative: str, name: str) -> Any:
    """Kernel ``name`` of the package's CUDA file ``relative`` (e.g.
    ``"collectives/kernels/allreduce.cu"``) for device ``device_id``: compiled with NVRTC
    for its architecture once per process, through the on-disk cache (:mod:`shmem._nvrtc`)."""
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


def _launch_strided_copy(
    device: CudaDevice,
    stream: Any,
    dst_ptr: int,
    dst_strides: tuple[int, ...],
    src_ptr: int,
    src_strides: tuple[int, ...],
    shape: tuple[int, ...],
    itemsize: int,
) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    rank = max(len(shape), 1)
    meta = np.array(
        [*(shape or (1,)), *(dst_strides or (itemsize,)), *(src_strides or (itemsize,))],
        dtype=np.int64,
    )
    cc = _cc()
    dev = device.current()
    meta_dev = dev.allocate(meta.nbytes, stream=stream)
    meta_dev.copy_from(_host_view(meta), stream=stream)
    blocks = min(math.ceil(n / _THREADS), 32 * (device.attributes.multiprocessor_count or 1))
    config = cc.LaunchConfig(grid=blocks, block=_THREADS)
    cc.launch(
        stream,
        config,
        _kernel(device, "shmem_strided_copy"),
        dst_ptr,
        src_ptr,
        np.uint64(n),
        np.int32(rank),
        np.int32(itemsize),
        meta_dev,
    )
    meta_dev.close(stream)


def _host_view(arr: np.ndarray[Any, Any]) -> Any:
    """A cuda.core Buffer over host memory (non-owning) for ``copy_from``."""
    return _cc().Buffer.from_handle(int(arr.ctypes.data), arr.nbytes)


def memcpy_async(dst_ptr: int, src_ptr: int, nbytes: int, stream: Any) -> None:
    """Queue ``cuMemcpyAsync`` of ``nbytes`` on a cuda.core stream."""
    if nbytes:
        _check(_drv().cuMemcpyAsync(dst_ptr, src_ptr, nbytes, stream.handle), "cuMemcpyAsync")


def memset_async(ptr: int, value: int, nbytes: int, stream: Any) -> None:
    """Queue ``cuMemsetD8Async`` of ``nbytes`` bytes on a cuda.core stream."""
    if nbytes:
        _check(_drv().cuMemsetD8Async(ptr, value, nbytes, stream.handle), "cuMemsetD8Async")


def record_event(stream: Any) -> Any:
    """A cuda.core event recorded on ``stream``."""
    return stream.record()


def wait_event(stream: Any, event: Any) -> None:
    """Later work on ``stream`` waits for ``event`` (device-side)."""
    stream.wait(event)


def copy(dst: Buffer, src: Buffer, ctx: Any) -> None:
    """Copy ``src`` into ``dst`` where at least one side is device memory.

    Contiguous pairs are one ``cuMemcpyAsync`` (on ``ctx``'s stream, whatever its device);
    strided device views use the strided-copy kernel on their own device; strided host views
    are staged through a contiguous host copy. Kernels need a stream of their own device, so
    with a GPU ``ctx`` on another device the work goes on that device's default stream, with
    ``ctx`` synchronized before and the work after.
    """
    device = dst.device if not dst.is_host else src.device
    if dst.is_contiguous and src.is_contiguous:
        on_ctx = ctx is not None and isinstance(ctx.stream_impl, GpuStream)
        memcpy_async(
            dst._ptr,
            src._ptr,
            dst.nbytes,
            ctx.stream_impl.stream if on_ctx else _stream_of(device, ctx),
        )
        return
    foreign = _foreign(device, ctx)
    if foreign:
        ctx.synchronize()
    stream = _stream_of(device, ctx)
    if not dst.is_host and not src.is_host and dst.device != src.device:
        _copy_between_gpus(dst, src, ctx, stream)
    else:
        _copy_strided(dst, src, CudaDevice.get(device.id), stream)
    if foreign:
        stream.sync()


def _copy_strided(dst: Buffer, src: Buffer, gpu: CudaDevice, stream: Any) -> None:
    """A strided copy on ``gpu`` (both sides on ``gpu`` or the host), ordered on ``stream``."""
    if src.is_host:  # strided host source -> contiguous staging, then to the device view
        staged = np.ascontiguousarray(src.to_numpy())
        _scatter(gpu, stream, dst, int(staged.ctypes.data))
        stream.sync()  # the staging array must outlive the copy
        return
    if dst.is_host:  # strided device source -> contiguous staging on the device, then out
        tmp = _gather(gpu, stream, src)
        out = np.empty(dst.shape, dtype=dst.dtype)
        memcpy_async(int(out.ctypes.data), int(tmp.handle), out.nbytes, stream)
        stream.sync()
        np.copyto(dst.to_numpy(), out)
        tmp.close(stream)
        return
    itemsize = dst.dtype.itemsize
    _launch_strided_copy(
        gpu, stream, dst._ptr, dst.strides, src._ptr, src.strides, src.shape, itemsize
    )


def _gather(gpu: CudaDevice, stream: Any, src: Buffer) -> Any:
    """A contiguous copy (new device memory on ``gpu``) of the strided device view ``src``."""
    itemsize = src.dtype.itemsize
    tmp = gpu.current().allocate(max(src.nbytes, 1), stream=stream)
    _launch_strided_copy(
        gpu,
        stream,
        int(tmp.handle),
        _contig(src.shape, itemsize),
        src._ptr,
        src.strides,
        src.shape,
        itemsize,
    )
    return tmp


def _scatter(gpu: CudaDevice, stream: Any, dst: Buffer, src_ptr: int) -> None:
    """Copy ``dst.nbytes`` contiguous bytes at ``src_ptr`` into the strided device view ``dst``."""
    itemsize = dst.dtype.itemsize
    tmp = gpu.current().allocate(max(dst.nbytes, 1), stream=stream)
    memcpy_async(int(tmp.handle), src_ptr, dst.nbytes, stream)
    _launch_strided_copy(
        gpu,
        stream,
        dst._ptr,
        dst.strides,
        int(tmp.handle),
        _contig(dst.shape, itemsize),
        dst.shape,
        itemsize,
    )
    tmp.close(stream)


def _copy_between_gpus(dst: Buffer, src: Buffer, ctx: Any, stream: Any) -> None:
    """A strided copy between two GPUs, ordered on ``stream`` (a stream of ``dst``'s device).

    Each kernel touches only its own GPU's memory (pool memory is not mapped on peers unless
    access was granted): ``src`` is gathered on its GPU, one contiguous ``cuMemcpyAsync``
    crosses, and the result is scattered into ``dst`` on its GPU.
    """
    src_ptr, gathered = src._ptr, None
    if not src.is_contiguous:
        src_stream = _stream_of(src.device, ctx)
        gathered = _gather(CudaDevice.get(src.device.id), src_stream, src)
        src_stream.sync()  # the copy below is ordered on the other device's stream
        src_ptr = int(gathered.handle)
    gpu = CudaDevice.get(dst.device.id)
    gpu.current()  # a default stream (CU_STREAM_LEGACY) means the current device's
    if dst.is_contiguous:
        memcpy_async(dst._ptr, src_ptr, dst.nbytes, stream)
    else:
        _scatter(gpu, stream, dst, src_ptr)
    if gathered is not None:
        stream.sync()  # the gathered copy must outlive the cross-device copy
        gathered.close()


def _contig(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    from .views import contiguous_strides

    return contiguous_strides(shape, itemsize)


def fill(buf: Buffer, scalar: np.ndarray[Any, Any], ctx: Any) -> None:
    """Set every element of a device buffer to ``scalar`` (a 0-d array of its dtype)."""
    n = buf.num_elements
    if n == 0:
        return
    if not is_contiguous(buf.shape, buf.strides, buf.dtype.itemsize):
        from .memory import Buffer

        own = ctx if ctx is not None and ctx.device == buf.device else None
        tmp = Buffer(buf.dtype, buf.shape, device=buf.device, stream=own)
        fill(tmp, scalar, own)
        copy(buf, tmp, ctx)
        return
    foreign = _foreign(buf.device, ctx)
    if foreign:  # memsets go on a stream of the buffer's device; order by waiting
        ctx.synchronize()
    stream = _stream_of(buf.device, ctx)
    drv = _drv()
    bits = scalar.reshape(1).view(
        {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[buf.dtype.itemsize]
    )[0]
    ptr, h = buf._ptr, stream.handle
    size = buf.dtype.itemsize
    if size == 1:
        _check(drv.cuMemsetD8Async(ptr, int(bits), n, h), "cuMemsetD8Async")
    elif size == 2:
        _check(drv.cuMemsetD16Async(ptr, int(bits), n, h), "cuMemsetD16Async")
    elif size == 4:
        _check(drv.cuMemsetD32Async(ptr, int(bits), n, h), "cuMemsetD32Async")
    else:  # 8 bytes: the low and high words as two columns of a pitch-8 2-D memset
        lo, hi = int(bits) & 0xFFFFFFFF, int(bits) >> 32
        _check(drv.cuMemsetD2D32Async(ptr, 8, lo, 1, n, h), "cuMemsetD2D32Async")
        _check(drv.cuMemsetD2D32Async(ptr + 4, 8, hi, 1, n, h), "cuMemsetD2D32Async")
    if foreign:
        stream.sync()


# -- streams ------------------------------------------------------------------------------------


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
        from .context import Event

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
        from .context import Function

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
        from .memory import Buffer

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


# -- the CUDA device kind -------------------------------------------------------------------------


class CudaImpl:
    """The CUDA DeviceImpl (``device.impl`` of every CUDA device): cuda.core memory, copies
    by ``cuMemcpyAsync`` or the strided-copy kernel, fills by ``cuMemset*``, cuda.core
    streams."""

    api = "cuda"
    is_host = False

    def allocate(
        self,
        device: Device,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        pinned: bool,
        stream: DeviceContext | None,
    ) -> tuple[np.ndarray[Any, Any] | None, object, bool]:
        return None, allocate(device, math.prod(shape) * dtype.itemsize, stream), False

    def copy(self, dst: Buffer, src: Buffer, ctx: DeviceContext | None) -> None:
        host_queue = ctx if ctx is not None and not isinstance(ctx.stream_impl, GpuStream) else None
        if host_queue is not None:
            host_queue.synchronize()  # work queued on the host stream comes first
        copy(dst, src, ctx)
        if host_queue is not None:
            for buf in (dst, src):
                if not buf.is_host:
                    default_sync(buf.device)
                    break

    def fill(self, buf: Buffer, scalar: np.ndarray[Any, Any], ctx: DeviceContext | None) -> None:
        fill(buf, scalar, ctx)

    def wait_unordered(self, device: Device) -> None:
        default_sync(device)

    def create_stream(self, device: Device) -> GpuStream:
        return GpuStream(device)

    def import_dlpack(self, view: DLPackView) -> Buffer:
        return buffer_from_dlpack(view)


CUDA = CudaImpl()
