"""CUDA memory: allocation, pinned host memory, DLPack import, copies (contiguous, strided,
between GPUs), fills, and CudaImpl (the CUDA DeviceImpl)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..devices import Device
from ..views import is_contiguous
from .device import _THREADS, CudaDevice, _cc, _check, _drv, device_count
from .kernels import GpuStream, _kernel, memcpy_async

if TYPE_CHECKING:
    from ..context import DeviceContext
    from ..dlpack import DLPackView
    from ..memory import Buffer


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
    from ..memory import Buffer

    itemsize = view.dtype.itemsize
    shape = tuple(view.shape)
    strides = tuple(s * itemsize for s in view.strides)
    extent = sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) + itemsize
    mem = _DeviceMemory(view.ptr, extent if math.prod(shape) else 0, view)
    return Buffer._device_view(
        CudaDevice.get(view.device_id), mem, view.dtype, shape, strides, view.byte_offset
    )


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
    from ..views import contiguous_strides

    return contiguous_strides(shape, itemsize)


def fill(buf: Buffer, scalar: np.ndarray[Any, Any], ctx: Any) -> None:
    """Set every element of a device buffer to ``scalar`` (a 0-d array of its dtype)."""
    n = buf.num_elements
    if n == 0:
        return
    if not is_contiguous(buf.shape, buf.strides, buf.dtype.itemsize):
        from ..memory import Buffer

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
    ptr, h = buf._ptr, stream.handle
    size = buf.dtype.itemsize
    raw = np.ascontiguousarray(scalar.reshape(1))
    if size == 1:
        _check(drv.cuMemsetD8Async(ptr, int(raw.view(np.uint8)[0]), n, h), "cuMemsetD8Async")
    elif size == 2:
        _check(drv.cuMemsetD16Async(ptr, int(raw.view(np.uint16)[0]), n, h), "cuMemsetD16Async")
    elif size == 4:
        _check(drv.cuMemsetD32Async(ptr, int(raw.view(np.uint32)[0]), n, h), "cuMemsetD32Async")
    else:  # 8 or 16 bytes (float64, complex128, long double): each 32-bit word of the
        # element as one column of a 2-D memset whose pitch is the element
        for col, word in enumerate(raw.view(np.uint32).tolist()):
            _check(drv.cuMemsetD2D32Async(ptr + 4 * col, size, word, 1, n, h), "cuMemsetD2D32Async")
    if foreign:
        stream.sync()


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

    def wrap(self, device: Device, ptr: int, nbytes: int) -> Buffer:
        from ..memory import Buffer

        mem = _DeviceMemory(ptr, nbytes, None)
        return Buffer._device_view(device, mem, np.dtype(np.uint8), (nbytes,), (1,))


CUDA = CudaImpl()
