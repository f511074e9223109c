"""How the ranks of a sequence-parallel attention call agree, before any symmetric allocation.

Two steps. First every rank meets the others in a call of the communicator's channel with
this call's signature (:func:`collectives.barrier.meet`): a rank in another collective of
the communicator (an all-reduce, a barrier) is then a mismatch every rank reports with every
rank's own account of its call, instead of a wait the deadline ends. Then one all-gather of
every rank's arguments, its shard's rows, its call number and any local argument error:
this rank's error raises here, another rank's raises as that error on every rank, and
arguments that differ raise ``CollectiveMismatchError`` with every rank's call in the table
every rank builds from the same gathered records (:mod:`shmem.callreport`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shmem import flight
from shmem.agreement import allgather_within
from shmem.callreport import CallLine, mismatch_error
from shmem.errors import CollectiveMismatchError

from ..signature import signature

if TYPE_CHECKING:
    from ..communicator import Communicator

__all__ = ["agree", "meet_first", "text_of"]

# the record's fields (sp_setup.setup makes it), as a report names them
_FIELDS = (
    "schedule",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "causal",
    "window_left",
    "window_right",
    "valid_length",
    "scale",
    "block_m",
    "block_n",
    "unit_rows",
    "stats",
)


def text_of(where: str, record: tuple[Any, ...], rows: int) -> str:
    """A call of ``where`` as a report line shows it: its rows, then its record's fields."""
    if len(record) != len(_FIELDS):
        return f"{where}(invalid arguments)"
    fields = ", ".join(f"{k}={v}" for k, v in zip(_FIELDS, record, strict=True))
    return f"{where}(rows={rows}, {fields})"


def meet_first(comm: Communicator, where: str, text: str) -> None:
    """Every rank of ``comm`` in a ``where`` call (on the host engine's channel; the GPU
    engine meets in the all-gather of :func:`agree`). ``text``: this rank's call."""
    meet = getattr(comm._engine, "meet", None)
    if meet is not None:
        meet(where, text, signature((where, 0, "uint8")))


def agree(
    comm: Communicator,
    where: str,
    record: tuple[Any, ...],
    rows: int,
    error: Exception | None,
) -> list[int]:
    """One all-gather of every rank's record, row count, call number and local error (see
    the module). Returns the ranks' row counts."""
    world = comm.world
    call = flight.recorder().calls(getattr(comm, "stream", 0))
    gathered = allgather_within(
        world.comm,
        (record, rows, None if error is None else str(error), call),
        world.config.signal.timeout_s,
        where,
        world.heap.progress,
    )
    if error is not None:
        raise error
    bad = [(r, e) for r, (_, _, e, _) in enumerate(gathered) if e is not None]
    if bad:
        raise CollectiveMismatchError(
            f"{where}: invalid arguments on other ranks: "
            + "; ".join(f"rank {r}: {e}" for r, e in bad)
        )
    if any(rec != gathered[0][0] for rec, *_ in gathered):
        lines = [
            CallLine(r, r, int(c), text_of(where, rec, int(n)))
            for r, (rec, n, _, c) in enumerate(gathered)
        ]
        raise mismatch_error(where, lines)
    return [int(n) for _, n, _, _ in gathered]
