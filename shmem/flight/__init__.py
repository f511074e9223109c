"""The flight recorder: each rank's last collective and synchronisation calls, in memory.

Every rank keeps its last ``[flight] records`` calls (default 64) in a ring: for each call
the stream it ran on (0: the World's own calls, ``init``, ``barrier``, ``wait_until``,
collective allocations; 1, 2, ...: the Communicators, each numbered alike on its members),
its number on that stream (``seq``: the n-th call of the stream, the same on every rank of a
collective; waits and locks are numbered apart), the operation, the bytes and dtype of its
input, when it started and ended, and its state (pending, done, failed). When a job fails
or stalls the launcher reads every rank's ring and says which rank never arrived at the
call the others wait in (:mod:`launch.stall`).

Under the launcher the ring is a file, ``rank.<r>.flight`` in the log directory, mapped
shared: the launcher reads it from outside, even while the rank is stopped or blocked, and
it survives the rank's death. Elsewhere it is anonymous memory. A record costs two clock
reads and a few stores: the C replay of the cached small collectives
(``collectives._replay``) writes its records itself, in C, with the kernel's coarse clock
(a few milliseconds of resolution; ``LAYOUT`` is the format both sides write, and a test
checks that they agree).

The format (native byte order): a 128-byte header (``magic``, ``version``, ``record_size``,
``capacity``, ``rank``, ``pid``, ``next``: how many records were ever begun, ``enabled``,
``world_size``); the per-stream call counters (``MAX_STREAMS`` int64: they outlive the
records); each stream's members (``MAX_STREAMS`` int64: a CRC of the communicator's world
ranks); then ``capacity`` records of 64 bytes: ``seq``, ``nbytes``, ``t_start``, ``t_end``
(``time.time()`` seconds), ``number`` (the record's index among all begun), ``stream``
(int32), ``op`` (int16, ``OPS``), ``state`` (int16), ``peer`` (int32: a wait's peer or
a broadcast's root, -1), ``dtype`` (12 bytes, ASCII).

The package is pure: it imports neither MPI nor CUDA. ``layout`` is the format, ``writer``
the writer (``_ring``: its C half), ``log`` the reader.
"""

from __future__ import annotations

from .layout import LAYOUT, OPS, WAITS, op_code
from .log import FlightLog, FlightRecord, read_flight
from .writer import (
    FlightRecorder,
    configure,
    install,
    recorded,
    recorder,
    recording,
)

__all__ = [
    "LAYOUT",
    "OPS",
    "WAITS",
    "FlightLog",
    "FlightRecord",
    "FlightRecorder",
    "configure",
    "install",
    "op_code",
    "read_flight",
    "recorded",
    "recorder",
    "recording",
]
