"""Thread support levels (OpenSHMEM's ``shmem_init_thread`` / ``shmem_query_thread``).

The level a World provides is what the library can keep: the MPI underneath (mpi4py starts
MPI with ``MPI_THREAD_MULTIPLE`` unless ``mpi4py.rc.thread_level`` says otherwise) and the
runtime's own locks (each context's operation list, the lazily made default context, the
heap's pending requests). With MPI at ``MPI_THREAD_MULTIPLE`` every level up to
:attr:`ThreadLevel.MULTIPLE` is provided: any thread may issue RMA, atomics, waits and
signals, on its own context or a shared one, and collectives on communicators no other thread
is using at the same time (as OpenSHMEM says of teams). Below it the World provides MPI's
level: with ``FUNNELED`` only the thread that called :func:`shmem.init` may call the library,
with ``SERIALIZED`` one thread at a time; these are promises the program makes.
"""

from __future__ import annotations

import enum
from typing import Any

from .errors import ArgumentError

__all__ = ["ThreadLevel", "provided_level"]


class ThreadLevel(enum.IntEnum):
    """OpenSHMEM's (and MPI's) thread levels, ordered: a higher level allows more."""

    SINGLE = 0  # SHMEM_THREAD_SINGLE: one thread in the program
    FUNNELED = 1  # only the thread that initialised the library calls it
    SERIALIZED = 2  # any thread, one at a time
    MULTIPLE = 3  # any thread, at any time

    @classmethod
    def parse(cls, value: object, where: str) -> ThreadLevel:
        """``value`` as a level: a ThreadLevel, its name (any case) or its number."""
        if isinstance(value, ThreadLevel):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
            return cls(value)
        raise ArgumentError(
            f"{where}: invalid thread_level (got {value!r}; expected a shmem.ThreadLevel or one "
            "of 'single', 'funneled', 'serialized', 'multiple')"
        )


def mpi_level(mpi: Any) -> ThreadLevel:
    """The level MPI provides in this process (``MPI_Query_thread``)."""
    provided = mpi.Query_thread()
    for level, name in (
        (ThreadLevel.MULTIPLE, "THREAD_MULTIPLE"),
        (ThreadLevel.SERIALIZED, "THREAD_SERIALIZED"),
        (ThreadLevel.FUNNELED, "THREAD_FUNNELED"),
    ):
        if provided == getattr(mpi, name):
            return level
    return ThreadLevel.SINGLE


def provided_level(requested: ThreadLevel | None, mpi: ThreadLevel) -> ThreadLevel:
    """What a World provides: the level asked for (or the highest when none is), never more
    than MPI's."""
    wanted = ThreadLevel.MULTIPLE if requested is None else requested
    return min(wanted, mpi)
