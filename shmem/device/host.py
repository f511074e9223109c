"""The host device kind: numpy memory, a worker-thread stream, Python-callable kernels.

The host stream is an ordered queue served by one worker thread, asynchronous like a CUDA
stream: work runs in order, and an exception inside queued work is kept and raised at the next
``synchronize`` (with the original traceback); work queued after a failure is skipped until
then. Host "kernels" are Python callables run once per block index, blocks spread over a
thread pool (numpy releases the GIL).
"""

from __future__ import annotations

import ctypes
import itertools
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..errors import ArgumentError, AsyncExecutionError
from .context import Block, Dim3, DriverVersion, Event, Function

if TYPE_CHECKING:
    from .context import DeviceContext
    from .devices import Device
    from .dlpack import DLPackView
    from .memory import Buffer

__all__ = ["HOST", "HostImpl", "HostStream"]

_STOP = object()


class HostStream:
    """One worker thread running queued callables in order (the host's StreamImpl)."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._thread = threading.Thread(target=self._run, name=f"shmem-{device.label}", daemon=True)
        self._thread.start()

    @property
    def handle(self) -> object:
        return self

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

    # -- kernels ---------------------------------------------------------------------------

    def compile(self, source_or_callable: object, name: str | None, options: object) -> Function:
        if callable(source_or_callable):
            fn_name = name or str(getattr(source_or_callable, "__name__", "kernel"))
            return Function(fn_name, self._device, source_or_callable)
        if isinstance(source_or_callable, str) and name:
            namespace: dict[str, Any] = {"np": np, "numpy": np}
            exec(compile(source_or_callable, f"<kernel {name}>", "exec"), namespace)
            fn = namespace.get(name)
            if not callable(fn):
                raise ArgumentError(
                    f"DeviceContext.compile_function: the source defines no callable {name!r}"
                )
            return Function(name, self._device, fn)
        raise ArgumentError(
            "DeviceContext.compile_function: expected a callable, or source text with a name "
            f"(got {type(source_or_callable).__name__}, name={name!r})"
        )

    def launch(
        self, kernel: object, args: tuple[Any, ...], grid: Dim3, block: Dim3, shmem_bytes: int
    ) -> None:
        fn: Callable[..., object] = kernel  # type: ignore[assignment]
        host_args = tuple(_host_arg(a) for a in args)
        self.submit(lambda: self._run_grid(fn, host_args, grid, block, shmem_bytes))

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
                max_workers=self._device.attributes.cores or 1,
                thread_name_prefix=f"shmem-{self._device.label}-block",
            )
        futures = [self._pool.submit(one, idx) for idx in indices]
        errors = [exc for fut in futures if (exc := fut.exception()) is not None]
        if errors:
            raise errors[0]

    # -- ordering --------------------------------------------------------------------------

    def record(self) -> Event:
        ev = Event()
        self.submit(ev._fire, always=True)
        return ev

    def wait(self, event: Event) -> None:
        self.submit(event.synchronize, always=True)

    def synchronize(self, label: str) -> None:
        done = threading.Event()
        self.submit(done.set, always=True)
        done.wait()
        err, self._error = self._error, None
        if err is not None:
            tb = "".join(traceback.format_exception(err))
            raise AsyncExecutionError(
                f"DeviceContext.synchronize: queued work on {label} failed: "
                f"{type(err).__name__}: {err}\n{tb}"
            ) from err

    def driver_version(self) -> DriverVersion:
        """This package's version (the host has no driver)."""
        major, minor = (int(p) for p in __version__.split(".")[:2])
        return DriverVersion(major, minor)

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class HostImpl:
    """The host's DeviceImpl: numpy arrays, in place or queued on a host stream."""

    api = "cpu"
    is_host = True

    def allocate(
        self,
        device: Device,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        pinned: bool,
        stream: DeviceContext | None,
    ) -> tuple[np.ndarray[Any, Any] | None, object, bool]:
        raw = None
        if pinned:  # page-locked memory needs the CUDA driver; ordinary memory without one
            from .cuda import pinned_host_array

            raw = pinned_host_array(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        if raw is None:
            return np.empty(shape, dtype=dtype), None, False
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return raw[:nbytes].view(dtype).reshape(shape), None, True

    def copy(self, dst: Buffer, src: Buffer, ctx: DeviceContext | None) -> None:
        dst_arr, src_arr = dst.to_numpy(), src.to_numpy()
        if dst_arr.shape != src_arr.shape:  # contiguous copies of equal counts
            dst_arr, src_arr = dst_arr.reshape(-1), src_arr.reshape(-1)
        self._run(ctx, lambda: np.copyto(dst_arr, src_arr))

    def fill(self, buf: Buffer, scalar: np.ndarray[Any, Any], ctx: DeviceContext | None) -> None:
        arr = buf.to_numpy()
        self._run(ctx, lambda: arr.fill(scalar))

    @staticmethod
    def _run(ctx: DeviceContext | None, work: Callable[[], object]) -> None:
        """Queue ``work`` on a host context; otherwise run it now, after any GPU context's
        queued work (a GPU stream may still be writing the host memory)."""
        impl = None if ctx is None else ctx.stream_impl
        if isinstance(impl, HostStream):
            impl.submit(work)
            return
        if ctx is not None:
            ctx.synchronize()
        work()

    def wait_unordered(self, device: Device) -> None:
        return None

    def create_stream(self, device: Device) -> HostStream:
        return HostStream(device)

    def import_dlpack(self, view: DLPackView) -> Buffer:
        from .memory import Buffer

        return Buffer._host(view.to_numpy(), keepalive=view)

    def wrap(self, device: Device, ptr: int, nbytes: int) -> Buffer:
        from .memory import Buffer

        raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
        return Buffer._host(np.ctypeslib.as_array(raw).reshape(nbytes), keepalive=raw)


HOST = HostImpl()


def _host_arg(arg: object) -> object:
    from .memory import Buffer

    if isinstance(arg, Buffer):
        return arg.to_numpy()
    return arg
