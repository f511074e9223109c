"""Memory resources and the cuda.core-style Buffer API (``cuda.core.experimental`` names).

A memory resource is an object that allocates :class:`~shmem.Buffer` s of raw bytes
(``mr.allocate(size)``) and says who can reach them. Three kinds:

* :class:`HostMemoryResource`: ordinary (or, with ``pinned=True``, page-locked) host memory.
* :class:`~shmem.ipc.IpcHostMemoryResource` (in :mod:`shmem.ipc`): host memory in a ``memfd``
  that other processes of the same user import (``buf.get_ipc_descriptor()`` /
  ``Buffer.from_ipc_descriptor(mr, desc)``).
* :class:`DeviceMemoryResource`: GPU memory of one device; ``ipc_enabled=True`` gives an
  IPC-enabled pool (cuda.core's ``DeviceMemoryResource`` with IPC), the same flow as above.

IPC sits above this layer: :mod:`shmem.ipc` lends itself here on import (:func:`lend_ipc`;
``import shmem`` imports it), so the IPC names of this module reach it without importing it.
So do :class:`~shmem.Buffer` and :class:`~shmem.DeviceContext`, which build on this module and
lend their classes here when they are defined (:func:`lend_class`): the resources allocate
Buffers and take contexts without importing either.

The IPC flow then reads as in cuda.core::

    mr = IpcHostMemoryResource()                  # or DeviceMemoryResource(0, ipc_enabled=True)
    buf = mr.allocate(1 << 20)
    desc = buf.get_ipc_descriptor()               # str(desc) travels to the other process
    other = Buffer.from_ipc_descriptor(mr, desc)  # in the importer: the same memory
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from ..errors import ArgumentError, ShmemStateError
from .devices import CPU, Device, as_device

if TYPE_CHECKING:
    from .context import DeviceContext
    from .memory import Buffer

__all__ = [
    "DeviceMemoryResource",
    "HostMemoryResource",
    "IpcLayer",
    "MemoryResource",
    "buffer_class",
    "context_class",
    "lend_class",
    "lend_ipc",
    "nbytes_arg",
    "wrap_handle",
]


class IpcLayer(Protocol):
    """What the IPC layer above lends the memory resources and :class:`~shmem.Buffer`."""

    def allocate(self, nbytes: int, device: Device) -> Buffer:
        """``nbytes`` of exportable memory on ``device``."""
        ...

    def export(self, buf: Buffer) -> Any:
        """``Buffer.get_ipc_descriptor``: the descriptor of ``buf``."""
        ...

    def import_(self, mr: MemoryResource, desc: Any) -> Buffer:
        """``Buffer.from_ipc_descriptor``: the memory ``desc`` names, through ``mr``."""
        ...


_ipc: IpcLayer | None = None


def lend_ipc(layer: IpcLayer) -> None:
    """Called once by :mod:`shmem.ipc` on import: the IPC names here go through ``layer``.

    Parameters
    ----------
    layer : IpcLayer
        The IPC layer's allocate/export/import.
    """
    global _ipc
    _ipc = layer


def ipc_layer(where: str) -> IpcLayer:
    """The IPC layer lent by :mod:`shmem.ipc`; raises naming ``where`` when it is not loaded."""
    if _ipc is None:
        raise ShmemStateError(f"{where}: IPC is not loaded (import shmem.ipc first)")
    return _ipc


_classes: dict[str, Any] = {}


def lend_class(cls: type[Buffer] | type[DeviceContext]) -> None:
    """Called once by :mod:`shmem.device.memory` and :mod:`shmem.device.context` when they
    define :class:`~shmem.Buffer` and :class:`~shmem.DeviceContext`: the layer below them
    (this module, the cuda.core aliases) makes and checks their objects through these.

    Parameters
    ----------
    cls : type
        ``Buffer`` or ``DeviceContext``.
    """
    _classes[cls.__name__] = cls


def _lent(name: str) -> Any:
    cls = _classes.get(name)
    if cls is None:  # pragma: no cover - the package's face imports both modules
        raise ShmemStateError(f"shmem.device.{name} is not defined yet (import shmem.device)")
    return cls


def buffer_class() -> type[Buffer]:
    """:class:`~shmem.Buffer`, as :mod:`shmem.device.memory` lent it."""
    return cast("type[Buffer]", _lent("Buffer"))


def context_class() -> type[DeviceContext]:
    """:class:`~shmem.DeviceContext`, as :mod:`shmem.device.context` lent it."""
    return cast("type[DeviceContext]", _lent("DeviceContext"))


def nbytes_arg(where: str, size: object) -> int:
    """``size`` as a byte count; raises ArgumentError naming ``where`` unless an int >= 0."""
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
        """A new buffer of ``size`` bytes (uint8), made by this resource.

        Parameters
        ----------
        size : int
            Bytes to allocate (an int >= 0).
        stream : DeviceContext, optional
            The stream the allocation is ordered on (``None``: ready on return).

        Returns
        -------
        Buffer
            A one-dimensional ``uint8`` buffer whose ``memory_resource`` is this resource.

        Raises
        ------
        NotImplementedError
            On the base class; each resource kind allocates for itself.
        """
        raise NotImplementedError

    def deallocate(self, buf: Buffer, stream: DeviceContext | None = None) -> None:
        """Release ``buf`` (after ``stream``'s queued work when given).

        Parameters
        ----------
        buf : Buffer
            A buffer this resource allocated.
        stream : DeviceContext, optional
            The stream whose queued work must finish before the memory is released
            (``None``: released now).
        """
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
        return self._own(
            buffer_class()(
                "uint8", nbytes_arg("HostMemoryResource.allocate", size), pinned=self.pinned
            )
        )


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
        nbytes = nbytes_arg("DeviceMemoryResource.allocate", size)
        if self.is_ipc_enabled:
            return self._own(
                ipc_layer("DeviceMemoryResource.allocate").allocate(nbytes, self.device)
            )
        return self._own(buffer_class()("uint8", nbytes, device=self.device, stream=stream))


def wrap_handle(ptr: int, size: int, mr: MemoryResource | None) -> Buffer:
    """A uint8 Buffer over ``size`` bytes at address ``ptr`` (not owned: the memory must
    outlive it), host memory unless ``mr`` is a device resource."""

    where = "Buffer.from_handle"
    if isinstance(ptr, bool) or not isinstance(ptr, int | np.integer) or ptr <= 0:
        raise ArgumentError(f"{where}: invalid pointer (got {ptr!r}; expected a non-zero int)")
    nbytes = nbytes_arg(where, size)
    if mr is not None and not isinstance(mr, MemoryResource):
        raise ArgumentError(
            f"{where}: invalid mr (got {type(mr).__name__}; expected a MemoryResource or None)"
        )
    device = CPU() if mr is None or mr.is_host_accessible else mr.device
    buf = device.impl.wrap(device, int(ptr), nbytes)
    buf._mr = mr
    return buf


def as_stream(where: str, stream: Any) -> DeviceContext | None:
    if stream is None or isinstance(stream, context_class()):
        return stream
    raise ArgumentError(
        f"{where}: invalid stream (got {type(stream).__name__}; expected a DeviceContext or None)"
    )
