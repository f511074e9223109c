"""Each process's flight recorder (:mod:`shmem.flight`): the ring, and how calls are
recorded into it."""

from __future__ import annotations

import functools
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, cast

from .layout import (
    _ENABLED_WORD,
    _HEADER,
    _MEMBERS_AT,
    _NEXT_WORD,
    _NUMBER_AT,
    _OP_CODE,
    _RECORD,
    _RECORDS_AT,
    _STATE_AT,
    _T_END_AT,
    DONE,
    FAILED,
    HEADER_BYTES,
    MAGIC,
    MAX_RECORDS,
    PENDING,
    RECORD_BYTES,
    VERSION,
    WAIT_COUNTER,
    WAITS,
    _dtype_bytes,
)
from .log import FlightLog, parse

try:  # the C writer, built by the install where a compiler is (the same records without)
    from . import _ring as _c_ring  # type: ignore[attr-defined]
except ImportError:
    _c_ring = None

__all__ = ["FlightRecorder", "configure", "install", "recorded", "recorder", "recording"]


class FlightRecorder:
    """One process's ring of its last calls (see the module docstring).

    Parameters
    ----------
    capacity : int
        Records kept (the oldest are overwritten); 0 keeps none (the recorder is off).
    path : path-like, optional
        A file to map (the launcher reads it); anonymous memory when None.
    rank, world_size : int
        Written into the header, for the reader.

    Raises
    ------
    ValueError
        ``capacity`` negative or above ``MAX_RECORDS``.
    OSError
        ``path`` cannot be created or mapped.
    """

    def __init__(
        self,
        capacity: int,
        path: str | os.PathLike[str] | None = None,
        *,
        rank: int = -1,
        world_size: int = 0,
    ) -> None:
        if not 0 <= capacity <= MAX_RECORDS:
            raise ValueError(
                f"FlightRecorder: capacity out of range (got {capacity}; expected 0 to "
                f"{MAX_RECORDS} records)"
            )
        self.capacity = capacity
        self.path = Path(path) if path is not None else None
        size = _RECORDS_AT + max(capacity, 1) * RECORD_BYTES
        self.rank, self.world_size = rank, world_size
        if self.path is None:
            self._map = mmap.mmap(-1, size)
        else:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, size)
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self.buffer = memoryview(self._map)
        _HEADER.pack_into(
            self._map, 0, MAGIC, VERSION, RECORD_BYTES, capacity, rank, os.getpid(), 0, 0, 0
        )
        self._words = self.buffer[:HEADER_BYTES].cast("q")
        self._words[_ENABLED_WORD] = 1 if capacity else 0
        self._words[_ENABLED_WORD + 1] = world_size
        self._counters = self.buffer[HEADER_BYTES:_MEMBERS_AT].cast("q")
        self._members = self.buffer[_MEMBERS_AT:_RECORDS_AT].cast("q")
        self._records = _RECORDS_AT
        self._streams = 1  # stream 0 is the World's
        # the C writer (shmem.flight._ring), where it is built and the ring has room
        waits = [_OP_CODE[w] for w in WAITS]
        self._c: Any = _c_ring.Ring(self.buffer, capacity, waits) if _c_ring and capacity else None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether calls are recorded (False with no capacity; settable, for benchmarks)."""
        return bool(self._words[_ENABLED_WORD])

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._words[_ENABLED_WORD] = 1 if on and self.capacity else 0

    def new_stream(
        self, members: Iterable[int] = (), agree: Callable[[int], list[int]] | None = None
    ) -> int:
        """A number for a new Communicator's calls, the same on every member: the highest of
        the members' next numbers, when ``agree`` all-gathers them (1, 2, ... 62, then 1
        again: the 63rd communicator takes the first one's place, its counter started anew).
        Its members are written beside its counter, and its first record is a
        ``communicator`` marker (number 0).

        Parameters
        ----------
        members : iterable of int
            The communicator's world ranks.
        agree : callable, optional
            ``agree(n)``: every member's ``n`` (an all-gather over the communicator's ranks:
            collective), so that every member gives the communicator the same number.

        Returns
        -------
        int
            The stream's number.
        """
        with self._lock:
            proposal = self._streams
        agreed = max(agree(proposal)) if agree is not None else proposal
        with self._lock:
            self._streams = max(self._streams, agreed + 1)
        # streams 1 .. MAX_STREAMS - 2 (the last counter is the waits'), taken again in turn
        # once used up: a communicator made after 62 others takes the oldest one's place
        stream = 1 + (agreed - 1) % (WAIT_COUNTER - 1)
        self._counters[stream] = 0
        self._members[stream] = zlib.crc32(repr(tuple(members)).encode())
        self.end(self.begin(stream, "communicator", numbered=False))
        return stream

    def calls(self, stream: int) -> int:
        """How many numbered calls ``stream`` has begun: the number of its current (or
        last) call, as the launcher's report names it; 0 with the recorder off.

        Parameters
        ----------
        stream : int
            0 (the World's calls) or a Communicator's stream.

        Returns
        -------
        int
        """
        return int(self._counters[stream]) if self.capacity else 0

    def begin(
        self,
        stream: int,
        op: str,
        nbytes: int = 0,
        dtype: object = "",
        peer: int = -1,
        *,
        numbered: bool = True,
    ) -> int:
        """Record the start of a call.

        Parameters
        ----------
        stream : int
            0 (the World's calls) or a Communicator's :meth:`new_stream`.
        op : str
            One of ``OPS``.
        nbytes : int, optional
            The bytes of the call's input.
        dtype : object, optional
            Its dtype (a numpy dtype or its name).
        peer : int, optional
            The rank the call waits for or starts from (a wait's peer, a broadcast's root).
        numbered : bool, optional
            Give the call the next number of its stream (False: 0, a marker).

        Returns
        -------
        int
            The record's number, for :meth:`end`; -1 when the recorder is off.
        """
        if self._c is not None:  # (in C: two clock reads and a few stores)
            return int(
                self._c.begin(
                    stream, _OP_CODE.get(op, 0), nbytes, _dtype_bytes(dtype), peer, numbered
                )
            )
        words = self._words
        if not words[_ENABLED_WORD]:
            return -1
        # the lock orders this process's threads; the C replay's own records (which take no
        # lock) cannot come in between: there is no call in here where the GIL could pass
        with self._lock:
            n = words[_NEXT_WORD]
            words[_NEXT_WORD] = n + 1
            counter = WAIT_COUNTER if op in WAITS else stream
            seq = self._counters[counter] + 1 if numbered else 0
            self._counters[counter] += numbered
        _RECORD.pack_into(
            self._map,
            self._records + (n % self.capacity) * RECORD_BYTES,
            seq,
            nbytes,
            time.time(),
            0.0,
            n,
            stream,
            _OP_CODE.get(op, 0),
            PENDING,
            peer,
            _dtype_bytes(dtype),
        )
        return int(n)

    def end(self, number: int, failed: bool = False) -> None:
        """Record the end of call ``number`` (a no-op for -1, or once the ring has moved on).

        Parameters
        ----------
        number : int
            What :meth:`begin` (or the C replay) returned.
        failed : bool, optional
            The call raised.
        """
        if self._c is not None:
            self._c.end(number, failed)
            return
        if number < 0:
            return
        at = self._records + (number % self.capacity) * RECORD_BYTES
        if struct.unpack_from("=q", self._map, at + _NUMBER_AT)[0] != number:
            return  # overwritten by a newer record
        struct.pack_into("=d", self._map, at + _T_END_AT, time.time())
        struct.pack_into("=h", self._map, at + _STATE_AT, FAILED if failed else DONE)

    def fail_current(self, stream: int) -> None:
        """Record now that this process's current call on ``stream`` (its newest pending
        record there) failed: a rank about to report a mismatch says so before it waits
        for the other ranks' lines, so a rank the job's abort ends while it waits has its
        call recorded failed, as the launcher and the report say it is (the call's own
        :meth:`end` comes later, and records the same).

        Parameters
        ----------
        stream : int
            0 (the World's calls) or a Communicator's stream.
        """
        if not self.capacity:
            return
        pending = [r for r in self.log().records if r.stream == stream and r.state == "pending"]
        if pending:
            self.end(pending[-1].number, failed=True)

    def log(self) -> FlightLog:
        """What the ring holds now.

        Returns
        -------
        FlightLog
            The header's fields, the counters and the records, oldest first.
        """
        return parse(bytes(self._map))


def recording(stream: int, op: str, x: object = None, peer: int = -1) -> Any:
    """Record one call for the time of a ``with`` block: pending inside it, done after it,
    failed when it raises.

    Parameters
    ----------
    stream : int
        0 (the World's calls) or a Communicator's stream (``Communicator.stream``).
    op : str
        One of ``OPS``.
    x : object, optional
        The call's input: its ``nbytes`` and ``dtype`` are recorded.
    peer : int, optional
        The rank the call waits for or starts from.

    Returns
    -------
    context manager
        The call, begun.
    """
    rec = _recorder or recorder()
    nbytes, dtype = _size_of(x) if x is not None else (0, "")
    if rec._c is not None:
        return rec._c.call(stream, _OP_CODE.get(op, 0), nbytes, _dtype_bytes(dtype), peer)
    return _Recording(rec, rec.begin(stream, op, nbytes, dtype, peer))


class _Recording:
    """:func:`recording`'s context manager where the C writer is not built."""

    __slots__ = ("_n", "_rec")

    def __init__(self, rec: FlightRecorder, n: int) -> None:
        self._rec, self._n = rec, n

    def __enter__(self) -> _Recording:
        return self

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        self._rec.end(self._n, kind is not None)


_F = TypeVar("_F", bound=Callable[..., Any])


def recorded(op: str, stream: int = 0) -> Callable[[_F], _F]:
    """Decorate a function so that its calls are recorded on ``stream`` as ``op``.

    Parameters
    ----------
    op : str
        One of ``OPS``.
    stream : int, optional
        The stream (0: the World's own).

    Returns
    -------
    callable
        The decorator.
    """

    def wrap(fn: _F) -> _F:
        if _c_ring is not None:  # a C callable: the recorder's two C calls, no frame
            return cast(
                _F, functools.update_wrapper(_c_ring.Recorded(fn, stream, _OP_CODE.get(op, 0)), fn)
            )

        def call(*args: Any, **kwargs: Any) -> Any:
            with recording(stream, op):
                return fn(*args, **kwargs)

        return cast(_F, functools.update_wrapper(call, fn))

    return wrap


def _size_of(x: object) -> tuple[int, object]:
    """``x``'s bytes and dtype, as far as it says (an input the call itself will refuse may
    have neither, or raise on asking)."""
    try:
        return int(getattr(x, "nbytes", 0) or 0), getattr(x, "dtype", "")
    except Exception:
        return 0, ""


_recorder: FlightRecorder | None = None
_install_lock = threading.Lock()


def recorder() -> FlightRecorder:
    """This process's recorder: the one :func:`install` put in place (the launcher's rank
    does, with a file in the log directory), else one in memory with ``[flight] records``.

    Returns
    -------
    FlightRecorder
        The process-wide recorder.
    """
    global _recorder
    if _recorder is None:
        from ..config import load_config

        try:  # (a bad configuration is init's to report, not the recorder's)
            records = load_config().flight.records
        except Exception:
            records = 64
        with _install_lock:
            if _recorder is None:
                _recorder = _current(FlightRecorder(records))
    return _recorder


def configure(records: int) -> FlightRecorder:
    """Make this process's recorder keep ``records`` calls (``shmem.init`` does, with its
    ``[flight] records``): a new ring where the size differs (in the same file, which the
    launcher reads; records of the old one are left there), the old one switched off for 0.

    Parameters
    ----------
    records : int
        The calls to keep; 0 turns the recorder off.

    Returns
    -------
    FlightRecorder
        The recorder now in place.
    """
    rec = recorder()
    if records == rec.capacity or (records == 0 and not rec.enabled):
        return rec
    if records == 0:
        rec.enabled = False
        return rec
    path = None if rec.path is None else rec.path.with_name(rec.path.name + ".new")
    new = FlightRecorder(records, path, rank=rec.rank, world_size=rec.world_size)
    new._streams = rec._streams
    new._counters[:] = rec._counters
    new._members[:] = rec._members
    if path is not None and rec.path is not None:
        os.replace(path, rec.path)  # the old mapping keeps its own (unlinked) file
        new.path = rec.path
    return install(new)


def install(rec: FlightRecorder) -> FlightRecorder:
    """Make ``rec`` this process's recorder (the launcher's rank, before the program runs).

    Parameters
    ----------
    rec : FlightRecorder
        The recorder every later call records into.

    Returns
    -------
    FlightRecorder
        ``rec``.
    """
    global _recorder
    with _install_lock:
        _recorder = _current(rec)
    return rec


def _current(rec: FlightRecorder) -> FlightRecorder:
    """``rec``, made the ring the C-recorded functions write into (where built)."""
    if _c_ring is not None:
        _c_ring.set_current(rec._c)
    return rec
