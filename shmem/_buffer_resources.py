"""cuda.core's ``Buffer`` API on :class:`~shmem.Buffer` (see :mod:`shmem.resources`): raw
bytes addressed by ``handle``/``size``, the memory resource that made them, byte copies
ordered on a stream, wrapping a foreign pointer, and IPC descriptors."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from .errors import ArgumentError

if TYPE_CHECKING:
    from .context import DeviceContext
    from .device import Device
    from .ipc import IpcDescriptor
    from .memory import Buffer
    from .resources import MemoryResource

__all__ = ["ResourceMethods"]


class ResourceMethods:
    """Mixed into :class:`~shmem.Buffer`."""

    _mr: MemoryResource | None = None

    if TYPE_CHECKING:
        _device: Device
        _pinned: bool

        def _live(self, where: str) -> None: ...
        @property
        def nbytes(self) -> int: ...
        @property
        def is_host(self) -> bool: ...

    @property
    def handle(self) -> int:
        """The address of the memory (cuda.core's ``Buffer.handle``)."""
        self._live("handle")
        return cast("Buffer", self)._ptr

    @property
    def size(self) -> int:
        """Bytes of memory (cuda.core's ``Buffer.size``; ``nbytes``)."""
        return self.nbytes

    @property
    def device_id(self) -> int:
        """The GPU ordinal of the memory, -1 for host memory."""
        return -1 if self._device.is_host else int(self._device.id)

    @property
    def memory_resource(self) -> MemoryResource | None:
        """The resource that allocated this buffer (None for buffers made otherwise)."""
        return self._mr

    @property
    def is_device_accessible(self) -> bool:
        """Whether a GPU can reach the memory (device memory, or pinned host memory)."""
        return not self.is_host or self._pinned

    @property
    def is_host_accessible(self) -> bool:
        """Whether the CPU can load and store the memory."""
        return self.is_host

    def _bytes(self, where: str) -> Buffer:
        me = cast("Buffer", self)
        me._live(where)
        me._require_contiguous(f"Buffer.{where}")
        return me.view("uint8", (me.nbytes,))

    def copy_to(self, dst: Buffer | None = None, *, stream: DeviceContext | None) -> Buffer:
        """Copy this buffer's bytes into ``dst`` (same size), or into a new buffer from the
        same memory resource (or the same device), ordered on ``stream`` (None: complete on
        return). Returns the destination."""
        from .memory import Buffer
        from .resources import as_stream

        ctx = as_stream("Buffer.copy_to", stream)
        src = self._bytes("copy_to")
        if dst is None:
            mr = self._mr
            dst = (
                mr.allocate(src.nbytes, ctx)
                if mr is not None
                else Buffer("uint8", src.nbytes, device=self._device)
            )
        if not isinstance(dst, Buffer):
            raise ArgumentError(f"Buffer.copy_to: dst must be a Buffer (got {type(dst).__name__})")
        _copy_bytes("copy_to", dst._bytes("copy_to"), src, ctx)
        return dst

    def copy_from(self, src: Buffer, *, stream: DeviceContext | None) -> None:
        """Copy ``src``'s bytes (same size) into this buffer, ordered on ``stream``."""
        from .memory import Buffer
        from .resources import as_stream

        ctx = as_stream("Buffer.copy_from", stream)
        if not isinstance(src, Buffer):
            raise ArgumentError(
                f"Buffer.copy_from: src must be a Buffer (got {type(src).__name__})"
            )
        _copy_bytes("copy_from", self._bytes("copy_from"), src._bytes("copy_from"), ctx)

    @classmethod
    def from_handle(cls, ptr: int, size: int, mr: MemoryResource | None = None) -> Buffer:
        """A uint8 Buffer over ``size`` bytes at ``ptr`` (not owned: the memory must outlive
        it); host memory unless ``mr`` is a device resource (cuda.core's
        ``Buffer.from_handle``)."""
        from .resources import wrap_handle

        return wrap_handle(ptr, size, mr)

    def get_ipc_descriptor(self) -> IpcDescriptor:
        """A descriptor other processes import this memory with (IPC-enabled memory only)."""
        from .resources import export_descriptor

        return export_descriptor(cast("Buffer", self))

    @classmethod
    def from_ipc_descriptor(
        cls,
        mr: MemoryResource,
        desc: IpcDescriptor | str | bytes,
        stream: DeviceContext | None = None,
    ) -> Buffer:
        """Import the memory ``desc`` names through the IPC-enabled ``mr``."""
        from .resources import import_descriptor

        if stream is not None:
            stream.synchronize()  # the exporter's data is ready once its stream is
        return import_descriptor(mr, desc)


def _copy_bytes(where: str, dst: Buffer, src: Buffer, ctx: DeviceContext | None) -> None:
    if dst.nbytes != src.nbytes:
        raise ArgumentError(
            f"Buffer.{where}: size mismatch (got {src.nbytes} bytes into {dst.nbytes}; "
            "expected equal sizes)"
        )
    if ctx is None:
        dst.inplace_copy_from(src)
    else:
        ctx.enqueue_copy(dst, src)
