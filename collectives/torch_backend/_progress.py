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
    future-wrapping Work drops the exception). Waited for on the worker's own thread (a
    future's callback that issues a call and waits for it, as torch's PowerSGD hook does),
    the waiter runs the queue's calls itself, in order, up to its own."""

    def __init__(self, queue: ProgressQueue, fut: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._queue = queue
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        if threading.current_thread() is self._queue.worker:
            self._queue.run_until(self._fut)
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


Pending = tuple[Call, "torch.futures.Future[Any]"]


class ProgressQueue:
    """Runs one group's calls in issue order, one at a time (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._pending: collections.deque[Pending] = collections.deque()
        self._busy = False  # a call is running (inline, on the worker, or helped)
        self.worker: threading.Thread | None = None
        self._closed = False

    def submit(self, call: Call, *, background: bool = False) -> Any:
        """Run ``call`` in issue order; a Work whose future holds its result. Run inline
        (on this thread, now) when the queue is idle and ``background`` is false: then an
        error is raised here."""
        fut: torch.futures.Future[Any] = torch.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the process group is shut down")
            inline = not background and not self._busy and not self._pending
            if inline:
                self._busy = True
            else:
                self._pending.append((call, fut))
                if self.worker is None:
                    self.worker = threading.Thread(
                        target=self._serve, name=f"{self.name}-progress", daemon=True
                    )
                    self.worker.start()
                self._ready.notify_all()
        if not inline:
            return _QueuedWork(self, fut)
        try:
            result = call()
        finally:
            self._idle()
        fut.set_result(result)
        return _create_work_from_future(fut)

    def _idle(self) -> None:
        with self._lock:
            self._busy = False
            self._ready.notify_all()

    def _run(self, item: Pending) -> None:
        """Run a taken call; the queue is idle again before its future completes (so a
        caller that learns of it can issue inline)."""
        call, fut = item
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as exc:  # the waiter's wait() raises it
            error = exc
        self._idle()
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)

    def _serve(self) -> None:
        while True:
            with self._lock:
                while self._busy or (not self._closed and not self._pending):
                    self._ready.wait()
                if not self._pending:
                    return  # closed and drained
                item = self._pending.popleft()
                self._busy = True
            self._run(item)

    def run_until(self, fut: torch.futures.Future[Any]) -> None:
        """On the worker's thread (inside a future's callback): run the pending calls in
        order until ``fut`` is done."""
        while not fut.done():
            with self._lock:
                if self._busy or not self._pending:
                    return  # not ours to run: wait for it
                item = self._pending.popleft()
                self._busy = True
            self._run(item)

    def close(self) -> None:
        """Run what is pending, wait for a running call, then stop the worker."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()
            if threading.current_thread() is not self.worker:
                while self._busy or self._pending:
                    self._ready.wait()
            worker = self.worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
