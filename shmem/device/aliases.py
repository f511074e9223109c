"""The foreign vocabularies of the device layer's objects, in one place.

Each object speaks one vocabulary of its own (:class:`~shmem.DeviceContext`: ``enqueue_copy``,
``enqueue_memset``, ``execution_time``; :class:`~shmem.Buffer`: ``nbytes``, ``copy``,
``array``). Users who come from another library find its names too, as thin forms of those
calls, defined here and nowhere else:

* :class:`DeviceContextAliases`: the seed's (Mojo ``DeviceContext``) device queries, peer
  access and directional copies (``enqueue_copy_to_device`` checks the direction, then is
  ``enqueue_copy``).
* :class:`BufferAliases`: cuda.core's ``Buffer`` API: raw bytes addressed by
  ``handle``/``size``, the memory resource that made them, byte copies ordered on a stream,
  wrapping a foreign pointer, and IPC descriptors (through :mod:`shmem.device.resources`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..errors import ArgumentError
from .devices import Device, DeviceAttributes, MemoryInfo
from .resources import as_stream, buffer_class, ipc_layer, wrap_handle

if TYPE_CHECKING:
    from .context import DeviceContext
    from .memory import Buffer
    from .resources import MemoryResource

__all__ = ["BufferAliases", "DeviceContextAliases"]

_ATTRIBUTES = tuple(DeviceAttributes.__dataclass_fields__)


class DeviceContextAliases:
    """The Mojo ``DeviceContext`` names, mixed into :class:`~shmem.DeviceContext`."""

    if TYPE_CHECKING:
        device: Device

        def _live(self, where: str) -> None: ...
        def enqueue_copy(self, dst: Any, src: Any) -> None: ...
        def enqueue_memset(self, buf: Buffer, value: Any) -> None: ...
        def synchronize(self) -> None: ...
        def execution_time(self, fn: Callable[[DeviceContext], object], num_iters: int) -> int: ...

    # -- queries ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The device's name (the CPU model, or the GPU's name)."""
        return self.device.name

    @property
    def id(self) -> int:
        """The device's index for its API."""
        return int(self.device.id)

    def get_attribute(self, attr: str) -> Any:
        """One of the device's attributes by name (``"multiprocessor_count"``,
        ``"compute_capability"``, ``"max_threads_per_block"``, ``"cores"``); None where the
        device kind has none.

        Parameters
        ----------
        attr : str
            A field name of :class:`~shmem.DeviceAttributes`.

        Returns
        -------
        object
            The attribute's value (an int, a ``(major, minor)`` tuple, or None).

        Raises
        ------
        ArgumentError
            When ``attr`` names no attribute.
        """
        if attr not in _ATTRIBUTES:
            raise ArgumentError(
                f"DeviceContext.get_attribute: unknown attribute (got {attr!r}; expected one of "
                f"{list(_ATTRIBUTES)})"
            )
        return getattr(self.device.attributes, attr)

    def get_memory_info(self) -> MemoryInfo:
        """Free and total bytes of the device's memory (unpacks as ``free, total``).

        Returns
        -------
        MemoryInfo
            The device's free and total bytes now.
        """
        return self.device.memory_info

    def is_compatible(self) -> bool:
        """Whether this project can run work on the device.

        Returns
        -------
        bool
            True when kernels and copies can run there.
        """
        return self.device.is_compatible

    def can_access(self, other: DeviceContext | Device) -> bool:
        """Whether this device can load and store ``other``'s memory directly.

        Parameters
        ----------
        other : DeviceContext or Device
            The peer device, or a context on it.

        Returns
        -------
        bool
            True when no copy is needed to reach ``other``'s memory.
        """
        return self.device.can_access(_device_of("can_access", other))

    def enable_peer_access(self, other: DeviceContext | Device) -> None:
        """Let this device reach ``other``'s memory directly (raises when it cannot).

        Parameters
        ----------
        other : DeviceContext or Device
            The peer device, or a context on it.
        """
        self.device.enable_peer_access(_device_of("enable_peer_access", other))

    @staticmethod
    def number_of_devices(api: str = "cuda") -> int:
        """How many devices of ``api`` this process sees.

        Parameters
        ----------
        api : str, default "cuda"
            ``"cpu"`` or ``"cuda"``.

        Returns
        -------
        int
            The number of devices (``"cpu"``: 1).
        """
        return Device.count(api)

    # -- work -------------------------------------------------------------------------------

    def memset(self, buf: Buffer, value: Any) -> None:
        """Set every element of ``buf`` to ``value``, stream-ordered (``enqueue_memset``).

        Parameters
        ----------
        buf : Buffer
            The buffer to fill.
        value : scalar
            The value every element gets, cast to ``buf``'s dtype.
        """
        self.enqueue_memset(buf, value)

    def execution_time_iter(
        self, fn: Callable[[DeviceContext, int], object], num_iters: int
    ) -> int:
        """Nanoseconds for ``fn(ctx, i)`` for ``i`` in ``range(num_iters)`` and the work they
        queue (as :meth:`execution_time`, with the iteration index).

        Parameters
        ----------
        fn : callable
            Called as ``fn(ctx, i)``; it queues the work to time.
        num_iters : int
            How many calls (>= 1).

        Returns
        -------
        int
            Nanoseconds for all ``num_iters`` calls together.
        """
        counter = iter(range(num_iters))
        return self.execution_time(lambda ctx: fn(ctx, next(counter)), num_iters)

    def enqueue_copy_to_device(self, dst: Buffer, src: Any) -> None:
        """Host -> this context's device: ``src`` (host Buffer or numpy) into ``dst``.

        Parameters
        ----------
        dst : Buffer
            A buffer on this context's device.
        src : Buffer or numpy.ndarray
            Host memory.
        """
        self._direction("enqueue_copy_to_device", dst, src, dst_here=True, src_here=False)
        self.enqueue_copy(dst, src)

    def enqueue_copy_from_device(self, dst: Any, src: Buffer) -> None:
        """This context's device -> host: ``src`` into ``dst`` (host Buffer or numpy).

        Parameters
        ----------
        dst : Buffer or numpy.ndarray
            Host memory.
        src : Buffer
            A buffer on this context's device.
        """
        self._direction("enqueue_copy_from_device", dst, src, dst_here=False, src_here=True)
        self.enqueue_copy(dst, src)

    def enqueue_copy_device_to_device(self, dst: Buffer, src: Buffer) -> None:
        """Between two buffers of this context's device.

        Parameters
        ----------
        dst : Buffer
            A buffer on this context's device.
        src : Buffer
            Another buffer on this context's device.
        """
        self._direction("enqueue_copy_device_to_device", dst, src, dst_here=True, src_here=True)
        self.enqueue_copy(dst, src)

    def copy_to_device_sync(self, dst: Buffer, src: Any) -> None:
        """Like :meth:`enqueue_copy_to_device`, complete on return (host-blocking).

        Parameters
        ----------
        dst : Buffer
            A buffer on this context's device.
        src : Buffer or numpy.ndarray
            Host memory.
        """
        self.enqueue_copy_to_device(dst, src)
        self.synchronize()

    def copy_from_device_sync(self, dst: Any, src: Buffer) -> None:
        """Like :meth:`enqueue_copy_from_device`, complete on return (host-blocking).

        Parameters
        ----------
        dst : Buffer or numpy.ndarray
            Host memory.
        src : Buffer
            A buffer on this context's device.
        """
        self.enqueue_copy_from_device(dst, src)
        self.synchronize()

    def copy_device_to_device_sync(self, dst: Buffer, src: Buffer) -> None:
        """Like :meth:`enqueue_copy_device_to_device`, complete on return (host-blocking).

        Parameters
        ----------
        dst : Buffer
            A buffer on this context's device.
        src : Buffer
            Another buffer on this context's device.
        """
        self.enqueue_copy_device_to_device(dst, src)
        self.synchronize()

    def _direction(self, where: str, dst: Any, src: Any, dst_here: bool, src_here: bool) -> None:
        """``*_here``: that side must be on this context's device; else on the host."""
        self._live(where)
        for side, obj, here in (("dst", dst, dst_here), ("src", src, src_here)):
            dev = getattr(obj, "device", None)
            on = dev if isinstance(dev, Device) else None  # numpy arrays: host memory
            ok = (on == self.device) if here else (on is None or on.is_host)
            if not ok:
                want = f"on {self.device.label}" if here else "host memory"
                got = "host memory" if on is None else on.label
                raise ArgumentError(f"DeviceContext.{where}: {side} is {got} (expected {want})")


def _device_of(where: str, other: object) -> Device:
    if isinstance(other, Device):
        return other
    dev = getattr(other, "device", None)
    if isinstance(dev, Device):
        return dev
    raise ArgumentError(
        f"DeviceContext.{where}: expected a DeviceContext or Device (got {type(other).__name__})"
    )


# -- cuda.core's Buffer ------------------------------------------------------------------


class BufferAliases:
    """cuda.core's ``Buffer`` names, mixed into :class:`~shmem.Buffer`."""

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
        return). Returns the destination.

        Parameters
        ----------
        dst : Buffer, optional
            The destination, of the same number of bytes (``None``: a new buffer).
        stream : DeviceContext or None
            The stream the copy is ordered on; ``None``: complete on return.

        Returns
        -------
        Buffer
            ``dst``, or the new buffer.

        Raises
        ------
        ArgumentError
            When ``dst`` is not a Buffer, sizes differ, ``stream`` is not a DeviceContext or
            None, or a side is not contiguous.
        """
        Buffer = buffer_class()
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
        """Copy ``src``'s bytes (same size) into this buffer, ordered on ``stream``.

        Parameters
        ----------
        src : Buffer
            The source, of the same number of bytes.
        stream : DeviceContext or None
            The stream the copy is ordered on; ``None``: complete on return.

        Raises
        ------
        ArgumentError
            When ``src`` is not a Buffer, sizes differ, ``stream`` is not a DeviceContext or
            None, or a side is not contiguous.
        """
        Buffer = buffer_class()
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
        ``Buffer.from_handle``).

        Parameters
        ----------
        ptr : int
            The memory's address (non-zero).
        size : int
            Bytes at ``ptr`` (>= 0).
        mr : MemoryResource, optional
            The resource the memory belongs to; a device resource makes a device buffer.

        Returns
        -------
        Buffer
            A one-dimensional ``uint8`` view of the memory, not owning it.
        """
        return wrap_handle(ptr, size, mr)

    def get_ipc_descriptor(self) -> Any:
        """A descriptor other processes import this memory with (IPC-enabled memory only):
        an :class:`~shmem.ipc.IpcDescriptor`.

        Returns
        -------
        IpcDescriptor
            The descriptor; ``str(desc)`` travels to the importing process.
        """
        return ipc_layer("Buffer.get_ipc_descriptor").export(cast("Buffer", self))

    @classmethod
    def from_ipc_descriptor(
        cls,
        mr: MemoryResource,
        desc: Any,
        stream: DeviceContext | None = None,
    ) -> Buffer:
        """Import the memory ``desc`` names through the IPC-enabled ``mr``.

        Parameters
        ----------
        mr : MemoryResource
            An IPC-enabled resource of the kind that exported ``desc``.
        desc : IpcDescriptor or str or bytes
            The exporter's descriptor.
        stream : DeviceContext, optional
            Synchronized first, so the exporter's data is ready (``None``: no wait).

        Returns
        -------
        Buffer
            The same memory as the exporter's buffer, in this process.
        """
        if stream is not None:
            stream.synchronize()  # the exporter's data is ready once its stream is
        return ipc_layer("Buffer.from_ipc_descriptor").import_(mr, desc)


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
