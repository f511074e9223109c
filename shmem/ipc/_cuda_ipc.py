"""GPU IPC through cuda.core: an IPC-enabled ``DeviceMemoryResource`` per buffer.

The exporter serves the memory pool's file descriptor (``mr.allocation_handle.handle``) over
the IPC service, and sends the buffer's cuda.core IPC descriptor as the reply's extra bytes
(pickled: it only ever travels over the authenticated socket, from a process the importer has
checked is the exporter with its own uid, never inside the untrusted descriptor string). The
importer rebuilds the pool (``DeviceMemoryResource.from_allocation_handle``) and the buffer
(``Buffer.from_ipc_descriptor``), and wraps it as a :class:`shmem.Buffer`.

Written against cuda-core 1.2.2; it needs a GPU to run.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any

import numpy as np

from ..dtypes import as_dtype
from ..errors import DescriptorError
from ..memory import Buffer
from ..views import contiguous_strides
from .descriptor import IpcDescriptor

__all__ = ["allocate", "import_"]


def _cc() -> Any:
    return importlib.import_module("cuda.core")


class _GpuExport:
    def __init__(
        self, device: Any, nbytes: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> None:
        from .._cuda import CudaDevice

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
        return pickle.dumps(self.mem.ipc_descriptor)

    def buffer(self) -> Buffer:
        from .._cuda_memory import _DeviceMemory

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
        from .._cuda import CudaDevice

        cc = _cc()
        self.device = CudaDevice.get(desc.device)
        dev = self.device.current()
        try:
            ipc_desc = pickle.loads(extra)
        except Exception as exc:
            raise DescriptorError(
                f"import_: bad GPU descriptor from the exporter ({exc})"
            ) from None
        self.mr = cc.DeviceMemoryResource.from_allocation_handle(dev, fd)
        self.stream = dev.default_stream
        self.mem = cc.Buffer.from_ipc_descriptor(self.mr, ipc_desc, stream=self.stream)
        self.desc = desc

    def buffer(self) -> Buffer:
        from .._cuda_memory import _DeviceMemory

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
