"""DeviceContext: a stream of execution on one device (the seed Mojo ``DeviceContext``).

On the host the stream is an ordered queue served by one worker thread, asynchronous like a
CUDA stream: ``enqueue_*`` returns at once, work runs in order, and an exception inside queued
work is kept and raised at the next :meth:`DeviceContext.synchronize` (with the original
traceback); work queued after a failure is skipped until then. Host "kernels" are Python
callables run once per block index, blocks spread over a thread pool (numpy releases the GIL).
On a GPU the stream is a cuda.core ``Stream`` and kernels are NVRTC-compiled CUDA C++.
The context drives its device kind's :class:`~shmem.device.impl.StreamImpl`
(``shmem.device.host`` on the host, the CUDA one on GPUs) and never branches on the kind.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..dtypes import DTypeLike
from ..errors import ArgumentError, ShmemStateError
from .aliases import DeviceContextAliases
from .devices import CPU, Device, as_device
from .memory import Buffer
from .resources import lend_class

if TYPE_CHECKING:
    from .impl import StreamImpl

__all__ = ["Block", "DeviceContext", "Dim3", "DriverVersion", "Event", "Function"]


class Dim3(NamedTuple):
    """A grid or block extent, or a block index: ``x`` fastest."""

    x: int
    y: int = 1
    z: int = 1


class DriverVersion(NamedTuple):
    major: int
    minor: int


def as_dim3(value: int | Sequence[int], where: str, what: str) -> Dim3:
    """``4`` or ``(4, 2)`` or ``(4, 2, 1)`` -> a :class:`Dim3` of positive ints."""
    dims = (value,) if isinstance(value, int | np.integer) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1 for d in dims
    ):
        raise ArgumentError(
            f"{where}: invalid {what} (got {value!r}; expected 1 to 3 positive ints)"
        )
    return Dim3(*(int(d) for d in dims))


@dataclass(frozen=True)
class Block:
    """What a host kernel receives first: where it is in the grid, and its shared memory.

    ``shared`` is a fresh zeroed ``uint8`` array of ``shared_mem_bytes`` for this block.

    Parameters
    ----------
    block_idx : Dim3
        This block's index in the grid.
    grid_dim : Dim3
        The grid's extent in blocks.
    block_dim : Dim3
        The block's extent in threads.
    shared : numpy.ndarray
        This block's shared memory: zeroed ``uint8``, ``shared_mem_bytes`` long.
    """

    block_idx: Dim3
    grid_dim: Dim3
    block_dim: Dim3
    shared: np.ndarray[Any, np.dtype[np.uint8]]

    @property
    def linear_idx(self) -> int:
        """The block index flattened x-fastest: ``x + gx * (y + gy * z)``."""
        g = self.grid_dim
        return self.block_idx.x + g.x * (self.block_idx.y + g.y * self.block_idx.z)


class Function:
    """A compiled kernel for one device: a Python callable on the host, or a CUDA kernel.

    Made by :meth:`DeviceContext.compile_function`.

    Parameters
    ----------
    name : str
        The kernel's name (the ``extern "C"`` function on a GPU).
    device : Device
        The device it was compiled for; it launches only on a context of that device.
    impl : object
        The device kind's kernel: the Python callable on the host, the cuda.core kernel on a
        GPU.
    """

    def __init__(self, name: str, device: Device, impl: Any) -> None:
        self.name = name
        self.device = device
        self.impl = impl

    def __repr__(self) -> str:
        return f"Function({self.name!r}, device={self.device.label})"


class Event:
    """A point in a stream: done once the stream reaches it; timed on the host clock or by
    CUDA events. ``end - start`` (or ``end.elapsed_time(start)``) gives milliseconds.

    Made by :meth:`DeviceContext.record_event`.

    Parameters
    ----------
    impl : object, optional
        The CUDA event on a GPU; ``None`` on the host (the event then fires when the host
        queue reaches it).
    """

    def __init__(self, impl: Any = None) -> None:
        self._impl = impl  # the GPU event, or None on the host
        self._done = threading.Event()
        self._time = 0.0

    def _fire(self) -> None:
        self._time = time.perf_counter()
        self._done.set()

    @property
    def is_done(self) -> bool:
        if self._impl is not None:
            return bool(self._impl.is_done)
        return self._done.is_set()

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the stream has reached this event (host-blocking).

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait on the host (``None``: no limit); a GPU event waits without one.

        Raises
        ------
        TimeoutError
            When a host event is not reached within ``timeout`` seconds.
        """
        if self._impl is not None:
            self._impl.sync()
            return
        if not self._done.wait(timeout):
            raise TimeoutError(f"Event.synchronize: not reached within {timeout} s")

    def elapsed_time(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event (both must be done).

        Parameters
        ----------
        start : Event
            The earlier event.

        Returns
        -------
        float
            Milliseconds elapsed between ``start`` and this event.

        Raises
        ------
        ShmemStateError
            When either host event has not been reached yet.
        """
        if self._impl is not None and start._impl is not None:
            return float(self._impl - start._impl)
        if not (self._done.is_set() and start._done.is_set()):
            raise ShmemStateError("Event.elapsed_time: both events must be done first")
        return (self._time - start._time) * 1e3

    def __sub__(self, start: Event) -> float:
        return self.elapsed_time(start)


class DeviceContext(DeviceContextAliases):
    """A stream of execution on ``device`` (default: the host). A context manager: leaving
    it synchronizes and closes the stream.

    Every ``enqueue_*`` call is stream-ordered and returns at once; ``*_sync`` forms return
    when the work is done; :meth:`synchronize` waits for everything queued so far and raises
    :class:`AsyncExecutionError` if queued work failed.

    Parameters
    ----------
    device : Device or str, optional
        The device: a :class:`Device`, ``"cpu"`` or ``"cuda:N"``; ``None`` is the host.

    Raises
    ------
    ArgumentError
        When ``device`` is none of those.
    """

    def __init__(self, device: Device | str | None = None) -> None:
        self.device = as_device(device, "DeviceContext")
        self._closed = False
        self._impl: StreamImpl = self.device.impl.create_stream(self.device)

    def __repr__(self) -> str:
        return f"DeviceContext({self.device.label}{', closed' if self._closed else ''})"

    @property
    def api(self) -> str:
        return self.device.api

    @property
    def stream(self) -> Any:
        """The underlying stream: the host queue, or the cuda.core ``Stream``."""
        return self._impl.handle

    @property
    def stream_impl(self) -> StreamImpl:
        """The device kind's stream implementation this context drives."""
        return self._impl

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def _live(self, where: str) -> None:
        if self._closed:
            raise ShmemStateError(f"DeviceContext.{where}: the context is closed")

    def enqueue_create_buffer(self, dtype: DTypeLike, count: int) -> Buffer:
        """A new buffer of ``count`` elements on this device, ordered on this stream.

        Parameters
        ----------
        dtype : dtype-like
            The elements' dtype.
        count : int
            Number of elements.

        Returns
        -------
        Buffer
            A one-dimensional buffer on this context's device.

        Raises
        ------
        ShmemStateError
            When the context is closed.
        """

        self._live("enqueue_create_buffer")
        return Buffer(dtype, (count,), device=self.device, stream=self)

    def create_buffer_sync(self, dtype: DTypeLike, count: int) -> Buffer:
        """Like :meth:`enqueue_create_buffer`, ready to use on return.

        Parameters
        ----------
        dtype : dtype-like
            The elements' dtype.
        count : int
            Number of elements.

        Returns
        -------
        Buffer
            A one-dimensional buffer on this context's device, allocated (host-blocking).
        """
        buf = self.enqueue_create_buffer(dtype, count)
        self.synchronize()
        return buf

    def enqueue_create_host_buffer(self, dtype: DTypeLike, count: int) -> Buffer:
        """A host buffer for transfers with this device (pinned when the device is a GPU).

        Parameters
        ----------
        dtype : dtype-like
            The elements' dtype.
        count : int
            Number of elements.

        Returns
        -------
        Buffer
            A one-dimensional host buffer.

        Raises
        ------
        ShmemStateError
            When the context is closed.
        """
        self._live("enqueue_create_host_buffer")
        return Buffer(dtype, (count,), device=CPU(), pinned=not self.device.is_host, stream=self)

    def malloc_host(self, dtype: DTypeLike, count: int) -> Buffer:
        """Host memory for fast transfers (pinned on a GPU context); release with
        :meth:`free_host`.

        Parameters
        ----------
        dtype : dtype-like
            The elements' dtype.
        count : int
            Number of elements.

        Returns
        -------
        Buffer
            A one-dimensional host buffer, allocated (host-blocking).
        """
        buf = self.enqueue_create_host_buffer(dtype, count)
        self.synchronize()
        return buf

    def free_host(self, buf: Buffer) -> None:
        """Release a buffer from :meth:`malloc_host` once queued work using it is done.

        Parameters
        ----------
        buf : Buffer
            The buffer to release; this call synchronizes the stream first.
        """
        self.synchronize()
        buf.close()

    def enqueue_copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` (host->device, device->host, device->device or host->host).

        Both must be contiguous with the same dtype and element count; numpy arrays are
        accepted on either side (as zero-copy host buffers).

        Parameters
        ----------
        dst : Buffer or numpy.ndarray
            Where the elements go.
        src : Buffer or numpy.ndarray
            Where they come from.

        Raises
        ------
        ArgumentError
            When a side is neither a Buffer nor a numpy array, or dtypes or element counts
            differ, or a side is not contiguous.
        ShmemStateError
            When the context is closed.
        """

        self._live("enqueue_copy")
        d = Buffer._coerce(dst, "enqueue_copy", "dst")
        s = Buffer._coerce(src, "enqueue_copy", "src")
        Buffer._check_copy_pair(d, s, "DeviceContext.enqueue_copy", contiguous=True)
        d._copy_from(s, self)

    def enqueue_copy_sync(self, dst: Any, src: Any) -> None:
        """Like :meth:`enqueue_copy`, complete on return (host-blocking).

        Parameters
        ----------
        dst : Buffer or numpy.ndarray
            Where the elements go.
        src : Buffer or numpy.ndarray
            Where they come from.
        """
        self.enqueue_copy(dst, src)
        self.synchronize()

    def enqueue_memset(self, buf: Buffer, value: Any) -> None:
        """Set every element of ``buf`` to ``value`` (cast to its dtype), stream-ordered.

        Parameters
        ----------
        buf : Buffer
            The buffer to fill.
        value : scalar
            The value every element gets, cast to ``buf``'s dtype.
        """
        self._live("enqueue_memset")
        buf._fill(value, self)

    def memset_sync(self, buf: Buffer, value: Any) -> None:
        """Like :meth:`enqueue_memset`, complete on return (host-blocking).

        Parameters
        ----------
        buf : Buffer
            The buffer to fill.
        value : scalar
            The value every element gets, cast to ``buf``'s dtype.
        """
        self.enqueue_memset(buf, value)
        self.synchronize()

    @contextlib.contextmanager
    def map_to_host(self, buf: Buffer) -> Iterator[np.ndarray[Any, Any]]:
        """A numpy view of ``buf`` on the host; writes reach the device when the block exits.

        Host buffers are mapped in place; device buffers go through a host copy that is
        written back at exit (stream-ordered, and synchronized).

        Parameters
        ----------
        buf : Buffer
            The buffer to map; queued work is synchronized first.

        Yields
        ------
        numpy.ndarray
            The host view (``buf`` itself on the host, a copy written back on a GPU).
        """
        self._live("map_to_host")
        self.synchronize()
        if buf.is_host:
            yield buf.to_numpy()
            return
        host = buf.copy(device="cpu")
        arr = host.to_numpy()
        try:
            yield arr
        finally:
            self.enqueue_copy(buf, host)
            self.synchronize()

    # -- kernels ---------------------------------------------------------------------

    def compile_function(
        self, source_or_callable: Any, name: str | None = None, *, options: Any = None
    ) -> Function:
        """Compile a kernel for this device.

        Host: a Python callable ``fn(block, *args)``, or Python source text defining ``name``.
        GPU: CUDA C++ source compiled with NVRTC for this device's architecture; ``name`` is
        the ``extern "C" __global__`` function.

        Parameters
        ----------
        source_or_callable : callable or str
            A host callable, Python source (host) or CUDA C++ source (GPU).
        name : str, optional
            The function to take from the source (required for source text).
        options : object, optional
            Compiler options for the device kind (NVRTC options on a GPU).

        Returns
        -------
        Function
            The kernel, launchable on contexts of this device.
        """
        self._live("compile_function")
        return self._impl.compile(source_or_callable, name, options)

    def enqueue_function(
        self,
        fn: Any,
        *args: Any,
        grid_dim: int | Sequence[int],
        block_dim: int | Sequence[int] = 1,
        shared_mem_bytes: int | None = None,
    ) -> None:
        """Launch ``fn`` over ``grid_dim`` blocks of ``block_dim`` threads, stream-ordered.

        Host: ``fn(block, *args)`` runs once per block index (``block`` is a :class:`Block`),
        blocks spread over a thread pool; :class:`~shmem.Buffer` arguments arrive as
        zero-copy numpy arrays. GPU: a :class:`Function` from :meth:`compile_function`;
        buffers are passed as device pointers, Python ints and floats must be numpy scalars.

        Parameters
        ----------
        fn : Function or callable
            The kernel; a host callable is compiled first.
        *args : object
            The kernel's arguments after ``block``.
        grid_dim : int or sequence of int
            Blocks in the grid: 1 to 3 positive extents, ``x`` fastest.
        block_dim : int or sequence of int, default 1
            Threads per block: 1 to 3 positive extents.
        shared_mem_bytes : int, optional
            Shared memory per block in bytes (``None``: 0).

        Raises
        ------
        ArgumentError
            When ``grid_dim`` or ``block_dim`` is not 1 to 3 positive ints, when
            ``shared_mem_bytes`` is negative, or when ``fn`` was compiled for another device.
        ShmemStateError
            When the context is closed.
        """
        self._live("enqueue_function")
        grid = as_dim3(grid_dim, "DeviceContext.enqueue_function", "grid_dim")
        block = as_dim3(block_dim, "DeviceContext.enqueue_function", "block_dim")
        shmem_bytes = 0 if shared_mem_bytes is None else int(shared_mem_bytes)
        if shmem_bytes < 0:
            raise ArgumentError(
                "DeviceContext.enqueue_function: invalid shared_mem_bytes (got "
                f"{shared_mem_bytes}; expected >= 0)"
            )
        func = fn if isinstance(fn, Function) else self.compile_function(fn)
        if func.device != self.device:
            raise ArgumentError(
                f"DeviceContext.enqueue_function: {func!r} was compiled for "
                f"{func.device.label}, not {self.device.label}"
            )
        self._impl.launch(func.impl, args, grid, block, shmem_bytes)

    def execution_time(self, fn: Callable[[DeviceContext], object], num_iters: int) -> int:
        """Nanoseconds for ``num_iters`` calls of ``fn(ctx)`` and the work they queue
        (CUDA events on a GPU; the host clock between synchronizations on the host).

        Parameters
        ----------
        fn : callable
            Called as ``fn(ctx)`` with this context; it queues the work to time.
        num_iters : int
            How many calls (>= 1).

        Returns
        -------
        int
            Nanoseconds for all ``num_iters`` calls together.

        Raises
        ------
        ArgumentError
            When ``num_iters`` is less than 1.
        ShmemStateError
            When the context is closed.
        """
        self._live("execution_time")
        if num_iters < 1:
            raise ArgumentError(
                f"DeviceContext.execution_time: invalid num_iters (got {num_iters}; expected >= 1)"
            )
        self.synchronize()
        start = self.record_event()
        for _ in range(num_iters):
            fn(self)
        end = self.record_event()
        self.synchronize()
        return round(end.elapsed_time(start) * 1e6)

    # -- events and ordering ---------------------------------------------------------------------

    def record_event(self) -> Event:
        """An event at the current end of this stream.

        Returns
        -------
        Event
            Done once everything queued before it has run.
        """
        self._live("record_event")
        return self._impl.record()

    def enqueue_wait_for(self, other: DeviceContext | Event) -> None:
        """Work queued here after this call waits for everything queued on ``other`` (or for
        ``other`` the event) so far.

        Parameters
        ----------
        other : DeviceContext or Event
            The stream (everything queued on it so far) or the event to wait for.
        """
        self._live("enqueue_wait_for")
        ev = other.record_event() if isinstance(other, DeviceContext) else other
        self._impl.wait(ev)

    def synchronize(self) -> None:
        """Wait for all queued work (host-blocking); raise :class:`AsyncExecutionError` if any
        of it failed since the last synchronize."""
        self._live("synchronize")
        self._impl.synchronize(self.device.label)

    def get_driver_version(self) -> DriverVersion:
        """The CUDA driver version on a GPU; this package's version on the host.

        Returns
        -------
        DriverVersion
            ``(major, minor)``.
        """
        return self._impl.driver_version()

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Synchronize and release the stream (queued errors are raised first)."""
        if self._closed:
            return
        try:
            self.synchronize()
        finally:
            self._closed = True
            self._impl.close()

    def __enter__(self) -> DeviceContext:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the body's exception matters more
            self.close()


lend_class(DeviceContext)
