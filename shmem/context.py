"""DeviceContext: a stream of execution on one device (the seed Mojo ``DeviceContext``).

On the host the stream is an ordered queue served by one worker thread, asynchronous like a
CUDA stream: ``enqueue_*`` returns at once, work runs in order, and an exception inside queued
work is kept and raised at the next :meth:`DeviceContext.synchronize` (with the original
traceback); work queued after a failure is skipped until then. Host "kernels" are Python
callables run once per block index, blocks spread over a thread pool (numpy releases the GIL).
On a GPU the stream is a cuda.core ``Stream`` and kernels are NVRTC-compiled CUDA C++
(``shmem._cuda``).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ._version import __version__
from .device import Device, as_device
from .errors import ArgumentError, AsyncExecutionError, ShmemStateError

if TYPE_CHECKING:
    from .memory import Buffer

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
    """A compiled kernel for one device: a Python callable on the host, or a CUDA kernel."""

    def __init__(self, name: str, device: Device, impl: Any) -> None:
        self.name = name
        self.device = device
        self.impl = impl

    def __repr__(self) -> str:
        return f"Function({self.name!r}, device={self.device.label})"


class Event:
    """A point in a stream: done once the stream reaches it; timed on the host clock or by
    CUDA events. ``end - start`` (or ``end.elapsed_time(start)``) gives milliseconds."""

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
        """Block until the stream has reached this event (host-blocking)."""
        if self._impl is not None:
            self._impl.sync()
            return
        if not self._done.wait(timeout):
            raise TimeoutError(f"Event.synchronize: not reached within {timeout} s")

    def elapsed_time(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event (both must be done)."""
        if self._impl is not None and start._impl is not None:
            return float(self._impl - start._impl)
        if not (self._done.is_set() and start._done.is_set()):
            raise ShmemStateError("Event.elapsed_time: both events must be done first")
        return (self._time - start._time) * 1e3

    def __sub__(self, start: Event) -> float:
        return self.elapsed_time(start)


_STOP = object()


class _HostStream:
    """The host stream: one worker thread running queued callables in order."""

    def __init__(self, label: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"shmem-{label}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, always = item
            if self._error is not None and not always:
                continue  # skipped after a failure, until synchronize() reports it
            try:
                fn()
            except BaseException as exc:  # kept for synchronize(), like a CUDA stream error
                if self._error is None:
                    self._error = exc

    def submit(self, fn: Callable[[], object], always: bool = False) -> None:
        self._queue.put((fn, always))

    def take_error(self) -> BaseException | None:
        err, self._error = self._error, None
        return err

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()


class DeviceContext:
    """A stream of execution on ``device`` (default: the host). A context manager: leaving
    it synchronizes and closes the stream.

    Every ``enqueue_*`` call is stream-ordered and returns at once; ``*_sync`` forms return
    when the work is done; :meth:`synchronize` waits for everything queued so far and raises
    :class:`AsyncExecutionError` if queued work failed.
    """

    def __init__(self, device: Device | str | None = None) -> None:
        self.device = as_device(device, "DeviceContext")
        self._closed = False
        self._pool: ThreadPoolExecutor | None = None
        self._host: _HostStream | None = None
        self._gpu: Any = None
        if self.device.is_host:
            self._host = _HostStream(self.device.label)
        else:
            from . import _cuda

            self._gpu = _cuda.GpuStream(self.device)

    def __repr__(self) -> str:
        return f"DeviceContext({self.device.label}{', closed' if self._closed else ''})"

    @property
    def api(self) -> str:
        return self.device.api

    @property
    def stream(self) -> Any:
        """The underlying stream: the host queue, or the cuda.core ``Stream``."""
        return self._host if self._host is not None else self._gpu.stream

    def _live(self, where: str) -> None:
        if self._closed:
            raise ShmemStateError(f"DeviceContext.{where}: the context is closed")

    # -- the host queue ---------------------------------------------------------------------

    def _host_stream(self) -> _HostStream:
        if self._host is None:  # pragma: no cover - callers branch on the device first
            raise ShmemStateError("DeviceContext: a host stream operation on a GPU context")
        return self._host

    def _submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` on the host stream (host contexts only)."""
        self._host_stream().submit(fn)

    # -- buffers ---------------------------------------------------------------------

    def enqueue_create_buffer(self, dtype: Any, count: int) -> Buffer:
        """A new buffer of ``count`` elements on this device, ordered on this stream."""
        from .memory import Buffer

        self._live("enqueue_create_buffer")
        return Buffer(dtype, (count,), device=self.device, stream=self)

    def create_buffer_sync(self, dtype: Any, count: int) -> Buffer:
        """Like :meth:`enqueue_create_buffer`, ready to use on return."""
        buf = self.enqueue_create_buffer(dtype, count)
        self.synchronize()
        return buf

    def enqueue_create_host_buffer(self, dtype: Any, count: int) -> Buffer:
        """A host buffer for transfers with this device (pinned when the device is a GPU)."""
        from .device import CPU
        from .memory import Buffer

        self._live("enqueue_create_host_buffer")
        return Buffer(dtype, (count,), device=CPU(), pinned=not self.device.is_host, stream=self)

    def malloc_host(self, dtype: Any, count: int) -> Buffer:
        """Host memory for fast transfers (pinned on a GPU context); release with
        :meth:`free_host`."""
        buf = self.enqueue_create_host_buffer(dtype, count)
        self.synchronize()
        return buf

    def free_host(self, buf: Buffer) -> None:
        """Release a buffer from :meth:`malloc_host` once queued work using it is done."""
        self.synchronize()
        buf.close()

    def enqueue_copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst`` (host->device, device->host, device->device or host->host).

        Both must be contiguous with the same dtype and element count; numpy arrays are
        accepted on either side (as zero-copy host buffers).
        """
        from .memory import Buffer

        self._live("enqueue_copy")
        d = Buffer._coerce(dst, "enqueue_copy", "dst")
        s = Buffer._coerce(src, "enqueue_copy", "src")
        Buffer._check_copy_pair(d, s, "DeviceContext.enqueue_copy", contiguous=True)
        d._copy_from(s, self)

    def enqueue_copy_sync(self, dst: Any, src: Any) -> None:
        self.enqueue_copy(dst, src)
        self.synchronize()

    def enqueue_memset(self, buf: Buffer, value: Any) -> None:
        """Set every element of ``buf`` to ``value`` (cast to its dtype), stream-ordered."""
        self._live("enqueue_memset")
        buf._fill(value, self)

    def memset_sync(self, buf: Buffer, value: Any) -> None:
        self.enqueue_memset(buf, value)
        self.synchronize()

    @contextlib.contextmanager
    def map_to_host(self, buf: Buffer) -> Iterator[np.ndarray[Any, Any]]:
        """A numpy view of ``buf`` on the host; writes reach the device when the block exits.

        Host buffers are mapped in place; device buffers go through a host copy that is
        written back at exit (stream-ordered, and synchronized).
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
        """
        self._live("compile_function")
        if self._gpu is not None:
            kernel_name = name or ""
            if not isinstance(source_or_callable, str) or not kernel_name:
                raise ArgumentError(
                    "DeviceContext.compile_function: a GPU kernel needs CUDA C++ source text and "
                    f"a kernel name (got {type(source_or_callable).__name__}, name={name!r})"
                )
            kernel = self._gpu.compile(source_or_callable, kernel_name, options)
            return Function(kernel_name, self.device, kernel)
        if callable(source_or_callable):
            fn_name = name or str(getattr(source_or_callable, "__name__", "kernel"))
            return Function(fn_name, self.device, source_or_callable)
        if isinstance(source_or_callable, str) and name:
            namespace: dict[str, Any] = {"np": np, "numpy": np}
            exec(compile(source_or_callable, f"<kernel {name}>", "exec"), namespace)
            fn = namespace.get(name)
            if not callable(fn):
                raise ArgumentError(
                    f"DeviceContext.compile_function: the source defines no callable {name!r}"
                )
            return Function(name, self.device, fn)
        raise ArgumentError(
            "DeviceContext.compile_function: expected a callable, or source text with a name "
            f"(got {type(source_or_callable).__name__}, name={name!r})"
        )

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
        blocks spread over a thread pool; :class:`~shmem.memory.Buffer` arguments arrive as
        zero-copy numpy arrays. GPU: a :class:`Function` from :meth:`compile_function`;
        buffers are passed as device pointers, Python ints and floats must be numpy scalars.
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
        if self._gpu is not None:
            self._gpu.launch(func.impl, args, grid, block, shmem_bytes)
            return
        host_args = tuple(_host_arg(a) for a in args)
        self._submit(lambda: self._run_grid(func.impl, host_args, grid, block, shmem_bytes))

    def _run_grid(
        self,
        fn: Callable[..., object],
        args: tuple[Any, ...],
        grid: Dim3,
        block: Dim3,
        shmem_bytes: int,
    ) -> None:
        def one(idx: tuple[int, int, int]) -> None:
            b = Block(Dim3(*idx), grid, block, np.zeros(shmem_bytes, np.uint8))
            fn(b, *args)

        indices = [
            (x, y, z) for z, y, x in itertools.product(range(grid.z), range(grid.y), range(grid.x))
        ]
        if len(indices) == 1:
            one(indices[0])
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.device.attributes.cores or 1,
                thread_name_prefix=f"shmem-{self.device.label}-block",
            )
        futures = [self._pool.submit(one, idx) for idx in indices]
        errors = []
        for fut in futures:
            exc = fut.exception()
            if exc is not None:
                errors.append(exc)
        if errors:
            raise errors[0]

    def execution_time(self, fn: Callable[[DeviceContext], object], num_iters: int) -> int:
        """Nanoseconds for ``num_iters`` calls of ``fn(ctx)`` and the work they queue
        (CUDA events on a GPU; the host clock between synchronizations on the host)."""
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
        """An event at the current end of this stream."""
        self._live("record_event")
        if self._gpu is not None:
            return Event(self._gpu.record())
        ev = Event()
        self._host_stream().submit(ev._fire, always=True)
        return ev

    def enqueue_wait_for(self, other: DeviceContext | Event) -> None:
        """Work queued here after this call waits for everything queued on ``other`` (or for
        ``other`` the event) so far."""
        self._live("enqueue_wait_for")
        ev = other.record_event() if isinstance(other, DeviceContext) else other
        if self._gpu is not None:
            self._gpu.wait(ev)
            return
        self._host_stream().submit(ev.synchronize, always=True)

    def synchronize(self) -> None:
        """Wait for all queued work (host-blocking); raise :class:`AsyncExecutionError` if any
        of it failed since the last synchronize."""
        self._live("synchronize")
        if self._gpu is not None:
            self._gpu.sync()
            return
        host = self._host_stream()
        done = threading.Event()
        host.submit(done.set, always=True)
        done.wait()
        err = host.take_error()
        if err is not None:
            tb = "".join(traceback.format_exception(err))
            raise AsyncExecutionError(
                f"DeviceContext.synchronize: queued work on {self.device.label} failed: "
                f"{type(err).__name__}: {err}\n{tb}"
            ) from err

    def get_driver_version(self) -> DriverVersion:
        """The CUDA driver version on a GPU; this package's version on the host."""
        if self._gpu is not None:
            return DriverVersion(*self._gpu.driver_version())
        major, minor = (int(p) for p in __version__.split(".")[:2])
        return DriverVersion(major, minor)

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Synchronize and release the stream (queued errors are raised first)."""
        if self._closed:
            return
        try:
            self.synchronize()
        finally:
            self._closed = True
            if self._host is not None:
                self._host.stop()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self._gpu is not None:
                self._gpu.close()

    def __enter__(self) -> DeviceContext:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the body's exception matters more
            self.close()


def _host_arg(arg: Any) -> Any:
    from .memory import Buffer

    if isinstance(arg, Buffer):
        return arg.to_numpy()
    return arg
