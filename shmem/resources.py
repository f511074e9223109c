"""Memory resources and the cuda.core-style Buffer API (``cuda.core.experimental`` names).

A memory resource is an object that allocates :class:`~shmem.Buffer` s of raw bytes
(``mr.allocate(size)``) and says who can reach them. Three kinds:

* :class:`HostMemoryResource`: ordinary (or, with ``pinned=True``, page-locked) host memory.
* :class:`IpcHostMemoryResource`: host memory in a ``memfd`` that other processes of the same
  user import (``buf.get_ipc_descriptor()`` / ``Buffer.from_ipc_descriptor(mr, desc)``).
* :class:`DeviceMemoryResource`: GPU memory of one device; ``ipc_enabled=True`` gives an
  IPC-enabled pool (cuda.core's ``DeviceMemoryResource`` with IPC), the same flow as above.

The IPC flow then reads as in cuda.core::

    mr = IpcHostMemoryResource()                  # or DeviceMemoryResource(0, ipc_enabled=True)
    buf = mr.allocate(1 << 20)
    desc = buf.get_ipc_descriptor()               # str(desc) travels to the other process
    other = Buffer.from_ipc_descriptor(mr, desc)  # in the importer: the same memory
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from .device import CPU, Device, as_device
from .errors import ArgumentError, DescriptorError

if TYPE_CHECKING:
    from .context import DeviceContext
    from .ipc import IpcDescriptor
    from .memory import Buffer

__all__ = [
    "DeviceMemoryResource",
    "HostMemoryResource",
    "IpcHostMemoryResource",
    "MemoryResource",
    "wrap_handle",
]


def _size(where: str, size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
        raise ArgumentError(f"{where}: invalid size (got {size!r}; expected an int >= 0 bytes)")
    return int(size)


class MemoryResource:
    """What every memory resource offers (cuda.core's ``MemoryResource``)."""

    device: Device = CPU()
    is_ipc_enabled: bool = False
    ipc_kind: str = ""

    @property
    def is_device_accessible(self) -> bool:
        raise NotImplementedError

    @property
    def is_host_accessible(self) -> bool:
        raise NotImplementedError

    @property
    def device_id(self) -> int:
        """The device ordinal (-1 for host memory)."""
        return -1 if self.device.is_host else int(self.device.id)

    def allocate(self, size: int, stream: DeviceContext | None = None) -> Buffer:
        """A new buffer of ``size`` bytes (uint8), made by this resource."""
        raise NotImplementedError

    def deallocate(self, buf: Buffer, stream: DeviceContext | None = None) -> None:
        """Release ``buf`` (after ``stream``'s queued work when given)."""
        buf.close(stream=stream)

    def _own(self, buf: Buffer) -> Buffer:
        buf._mr = self
        return buf

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device.label})"


class HostMemoryResource(MemoryResource):
    """Host memory; ``pinned=True`` page-locks it where a CUDA driver is present."""

    def __init__(self, pinned: bool = False) -> None:
        self.pinned = pinned

    @property
    def is_device_accessible(self) -> bool:
        return self.pinned

    @property
    def is_host_accessible(self) -> bool:
        return True

    def allocate(self, size: int, stream: DeviceContext | None = None) -> Buffer:
        from .memory import Buffer

        return self._own(
            Buffer("uint8", _size("HostMemoryResource.allocate", size), pinned=self.pinned)
        )


class IpcHostMemoryResource(MemoryResource):
    """Host memory other processes can import (a ``memfd``; see :mod:`shmem.ipc`)."""

    is_ipc_enabled = True
    ipc_kind = "host"

    @property
    def is_device_accessible(self) -> bool:
        return False

    @property
    def is_host_accessible(self) -> bool:
        return True

    def allocate(self, size: int, stream: DeviceContext | None = None) -> Buffer:
        from . import ipc

        return self._own(ipc.allocate(_size("IpcHostMemoryResource.allocate", size), "uint8"))


class DeviceMemoryResource(MemoryResource):
    """GPU memory of ``device`` (an id, ``"cuda:N"`` or a Device); ``ipc_enabled=True``
    allocates from an IPC-enabled pool whose buffers other processes import."""

    ipc_kind = "cuda"

    def __init__(self, device: Device | int | str = 0, ipc_enabled: bool = False) -> None:
        dev = (
            f"cuda:{device}" if isinstance(device, int) and not isinstance(device, bool) else device
        )
        self.device = as_device(dev, "DeviceMemoryResource")
        if self.device.is_host:
            raise ArgumentError(
                "DeviceMemoryResource: expected a GPU (got the host; use HostMemoryResource)"
            )
        self.is_ipc_enabled = ipc_enabled

    @property
    def is_device_accessible(self) -> bool:
        return True

    @property
    def is_host_accessible(self) -> bool:
        return False

    def allocate(self, size: int, stream: DeviceContext | None = None) -> Buffer:
        nbytes = _size("DeviceMemoryResource.allocate", size)
        if self.is_ipc_enabled:
            from . import ipc

            return self._own(ipc.allocate(nbytes, "uint8", device=self.device))
        from .memory import Buffer

        return self._own(Buffer("uint8", nbytes, device=self.device, stream=stream))


def wrap_handle(ptr: int, size: int, mr: MemoryResource | None) -> Buffer:
    """A uint8 Buffer over ``size`` bytes at address ``ptr`` (not owned: the memory must
    outlive it), host memory unless ``mr`` is a device resource."""
    from .memory import Buffer

    where = "Buffer.from_handle"
    if isinstance(ptr, bool) or not isinstance(ptr, int | np.integer) or ptr <= 0:
        raise ArgumentError(f"{where}: invalid pointer (got {ptr!r}; expected a non-zero int)")
    nbytes = _size(where, size)
    if mr is not None and not isinstance(mr, MemoryResource):
        raise ArgumentError(
            f"{where}: invalid mr (got {type(mr).__name__}; expected a MemoryResource or None)"
        )
    if mr is None or mr.is_host_accessible:
        raw = (ctypes.c_uint8 * nbytes).from_address(int(ptr))
        buf = Buffer._host(np.ctypeslib.as_array(raw).reshape(nbytes), keepalive=raw)
    else:
        from ._cuda_memory import _DeviceMemory

        buf = Buffer._device_view(
            mr.device, _DeviceMemory(int(ptr), nbytes, None), np.dtype(np.uint8), (nbytes,), (1,)
        )
    buf._mr = mr
    return buf


def import_descriptor(mr: MemoryResource, desc: IpcDescriptor | str | bytes) -> Buffer:
    """``Buffer.from_ipc_descriptor``: import ``desc`` and check it matches ``mr``."""
    from . import ipc

    if not isinstance(mr, MemoryResource) or not mr.is_ipc_enabled:
        raise ArgumentError(
            "Buffer.from_ipc_descriptor: mr must be an IPC-enabled memory resource (got "
            f"{mr!r}; expected IpcHostMemoryResource or DeviceMemoryResource(ipc_enabled=True))"
        )
    d = desc if isinstance(desc, ipc.IpcDescriptor) else ipc.IpcDescriptor.parse(desc)
    if d.kind != mr.ipc_kind:
        raise DescriptorError(
            f"Buffer.from_ipc_descriptor: the descriptor is for {d.kind} memory (got mr {mr!r}; "
            f"expected a resource of {d.kind} memory)"
        )
    buf = ipc.import_(d)
    buf._mr = mr
    return buf


def export_descriptor(buf: Buffer) -> IpcDescriptor:
    """``Buffer.get_ipc_descriptor``: the buffer must come from an IPC-enabled resource."""
    from . import ipc

    if not isinstance(buf, ipc.IpcBuffer):
        raise ArgumentError(
            "Buffer.get_ipc_descriptor: the buffer's memory is not IPC-enabled (allocate it "
            "from IpcHostMemoryResource or DeviceMemoryResource(ipc_enabled=True))"
        )
    return ipc.export(buf)


def as_stream(where: str, stream: Any) -> DeviceContext | None:
    from .context import DeviceContext

    if stream is None or isinstance(stream, DeviceContext):
        return stream
    raise ArgumentError(
        f"{where}: invalid stream (got {type(stream).__name__}; expected a DeviceContext or None)"
    )
