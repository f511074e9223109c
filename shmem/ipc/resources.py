"""IPC's side of the cuda.core memory-resource API (:mod:`shmem.device.resources`).

:class:`IpcHostMemoryResource` allocates exportable host memory, and the layer lent to the
device layer on import lets ``DeviceMemoryResource(ipc_enabled=True)``,
``Buffer.get_ipc_descriptor`` and ``Buffer.from_ipc_descriptor`` reach IPC without the
device layer importing it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..device.devices import Device
from ..device.memory import Buffer
from ..device.resources import MemoryResource, lend_ipc, nbytes_arg
from ..errors import ArgumentError, DescriptorError
from .descriptor import IpcDescriptor

if TYPE_CHECKING:
    from ..device.context import DeviceContext
from .buffers import IpcBuffer, allocate, export, import_

__all__ = ["IpcHostMemoryResource"]


class IpcHostMemoryResource(MemoryResource):
    """Host memory other processes can import (a ``memfd``), as a cuda.core memory resource.

    ``mr.allocate(n).get_ipc_descriptor()`` exports it; ``Buffer.from_ipc_descriptor(mr, desc)``
    imports it in another process of the same user.
    """

    is_ipc_enabled = True
    ipc_kind = "host"

    @property
    def is_device_accessible(self) -> bool:
        """False: a GPU does not reach this memory."""
        return False

    @property
    def is_host_accessible(self) -> bool:
        """True: the CPU loads and stores it."""
        return True

    def allocate(self, size: int, stream: DeviceContext | None = None) -> Buffer:
        """A new exportable buffer of ``size`` bytes (uint8) made by this resource.

        Parameters
        ----------
        size : int
            Bytes, >= 0.
        stream : DeviceContext or None
            Unused (host memory is ready at once); accepted as cuda.core does.

        Returns
        -------
        Buffer
            An :class:`IpcBuffer` whose ``memory_resource`` is this resource.

        Raises
        ------
        ArgumentError
            When ``size`` is not an int >= 0.
        """
        return self._own(allocate(nbytes_arg("IpcHostMemoryResource.allocate", size), "uint8"))


class _Layer:
    """What :mod:`shmem.device.resources` borrows: IPC sits above the device layer."""

    def allocate(self, nbytes: int, device: Device) -> Buffer:
        return allocate(nbytes, "uint8", device=device)

    def export(self, buf: Buffer) -> IpcDescriptor:
        if not isinstance(buf, IpcBuffer):
            raise ArgumentError(
                "Buffer.get_ipc_descriptor: the buffer's memory is not IPC-enabled (allocate it "
                "from IpcHostMemoryResource or DeviceMemoryResource(ipc_enabled=True))"
            )
        return export(buf)

    def import_(self, mr: MemoryResource, desc: IpcDescriptor | str | bytes) -> Buffer:
        if not isinstance(mr, MemoryResource) or not mr.is_ipc_enabled:
            raise ArgumentError(
                "Buffer.from_ipc_descriptor: mr must be an IPC-enabled memory resource (got "
                f"{mr!r}; expected IpcHostMemoryResource or DeviceMemoryResource(ipc_enabled=True))"
            )
        d = desc if isinstance(desc, IpcDescriptor) else IpcDescriptor.parse(desc)
        if d.kind != mr.ipc_kind:
            raise DescriptorError(
                f"Buffer.from_ipc_descriptor: the descriptor is for {d.kind} memory (got mr "
                f"{mr!r}; expected a resource of {d.kind} memory)"
            )
        buf = import_(d)
        buf._mr = mr
        return buf


lend_ipc(_Layer())
