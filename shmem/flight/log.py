"""Reading a flight recorder's ring (:mod:`shmem.flight`), live or left by a rank that
ended."""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass

from .layout import (
    _HEADER,
    _MEMBERS_AT,
    _RECORD,
    _RECORDS_AT,
    EMPTY,
    HEADER_BYTES,
    MAGIC,
    MAX_STREAMS,
    OPS,
    RECORD_BYTES,
    STATES,
    VERSION,
)

__all__ = ["FlightLog", "FlightRecord", "parse", "read_flight"]


@dataclass(frozen=True)
class FlightRecord:
    """One recorded call.

    Parameters
    ----------
    number : int
        The record's index among all the rank has begun.
    stream : int
        0 (the World's calls) or a Communicator's stream.
    seq : int
        The call's number on its stream (0: the stream's marker; waits are numbered apart).
    op : str
        The operation (``shmem.flight.OPS``).
    nbytes : int
        The bytes of the call's input.
    dtype : str
        Its dtype's name.
    peer : int
        The rank the call waits for or starts from (-1: none).
    t_start, t_end : float
        When it started and ended (``time.time()``; ``t_end`` 0 while pending).
    state : str
        ``"pending"``, ``"done"`` or ``"failed"``.
    """

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
        """The call in words.

        Returns
        -------
        str
            ``all_reduce #21`` (with its communicator when it is not the first).
        """
        where = "" if self.stream <= 1 else f" (communicator {self.stream})"
        return f"{self.op} #{self.seq}{where}"

    def as_dict(self) -> dict[str, object]:
        """The record's fields, for JSON.

        Returns
        -------
        dict
            Field name -> value.
        """
        return asdict(self)


@dataclass(frozen=True)
class FlightLog:
    """A rank's ring as read.

    Parameters
    ----------
    rank, world_size, pid : int
        The rank's, from the ring's header.
    capacity : int
        The records the ring keeps.
    recorded : int
        The calls it has ever begun (the older ones beyond ``capacity`` are gone).
    records : tuple of FlightRecord
        The records it holds, oldest first.
    counters : tuple of int
        The calls begun on each stream (they outlive the records).
    members : tuple of int
        Each stream's members (a CRC of their world ranks; 0: no such stream).
    """

    rank: int
    world_size: int
    pid: int
    capacity: int
    recorded: int  # calls ever begun (those beyond capacity are gone)
    records: tuple[FlightRecord, ...]
    counters: tuple[int, ...]  # calls begun on each stream (outlive the records)
    members: tuple[int, ...]  # each stream's members (a CRC of their world ranks; 0: none)

    def last_completed(self) -> FlightRecord | None:
        """The newest call that ended well.

        Returns
        -------
        FlightRecord or None
            The record; None when there is none.
        """
        return next((r for r in reversed(self.records) if r.state == "done"), None)

    def pending(self) -> FlightRecord | None:
        """The call the rank is in.

        Returns
        -------
        FlightRecord or None
            Its newest pending record (a call inside it may have ended), else its newest
            record if that one failed; None when the rank is outside every recorded call.
        """
        inside = next((r for r in reversed(self.records) if r.state == "pending"), None)
        if inside is None and self.records and self.records[-1].state == "failed":
            return self.records[-1]
        return inside


def parse(data: bytes) -> FlightLog:
    magic, version, size, capacity, rank, pid, recorded_n, _, world = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or size != RECORD_BYTES:
        raise ValueError(
            f"read_flight: not a flight recorder ring (magic {magic!r}, version {version}, "
            f"record size {size}; expected {MAGIC!r}, {VERSION}, {RECORD_BYTES})"
        )
    base = _RECORDS_AT
    counters = struct.unpack_from(f"={MAX_STREAMS}q", data, HEADER_BYTES)
    members = struct.unpack_from(f"={MAX_STREAMS}q", data, _MEMBERS_AT)
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
    return FlightLog(rank, world, pid, capacity, recorded_n, tuple(out), counters, members)


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
    if len(data) < _RECORDS_AT:
        raise ValueError(f"read_flight: {path}: too short for a flight recorder ring")
    return parse(data)
