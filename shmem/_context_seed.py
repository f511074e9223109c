"""The seed's (Mojo ``DeviceContext``) names on :class:`~shmem.DeviceContext`: device
queries, peer access, and the directional copies. Each is a thin form of a general call
(``enqueue_copy``, ``enqueue_memset``, ``execution_time``) that also checks the direction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .device import Device, DeviceAttributes, MemoryInfo
from .errors import ArgumentError

if TYPE_CHECKING:
    from .context import DeviceContext
    from .memory import Buffer

__all__ = ["SeedContextMethods"]

_ATTRIBUTES = tuple(DeviceAttributes.__dataclass_fields__)


class SeedContextMethods:
    """Mixed into :class:`~shmem.DeviceContext`."""

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
        device kind has none."""
        if attr not in _ATTRIBUTES:
            raise ArgumentError(
                f"DeviceContext.get_attribute: unknown attribute (got {attr!r}; expected one of "
                f"{list(_ATTRIBUTES)})"
            )
        return getattr(self.device.attributes, attr)

    def get_memory_info(self) -> MemoryInfo:
        """Free and total bytes of the device's memory (unpacks as ``free, total``)."""
        return self.device.memory_info

    def is_compatible(self) -> bool:
        """Whether this project can run work on the device."""
        return self.device.is_compatible

    def can_access(self, other: DeviceContext | Device) -> bool:
        """Whether this device can load and store ``other``'s memory directly."""
        return self.device.can_access(_device_of("can_access", other))

    def enable_peer_access(self, other: DeviceContext | Device) -> None:
        """Let this device reach ``other``'s memory directly (raises when it cannot)."""
        self.device.enable_peer_access(_device_of("enable_peer_access", other))

    @staticmethod
    def number_of_devices(api: str = "cuda") -> int:
        """How many devices of ``api`` this process sees."""
        return Device.count(api)

    # -- work -------------------------------------------------------------------------------

    def memset(self, buf: Buffer, value: Any) -> None:
        """Set every element of ``buf`` to ``value``, stream-ordered (``enqueue_memset``)."""
        self.enqueue_memset(buf, value)

    def execution_time_iter(
        self, fn: Callable[[DeviceContext, int], object], num_iters: int
    ) -> int:
        """Nanoseconds for ``fn(ctx, i)`` for ``i`` in ``range(num_iters)`` and the work they
        queue (as :meth:`execution_time`, with the iteration index)."""
        counter = iter(range(num_iters))
        return self.execution_time(lambda ctx: fn(ctx, next(counter)), num_iters)

    def enqueue_copy_to_device(self, dst: Buffer, src: Any) -> None:
        """Host -> this context's device: ``src`` (host Buffer or numpy) into ``dst``."""
        self._direction("enqueue_copy_to_device", dst, src, dst_here=True, src_here=False)
        self.enqueue_copy(dst, src)

    def enqueue_copy_from_device(self, dst: Any, src: Buffer) -> None:
        """This context's device -> host: ``src`` into ``dst`` (host Buffer or numpy)."""
        self._direction("enqueue_copy_from_device", dst, src, dst_here=False, src_here=True)
        self.enqueue_copy(dst, src)

    def enqueue_copy_device_to_device(self, dst: Buffer, src: Buffer) -> None:
        """Between two buffers of this context's device."""
        self._direction("enqueue_copy_device_to_device", dst, src, dst_here=True, src_here=True)
        self.enqueue_copy(dst, src)

    def copy_to_device_sync(self, dst: Buffer, src: Any) -> None:
        self.enqueue_copy_to_device(dst, src)
        self.synchronize()

    def copy_from_device_sync(self, dst: Any, src: Buffer) -> None:
        self.enqueue_copy_from_device(dst, src)
        self.synchronize()

    def copy_device_to_device_sync(self, dst: Buffer, src: Buffer) -> None:
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
