"""GPU IPC through cuda.core: an IPC-enabled ``DeviceMemoryResource`` per buffer.

The exporter serves the memory pool's file descriptor (``mr.allocation_handle.handle``) over
the IPC service, and sends the buffer's cuda.core IPC descriptor as the reply's extra bytes in
a fixed format (:func:`encode_descriptor`: a magic, a version, the size and the driver's
opaque payload; never pickle, which would run code chosen by whoever wrote the bytes). The
importer checks the format, rebuilds the pool (``DeviceMemoryResource.from_allocation_handle``)
and the buffer (``Buffer.from_ipc_descriptor``), and wraps it as a :class:`shmem.Buffer`.

Written against cuda-core 1.2.2; it needs a GPU to run.
"""

from __future__ import annotations

import importlib
import struct
from typing import Any

import numpy as np

from ..device.memory import Buffer
from ..device.views import contiguous_strides
from ..dtypes import as_dtype
from ..errors import DescriptorError
from .descriptor import IpcDescriptor

__all__ = ["allocate", "decode_descriptor", "encode_descriptor", "import_"]

_MAGIC = b"SHGD"
_HEAD = struct.Struct("<4sBQI")  # magic, version, size, payload length
_VERSION = 1
_MAX_PAYLOAD = 4096


def encode_descriptor(payload: bytes, size: int) -> bytes:
    """cuda.core's IPC buffer descriptor (its opaque payload and size) as fixed bytes."""
    return _HEAD.pack(_MAGIC, _VERSION, size, len(payload)) + payload


def decode_descriptor(blob: bytes) -> tuple[bytes, int]:
    """``(payload, size)`` from :func:`encode_descriptor`'s bytes; DescriptorError if bad."""
    if len(blob) < _HEAD.size:
        raise DescriptorError("import_: bad GPU descriptor from the exporter (too short)")
    magic, version, size, n = _HEAD.unpack_from(blob)
    if magic != _MAGIC or version != _VERSION or n > _MAX_PAYLOAD:
        raise DescriptorError(
            f"import_: bad GPU descriptor from the exporter (magic {magic!r}, version "
            f"{version}, payload {n} bytes; expected {_MAGIC!r} version {_VERSION})"
        )
    if len(blob) != _HEAD.size + n:
        raise DescriptorError(
            f"import_: bad GPU descriptor from the exporter (got {len(blob)} bytes; expected "
            f"{_HEAD.size + n})"
        )
    return bytes(blob[_HEAD.size :]), int(size)


def _ipc_descriptor_type() -> Any:
    return importlib.import_module("cuda.core._memory._ipc").IPCBufferDescriptor


def _cc() -> Any:
    return importlib.import_module("cuda.core")


class _GpuExport:
    def __init__(
        self, device: Any, nbytes: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> None:
        from ..device.cuda import CudaDevice

        cc = _cc()
        self.device = CudaDevice.get(device.id)
        self.device_id = device.id
        dev = self.device.current()
        opts = cc.DeviceMemoryResourceOptions(ipc_enabled=True, max_size=max(nbytes, 1 << 21))
        self.mr = cc.DeviceMemoryResource(dev, opts)
        self.stream = dev.default_stream
        self.mem = self.mr.allocate(max(nbytes, 1), stream=self.stream)
        self.nbytes, self.dtype, self.shape = nbytes, dtype, shape

    def fd(self) -> int:
        return int(self.mr.allocation_handle.handle)

    def export_extra(self) -> bytes:
        _, (payload, size) = self.mem.ipc_descriptor.__reduce__()
        return encode_descriptor(bytes(payload), int(size))

    def buffer(self) -> Buffer:
        from ..device.cuda.memory import _DeviceMemory

        mem = _DeviceMemory(int(self.mem.handle), self.nbytes, self.mem)
        return Buffer._device_view(
            self.device,
            mem,
            self.dtype,
            self.shape,
            contiguous_strides(self.shape, self.dtype.itemsize),
        )

    def close(self) -> None:
        self.mem.close(self.stream)


class _GpuImport:
    def __init__(self, desc: IpcDescriptor, fd: int, extra: bytes) -> None:
        from ..device.cuda import CudaDevice

        cc = _cc()
        self.device = CudaDevice.get(desc.device)
        dev = self.device.current()
        payload, size = decode_descriptor(extra)
        ipc_desc = _ipc_descriptor_type()._init(payload, size)
        self.mr = cc.DeviceMemoryResource.from_allocation_handle(dev, fd)
        self.stream = dev.default_stream
        self.mem = cc.Buffer.from_ipc_descriptor(self.mr, ipc_desc, stream=self.stream)
        self.desc = desc

    def buffer(self) -> Buffer:
        from ..device.cuda.memory import _DeviceMemory

        d = self.desc
        dt = as_dtype(d.dtype, "import_")
        mem = _DeviceMemory(int(self.mem.handle), d.nbytes, self.mem)
        return Buffer._device_view(
            self.device, mem, dt, d.shape, contiguous_strides(d.shape, dt.itemsize)
        )

    def close(self) -> None:
        self.mem.close(self.stream)


def allocate(device: Any, nbytes: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> _GpuExport:
    return _GpuExport(device, nbytes, dtype, shape)


def import_(desc: IpcDescriptor, fd: int, extra: bytes) -> _GpuImport:
    return _GpuImport(desc, fd, extra)
