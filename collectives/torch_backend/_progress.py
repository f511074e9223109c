"""One ordered progress queue per process group, and the Works torch gets back.

torch issues a group's calls from the thread that runs the user's code and, with DDP, from
autograd's thread; every call of a group runs on that group's queue in the order it was
issued, one at a time, so two ranks can never run a group's calls in different orders.
A call made while the queue is idle runs at once on the caller's thread (no thread hop for
the common blocking call); a call made while earlier ones are pending, or one that asks to
run in the background (DDP's gradient buckets, above ``inline_max_nbytes``), is run by the
queue's worker thread, which overlaps it with the caller's work (the backward pass).

Every call returns a Work with a ``torch.futures.Future`` (what ``Work.wait()``,
``Work.get_future()`` and DDP's comm hooks use). A call run inline raises on the caller's
thread as it happens; one run by the worker sets its future's exception, and ``wait()``
raises it on the caller's thread with the type and message intact.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

__all__ = ["ProgressQueue"]

Call = Callable[[], Any]


class _QueuedWork(dist.Work):
    """A call the worker runs: ``wait()`` raises what the call raised (torch's own
    future-wrapping Work drops the exception)."""

    def __init__(self, fut: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except BaseException as exc:
            return exc
        return None

    def get_future(self) -> torch.futures.Future[Any]:
        return self._fut


class ProgressQueue:
    """Runs one group's calls in issue order (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._pending: collections.deque[tuple[Call, torch.futures.Future[Any]]] = (
            collections.deque()
        )
        self._busy = False  # a call is running (inline or on the worker)
        self._worker: threading.Thread | None = None
        self._closed = False
        self.failure: BaseException | None = None  # the first call that raised

    def submit(self, call: Call, *, background: bool = False) -> Any:
        """Run ``call`` in issue order; a Work whose future holds its result."""
        fut: torch.futures.Future[Any] = torch.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the process group is shut down")
            inline = not background and not self._busy and not self._pending
            if inline:
                self._busy = True
            else:
                self._pending.append((call, fut))
                self._start_worker()
                self._ready.notify()
        if not inline:
            return _QueuedWork(fut)
        try:
            result = call()
        except BaseException as exc:  # raised here, on the caller's thread
            if self.failure is None:
                self.failure = exc
            raise
        finally:
            with self._lock:
                self._busy = False
                self._ready.notify_all()
        fut.set_result(result)
        return _create_work_from_future(fut)

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._serve, name=f"{self.name}-progress", daemon=True
            )
            self._worker.start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (self._busy or not self._pending):
                    self._ready.wait()
                if not self._pending:
                    return  # closed and drained
                call, fut = self._pending.popleft()
                self._busy = True
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # the caller's wait() raises it
                error = exc
                if self.failure is None:
                    self.failure = exc
            with self._lock:  # idle before the caller learns the call is done
                self._busy = False
                self._ready.notify_all()
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)

    def drain(self) -> None:
        """Wait until every call issued so far has run."""
        with self._lock:
            while self._busy or self._pending:
                self._ready.wait()

    def close(self) -> None:
        """Run what is pending, then stop the worker."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
