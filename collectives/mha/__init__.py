"""Multi-head attention: persistent tile schedulers (the MAX ``MHATileScheduler`` model), the
FlashAttention-2 tile kernel on the host, and single-process attention."""

from __future__ import annotations

from .attention import attention, attention_backward
from .kernel import attention_tile, attention_tile_backward
from .options import Schedule, SequenceParallelOptions
from .scheduler import (
    AtomicCounter,
    MaskSpec,
    MHASchedule,
    MHASchedulerSynchronization,
    MHATileScheduler,
    MHATileState,
    MHATileSummary,
    QueuedTileScheduler,
    SeqInfo,
    TileScheduler,
    TransientScheduler,
    WorkInfo,
    WorkSlots,
)
from .sequence_parallel import (
    SequenceParallelStats,
    sequence_parallel_attention,
    sequence_parallel_attention_backward,
    simulate_straggler,
    zigzag_shard,
    zigzag_unshard,
)

__all__ = [
    "AtomicCounter",
    "MHASchedule",
    "MHASchedulerSynchronization",
    "MHATileScheduler",
    "MHATileState",
    "MHATileSummary",
    "MaskSpec",
    "QueuedTileScheduler",
    "Schedule",
    "SeqInfo",
    "SequenceParallelOptions",
    "SequenceParallelStats",
    "TileScheduler",
    "TransientScheduler",
    "WorkInfo",
    "WorkSlots",
    "attention",
    "attention_backward",
    "attention_tile",
    "attention_tile_backward",
    "sequence_parallel_attention",
    "sequence_parallel_attention_backward",
    "simulate_straggler",
    "zigzag_shard",
    "zigzag_unshard",
]
