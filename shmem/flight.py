"""The flight recorder: each rank's last collective and synchronisation calls, in memory.

Every rank keeps its last ``[flight] records`` calls (default 64) in a ring: for each call
the stream it ran on (0: the World's own calls, ``init``, ``barrier``, ``wait_until``; 1, 2,
...: the Communicators, numbered in the order this process made them), its number on that
stream (``seq``: the n-th recorded call of the stream, the same on every rank of a
collective), the operation, the bytes and dtype of its input, when it started and ended,
and its state (pending, done, failed). When a job fails or stalls the launcher reads every
rank's ring and says which rank never arrived at the call the others wait in
(:mod:`launch.stall`).

Under the launcher the ring is a file, ``rank.<r>.flight`` in the log directory, mapped
shared: the launcher reads it from outside, even while the rank is stopped or blocked, and
it survives the rank's death. Elsewhere it is anonymous memory. A record costs two clock
reads and a few stores: the C replay of the cached small collectives
(``collectives._replay``) writes its records itself, in C (:data:`LAYOUT` is the format
both sides write; a test checks that they agree).

The format (native byte order): a 128-byte header (``magic``, ``version``, ``record_size``,
``capacity``, ``rank``, ``pid``, ``next``: how many records were ever begun, ``enabled``,
``world_size``), the per-stream call counters (``MAX_STREAMS`` int64), then ``capacity``
records of 64 bytes: ``seq``, ``nbytes``, ``t_start``, ``t_end`` (``time.time()`` seconds),
``number`` (the record's own index among all begun), ``stream`` (int32), ``op`` (int16,
:data:`OPS`), ``state`` (int16), ``peer`` (int32: a wait's peer or a broadcast's root, -1),
``dtype`` (12 bytes, ASCII).

This module is pure: it imports neither MPI nor CUDA.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

__all__ = [
    "LAYOUT",
    "OPS",
    "WAITS",
    "FlightLog",
    "FlightRecord",
    "FlightRecorder",
    "install",
    "read_flight",
    "recorded",
    "recorder",
    "recording",
]

MAGIC = b"SHFLIGHT"
VERSION = 1
HEADER_BYTES = 128
MAX_STREAMS = 64
RECORD_BYTES = 64
_HEADER = struct.Struct("=8siiiiqqqq")  # magic version record_size capacity rank pid next ...
_RECORD = struct.Struct("=qqddqihhi12s")
assert _RECORD.size == RECORD_BYTES
_T_END_AT, _NUMBER_AT, _STATE_AT = 24, 32, 46  # byte offsets in a record
# the word indices of the header's int64 view (the C replay and this module count on them)
_NEXT_WORD, _ENABLED_WORD = 4, 5
LAYOUT = {
    "header_bytes": HEADER_BYTES,
    "max_streams": MAX_STREAMS,
    "record_bytes": RECORD_BYTES,
    "next_word": _NEXT_WORD,
    "enabled_word": _ENABLED_WORD,
}
"""The ring's offsets, as the C replay writes it (its constants must match these)."""

EMPTY, PENDING, DONE, FAILED = 0, 1, 2, 3
STATES = {EMPTY: "empty", PENDING: "pending", DONE: "done", FAILED: "failed"}

OPS = (
    "unknown",
    "init",
    "barrier",
    "sync_all",
    "wait_until",
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
    "collect",
    "alltoalls",
    "all_to_allv",
    "sequence_parallel_attention",
    "sequence_parallel_attention_backward",
    "finalize",
    "alloc",
    "free",
    "set_lock",
    "communicator",
)
"""The operations a record names, by code (the C replay is given the code)."""
_OP_CODE = {name: i for i, name in enumerate(OPS)}
WAITS = frozenset({"wait_until", "set_lock"})
"""The operations that are no collectives: a rank's own waits, numbered apart from its
collectives (every rank makes the same collectives, in order, not the same waits)."""
_WAIT_COUNTER = MAX_STREAMS - 1  # their counter: no stream's
MAX_RECORDS = 1 << 20


def op_code(op: str) -> int:
    """The code of operation ``op`` (0, ``"unknown"``, for a name not in :data:`OPS`)."""
    return _OP_CODE.get(op, 0)


def _dtype_bytes(dtype: object) -> bytes:
    name = str(getattr(dtype, "name", dtype) or "").removeprefix("torch.")
    return name.encode("ascii", "replace")[:12]


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
        ``capacity`` negative or above :data:`MAX_RECORDS`.
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
        size = HEADER_BYTES + MAX_STREAMS * 8 + max(capacity, 1) * RECORD_BYTES
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
        self._counters = self.buffer[HEADER_BYTES : HEADER_BYTES + MAX_STREAMS * 8].cast("q")
        self._records = HEADER_BYTES + MAX_STREAMS * 8
        self._streams = 1  # stream 0 is the World's
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether calls are recorded (False with no capacity; settable, for benchmarks)."""
        return bool(self._words[_ENABLED_WORD])

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._words[_ENABLED_WORD] = 1 if on and self.capacity else 0

    def new_stream(self) -> int:
        """A number for a new Communicator's calls (1, 2, ... in the order of the calls; the
        last one is shared once ``MAX_STREAMS - 2`` are used), and its first record, a
        ``communicator`` marker (number 0): the ranks with a record on a stream are its
        members.

        Returns
        -------
        int
            The stream's number.
        """
        with self._lock:
            stream = min(self._streams, _WAIT_COUNTER - 1)
            self._streams += 1
        self.end(self.begin(stream, "communicator", numbered=False))
        return stream

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
            One of :data:`OPS`.
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
        words = self._words
        if not words[_ENABLED_WORD]:
            return -1
        # the lock orders this process's threads; the C replay's own records (which take no
        # lock) cannot come in between: there is no call in here where the GIL could pass
        with self._lock:
            n = words[_NEXT_WORD]
            words[_NEXT_WORD] = n + 1
            counter = _WAIT_COUNTER if op in WAITS else stream
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
        if number < 0:
            return
        at = self._records + (number % self.capacity) * RECORD_BYTES
        if struct.unpack_from("=q", self._map, at + _NUMBER_AT)[0] != number:
            return  # overwritten by a newer record
        struct.pack_into("=d", self._map, at + _T_END_AT, time.time())
        struct.pack_into("=h", self._map, at + _STATE_AT, FAILED if failed else DONE)

    def log(self) -> FlightLog:
        """What the ring holds now (:class:`FlightLog`: the header's fields, the records)."""
        return _parse(bytes(self._map))


class recording:  # (a context manager, named like contextlib.suppress)
    """Record one call for the time of a ``with`` block: pending inside it, done after it,
    failed when it raises.

    Parameters
    ----------
    stream : int
        0 (the World's calls) or a Communicator's stream (``Communicator.stream``).
    op : str
        One of :data:`OPS`.
    x : object, optional
        The call's input: its ``nbytes`` and ``dtype`` are recorded.
    peer : int, optional
        The rank the call waits for or starts from.
    """

    __slots__ = ("_n", "_rec")

    def __init__(self, stream: int, op: str, x: object = None, peer: int = -1) -> None:
        rec = self._rec = _recorder or recorder()
        self._n = rec.begin(stream, op, getattr(x, "nbytes", 0), getattr(x, "dtype", ""), peer)

    def __enter__(self) -> recording:
        return self

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        self._rec.end(self._n, kind is not None)


_F = TypeVar("_F", bound=Callable[..., Any])


def recorded(op: str, stream: int = 0) -> Callable[[_F], _F]:
    """Decorate a function so that its calls are recorded on ``stream`` as ``op``.

    Parameters
    ----------
    op : str
        One of :data:`OPS`.
    stream : int, optional
        The stream (0: the World's own).

    Returns
    -------
    callable
        The decorator.
    """

    def wrap(fn: _F) -> _F:
        def call(*args: Any, **kwargs: Any) -> Any:
            with recording(stream, op):
                return fn(*args, **kwargs)

        return cast(_F, functools.update_wrapper(call, fn))

    return wrap


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
        from .config import load_config

        with _install_lock:
            if _recorder is None:
                _recorder = FlightRecorder(load_config().flight.records)
    return _recorder


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
        _recorder = rec
    return rec


@dataclass(frozen=True)
class FlightRecord:
    """One recorded call (see the module docstring for the fields)."""

    number: int
    stream: int
    seq: int
    op: str
    nbytes: int
    dtype: str
    peer: int
    t_start: float
    t_end: float
    state: str

    def describe(self) -> str:
        """``all_reduce #21`` (with its communicator when it is not the first)."""
        where = "" if self.stream <= 1 else f" (communicator {self.stream})"
        return f"{self.op} #{self.seq}{where}"

    def as_dict(self) -> dict[str, object]:
        """The record's fields, for JSON."""
        return asdict(self)


@dataclass(frozen=True)
class FlightLog:
    """A rank's ring as read: its header's fields and its records, oldest first."""

    rank: int
    world_size: int
    pid: int
    capacity: int
    recorded: int  # calls ever begun (those beyond capacity are gone)
    records: tuple[FlightRecord, ...]

    def last_completed(self) -> FlightRecord | None:
        """The newest call that ended well (None when there is none)."""
        return next((r for r in reversed(self.records) if r.state == "done"), None)

    def pending(self) -> FlightRecord | None:
        """The rank's newest record when it has not ended or failed (None when the rank is
        outside every recorded call)."""
        last = self.records[-1] if self.records else None
        return last if last is not None and last.state in ("pending", "failed") else None


def _parse(data: bytes) -> FlightLog:
    magic, version, size, capacity, rank, pid, recorded_n, _, world = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or size != RECORD_BYTES:
        raise ValueError(
            f"read_flight: not a flight recorder ring (magic {magic!r}, version {version}, "
            f"record size {size}; expected {MAGIC!r}, {VERSION}, {RECORD_BYTES})"
        )
    base = HEADER_BYTES + MAX_STREAMS * 8
    out = []
    for i in range(max(0, recorded_n - capacity), recorded_n):
        at = base + (i % capacity) * RECORD_BYTES
        if at + RECORD_BYTES > len(data):
            break
        seq, nbytes, t0, t1, number, stream, op, state, peer, dt = _RECORD.unpack_from(data, at)
        if number != i or state == EMPTY:
            continue  # being written (a reader of a live ring), or torn
        out.append(
            FlightRecord(
                number,
                stream,
                seq,
                OPS[op] if 0 <= op < len(OPS) else f"op {op}",
                nbytes,
                dt.rstrip(b"\0").decode("ascii", "replace"),
                peer,
                t0,
                t1,
                STATES.get(state, f"state {state}"),
            )
        )
    return FlightLog(rank, world, pid, capacity, recorded_n, tuple(out))


def read_flight(path: str | os.PathLike[str]) -> FlightLog:
    """Read a ring file (``rank.<r>.flight``), live or left by a rank that ended.

    Parameters
    ----------
    path : path-like
        The file.

    Returns
    -------
    FlightLog
        Its header's fields and records, oldest first.

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        It is no ring (wrong magic, version or record size).
    """
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < HEADER_BYTES:
        raise ValueError(f"read_flight: {path}: too short for a flight recorder ring")
    return _parse(data)
