"""Options of sequence-parallel attention: one frozen object for the forward and the backward.

>>> opts = SequenceParallelOptions(causal=True, schedule="dynamic", unit_rows=512)
>>> out, lse = sequence_parallel_attention(  # doctest: +SKIP
...     comm, q, k, v, options=opts, return_lse=True
... )
>>> grads = sequence_parallel_attention_backward(  # doctest: +SKIP
...     comm, do, q, k, v, out, lse, options=opts
... )

Keywords still work alone (``causal=True``) and override fields of ``options``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, SupportsInt, TypedDict

from shmem.errors import SequenceParallelError

__all__ = ["Schedule", "ScheduleName", "SequenceParallelKeywords", "SequenceParallelOptions"]


class Schedule(enum.StrEnum):
    """How work is spread over ranks; ``Schedule.DYNAMIC`` and ``"dynamic"`` are
    interchangeable."""

    DYNAMIC = "dynamic"  # units in per-rank queues; idle ranks take units from busy ones
    RING = "ring"  # K/V rows pass around the ring, one rank's shard per step
    ZIGZAG = "zigzag"  # ring over the 2P-chunk causal balancing (``zigzag_shard``)


ScheduleName = Literal["dynamic", "ring", "zigzag"]
Window = int | tuple[int | None, int | None] | None


@dataclass(frozen=True, slots=True)
class SequenceParallelOptions:
    """What a sequence-parallel attention call computes and how it is scheduled.

    Every rank passes equal options (checked across ranks in the call).

    Parameters
    ----------
    causal : bool
        Each query sees keys at global positions up to its own.
    window : int or (left, right), optional
        Sliding window on global positions, as for :func:`collectives.mha.attention`.
    valid_length : sequence of int, optional
        Global row offsets of the documents packed in the sequence (``[0, ..., total]``):
        attention stays within a document (document-causal with ``causal=True``).
    scale : float, optional
        Softmax scale (default ``1 / sqrt(head_dim)``).
    schedule : Schedule or {"dynamic", "ring", "zigzag"}
        ``dynamic`` balances causal and ragged work at run time; ``zigzag`` needs the inputs
        sharded with :func:`zigzag_shard`.
    block_m, block_n : int
        Query rows and keys per tile.
    unit_rows : int, optional
        ``dynamic``: query and key rows per work unit. By default a unit is a quarter of the
        longest shard's queries (at least ``block_m``) against one rank's whole shard of
        keys, so each query chunk folds one partial result per home rank, as on the ring;
        an explicit ``unit_rows`` cuts both sides. Smaller units balance better and take
        more symmetric memory (a home rank keeps one partial ``(O, LSE)`` per unit it owns).
    threads : int, optional
        Compute threads of this rank (default: the host's cores / ranks on this node).
    """

    causal: bool = False
    window: Window = None
    valid_length: Sequence[SupportsInt] | None = None
    scale: float | None = None
    schedule: Schedule | str = Schedule.DYNAMIC
    block_m: int = 128
    block_n: int = 256
    unit_rows: int | None = None
    threads: int | None = None


class SequenceParallelKeywords(TypedDict, total=False):
    """The fields of :class:`SequenceParallelOptions`, as keyword arguments."""

    causal: bool
    window: Window
    valid_length: Sequence[SupportsInt] | None
    scale: float | None
    schedule: Schedule | str
    block_m: int
    block_n: int
    unit_rows: int | None
    threads: int | None


_FIELDS = frozenset(f.name for f in dataclasses.fields(SequenceParallelOptions))


def resolve_options(
    options: SequenceParallelOptions | None, overrides: SequenceParallelKeywords, where: str
) -> SequenceParallelOptions:
    """``options`` (default: the defaults) with ``overrides`` applied. The values themselves
    are checked by the call (on every rank, before it agrees with the others)."""
    if options is not None and not isinstance(options, SequenceParallelOptions):
        raise SequenceParallelError(
            f"{where}: options must be a SequenceParallelOptions (got {type(options).__name__})"
        )
    unknown = sorted(set(overrides) - _FIELDS)
    if unknown:
        raise SequenceParallelError(
            f"{where}: unknown keyword(s) {unknown} (expected fields of "
            f"SequenceParallelOptions: {sorted(_FIELDS)})"
        )
    base = options or SequenceParallelOptions()
    return dataclasses.replace(base, **overrides) if overrides else base
