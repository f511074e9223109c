"""What a device kind implements: one :class:`DeviceImpl` and its :class:`StreamImpl`.

Every :class:`~shmem.Device` holds one implementation object (``device.impl``), chosen when
the device is made: :class:`shmem.device.host.HostImpl` for the host, the CUDA one
(``shmem.device.cuda.CudaImpl``, loaded only when a CUDA device is asked for) for GPUs. The generic
classes (:class:`~shmem.Buffer`, :class:`~shmem.DeviceContext`) call these methods and never
branch on the device kind; adding a device kind means adding a file with these two classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .context import DeviceContext, Dim3, DriverVersion, Event, Function
    from .devices import Device
    from .dlpack import DLPackView
    from .memory import Buffer

__all__ = ["DeviceImpl", "StreamImpl", "mover"]


@runtime_checkable
class StreamImpl(Protocol):
    """An ordered queue of work on one device (what a DeviceContext drives)."""

    @property
    def handle(self) -> object:
        """The underlying stream: the host queue, or the cuda.core ``Stream``."""
        ...

    def compile(self, source_or_callable: object, name: str | None, options: object) -> Function:
        """A kernel for this device: a Python callable (or source defining ``name``) on the
        host; CUDA C++ source and its ``extern "C"`` name on a GPU."""
        ...

    def launch(
        self, kernel: object, args: tuple[Any, ...], grid: Dim3, block: Dim3, shmem_bytes: int
    ) -> None:
        """Queue ``kernel`` over ``grid`` blocks of ``block`` threads."""
        ...

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue a host callable (host streams; a GPU stream runs it after synchronizing)."""
        ...

    def record(self) -> Event:
        """An event at the current end of the stream."""
        ...

    def wait(self, event: Event) -> None:
        """Later work waits for ``event``."""
        ...

    def synchronize(self, label: str) -> None:
        """Wait for all queued work; raise ``AsyncExecutionError`` when queued work failed."""
        ...

    def driver_version(self) -> DriverVersion: ...

    def close(self) -> None: ...


@runtime_checkable
class DeviceImpl(Protocol):
    """Memory, copies and streams of one device kind."""

    api: str
    is_host: bool

    def allocate(
        self,
        device: Device,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        pinned: bool,
        stream: DeviceContext | None,
    ) -> tuple[np.ndarray[Any, Any] | None, object, bool]:
        """New memory: ``(host array or None, device memory or None, pinned)``."""
        ...

    def copy(self, dst: Buffer, src: Buffer, ctx: DeviceContext | None) -> None:
        """Copy ``src`` into ``dst``: ordered on ``ctx`` when given, else complete on return."""
        ...

    def fill(self, buf: Buffer, scalar: np.ndarray[Any, Any], ctx: DeviceContext | None) -> None:
        """Set every element of ``buf`` to ``scalar``, ordered as :meth:`copy`."""
        ...

    def wait_unordered(self, device: Device) -> None:
        """Wait for work on ``device`` that no stream of the caller orders (the default
        stream's); nothing to wait for on the host."""
        ...

    def create_stream(self, device: Device) -> StreamImpl: ...

    def import_dlpack(self, view: DLPackView) -> Buffer:
        """A Buffer over a DLPack tensor's memory on this kind of device (zero-copy)."""
        ...

    def wrap(self, device: Device, ptr: int, nbytes: int) -> Buffer:
        """A uint8 Buffer over ``nbytes`` at address ``ptr`` of ``device`` (not owned: the
        memory must outlive it)."""
        ...


def mover(dst: Buffer, src: Buffer) -> DeviceImpl:
    """The implementation that moves bytes between ``dst`` and ``src``: the device one when
    either side is device memory (it knows both its own memory and the host's)."""
    a, b = dst.device.impl, src.device.impl
    return b if a.is_host else a
