"""Persistent multi-head-attention tile schedulers (the ``MHATileScheduler`` model of Modular MAX).

A *work item* is one query tile (``block_m`` rows) of one head of one sequence. Workers (host
threads here, CTAs on a GPU, ranks in the distributed version) ask the scheduler for work:

    state = sched.initial_state(worker, summary)
    while True:
        info = sched.get_current_work_info(summary, state)     # what to compute now
        ... compute the tile ...
        if not sched.may_advance or sched.advance(summary, state, pipeline_idx) is None:
            break

Orders (``MHASchedule``) map a linear index to (batch, head, tile):

* ``DEFAULT``: prompt tile fastest, then head, then batch.
* ``PROMPT_ROTATE``: as DEFAULT, but odd heads walk their prompt tiles in reverse, so
  neighbouring workers pair cheap and expensive causal tiles.
* ``LPT``: longest processing time first: items sorted by their number of KV tiles under the
  mask (descending; ties by batch, tile, head), for causal and ragged work.

Pure Python: no MPI, no numpy arrays are touched by the schedulers themselves.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

__all__ = [
    "AtomicCounter",
    "MHASchedule",
    "MHASchedulerSynchronization",
    "MHATileScheduler",
    "MHATileState",
    "MHATileSummary",
    "MaskSpec",
    "QueuedTileScheduler",
    "SeqInfo",
    "TileScheduler",
    "TransientScheduler",
    "WorkInfo",
    "WorkSlots",
]


class MHASchedule(enum.Enum):
    DEFAULT = "default"
    PROMPT_ROTATE = "prompt_rotate"
    LPT = "lpt"


class MHASchedulerSynchronization(enum.Enum):
    """How ``advance`` synchronises a worker's producer with its consumers (MAX's
    ``MHASchedulerSynchronization``), for a pipeline in which one producer claims work and
    the consumers of the same worker compute it:

    * ``NONE``: no synchronisation; the caller orders the producer's publish before the
      consumers' read (a consumer reading a stage not yet published raises).
    * ``PRODUCER``: consumers wait until the producer has published the stage's next item.
    * ``ALL``: as ``PRODUCER``, and the producer also waits until every consumer has read
      the stage's previous item before overwriting it (a full handshake).

    Static schedulers (``TileScheduler``, ``TransientScheduler``) need none: every thread
    computes the same next item.
    """

    NONE = 0
    PRODUCER = 1
    ALL = 2


class WorkSlots:
    """What a worker's producer and consumers share (MAX keeps it in shared memory): one
    slot per pipeline stage, holding ``(step, item)``, and how many consumers read it."""

    def __init__(self, stages: int, consumers: int, timeout_s: float = 60.0) -> None:
        self.consumers = consumers
        self.timeout_s = timeout_s
        self._slots: dict[int, tuple[int, int]] = {}
        self._reads: dict[int, int] = {}
        self._cv = threading.Condition()
        self.stages = stages

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        if not self._cv.wait_for(ready, self.timeout_s):
            raise TimeoutError(f"advance: {what} did not happen within {self.timeout_s:g} s")

    def publish(self, stage: int, step: int, item: int, wait_free: bool) -> None:
        with self._cv:
            if wait_free and stage in self._slots:
                self._wait(
                    lambda: self._reads.get(stage, 0) >= self.consumers,
                    f"the consumers' read of stage {stage}",
                )
            self._slots[stage] = (step, item)
            self._reads[stage] = 0
            self._cv.notify_all()

    def read(self, stage: int, step: int, wait: bool) -> int:
        with self._cv:

            def ready() -> bool:
                got = self._slots.get(stage)
                return got is not None and got[0] == step

            if not ready():
                if not wait:
                    raise RuntimeError(
                        f"advance: stage {stage} of step {step} is not published yet "
                        "(sync=NONE: publish before consumers read, or use PRODUCER/ALL)"
                    )
                self._wait(ready, f"the producer's publish of stage {stage} (step {step})")
            self._reads[stage] = self._reads.get(stage, 0) + 1
            self._cv.notify_all()
            return self._slots[stage][1]


@dataclass(frozen=True)
class MaskSpec:
    """Which keys a query row sees: all, causal (keys <= the row), and/or a sliding window
    of ``left`` keys before and ``right`` keys after the row (None: unbounded)."""

    causal: bool = False
    left: int | None = None
    right: int | None = None

    def kv_range(self, q0: int, q1: int, seq_len: int) -> tuple[int, int]:
        """Keys ``[kv_start, kv_end)`` that rows ``[q0, q1)`` may see (a superset per row)."""
        start, end = 0, seq_len
        if self.causal:
            end = min(end, q1)
        if self.left is not None:
            start = max(start, q0 - self.left)
        if self.right is not None:
            end = min(end, q1 - 1 + self.right + 1)
        return start, max(start, end)


@dataclass(frozen=True)
class MHATileSummary:
    """The shape of the work: ``batch_size`` sequences, ``max_num_prompt_tiles`` query tiles
    of ``block_m`` rows in the longest, ``valid_length`` as row offsets (``batch_size + 1``
    increasing ints, ragged) or None (every sequence ``max_seq_len`` long, padded)."""

    batch_size: int
    max_num_prompt_tiles: int
    valid_length: tuple[int, ...] | None
    max_seq_len: int
    num_heads: int = 1
    block_m: int = 64
    block_n: int = 64
    mask: MaskSpec = field(default_factory=MaskSpec)

    @classmethod
    def create(
        cls,
        *,
        num_heads: int,
        block_m: int,
        block_n: int = 64,
        seq_len: int | None = None,
        batch_size: int | None = None,
        row_offsets: Sequence[int] | None = None,
        mask: MaskSpec | None = None,
    ) -> MHATileSummary:
        """From a padded ``(batch_size, seq_len)`` shape or ragged ``row_offsets``."""
        if row_offsets is not None:
            offs = tuple(int(o) for o in row_offsets)
            if len(offs) < 2 or offs[0] != 0 or any(b < a for a, b in itertools.pairwise(offs)):
                raise ValueError(
                    f"MHATileSummary: invalid row offsets (got {offs[:8]}...; expected 0 then "
                    "non-decreasing ints)"
                )
            longest = max(b - a for a, b in itertools.pairwise(offs))
            batch = len(offs) - 1
        else:
            if seq_len is None or batch_size is None:
                raise ValueError(
                    "MHATileSummary.create: give seq_len and batch_size, or row_offsets"
                )
            offs, longest, batch = None, seq_len, batch_size
        if block_m < 1 or block_n < 1 or num_heads < 1:
            raise ValueError(
                f"MHATileSummary: invalid sizes (got block_m={block_m}, block_n={block_n}, "
                f"num_heads={num_heads}; expected positive ints)"
            )
        return cls(
            batch,
            -(-longest // block_m),
            offs,
            longest,
            num_heads,
            block_m,
            block_n,
            mask or MaskSpec(),
        )

    def seq_len(self, batch: int) -> int:
        if self.valid_length is None:
            return self.max_seq_len
        return self.valid_length[batch + 1] - self.valid_length[batch]

    def start_of_seq(self, batch: int) -> int:
        if self.valid_length is None:
            return batch * self.max_seq_len
        return self.valid_length[batch]

    @property
    def num_items(self) -> int:
        """Work items counted with padding (every sequence as long as the longest)."""
        return self.batch_size * self.num_heads * self.max_num_prompt_tiles

    def cost(self, batch: int, tile: int) -> int:
        """KV tiles a query tile reads under the mask (0 for a tile past the sequence)."""
        n = self.seq_len(batch)
        q0 = tile * self.block_m
        if q0 >= n:
            return 0
        start, end = self.mask.kv_range(q0, min(q0 + self.block_m, n), n)
        return -(-(end - start) // self.block_n) if end > start else 0


@dataclass(frozen=True)
class WorkInfo:
    """A work item: rows ``[prompt_offset, prompt_offset + block_m)`` of head ``head_idx`` of
    sequence ``prompt_idx``, reading keys ``[kv_start, kv_end)``."""

    prompt_offset: int
    head_idx: int
    prompt_idx: int
    is_valid: bool
    kv_start: int = 0
    kv_end: int = 0


@dataclass(frozen=True)
class SeqInfo:
    """Where the item's sequence lives: its length and first row, and the item itself."""

    seq_len: int
    start_of_seq: int
    prompt_offset: int
    head_idx: int
    prompt_idx: int

    def is_valid(self) -> bool:
        return self.prompt_offset < self.seq_len


@dataclass
class MHATileState:
    """One worker's position: the linear work index it holds (``idx >= total`` when done)."""

    worker: int
    idx: int
    step: int = 0  # advances made (pairs a producer's publish with its consumers' reads)


class AtomicCounter:
    """A fetch-and-add counter shared by the workers of a queued scheduler."""

    def __init__(self, start: int = 0) -> None:
        self._value = start
        self._lock = threading.Lock()

    def fetch_add(self, n: int = 1) -> int:
        with self._lock:
            old = self._value
            self._value += n
            return old

    def reset(self, value: int) -> None:
        with self._lock:
            self._value = value


class MHATileScheduler(Protocol):
    """The protocol every scheduler follows (see the module docstring)."""

    may_advance: ClassVar[bool]
    mha_schedule: MHASchedule

    def grid_dim(self, batch_size: int, max_num_prompt_tiles: int) -> tuple[int, int, int]: ...

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState: ...

    def get_current_work_info(self, summary: MHATileSummary, state: MHATileState) -> WorkInfo: ...

    def advance(
        self,
        summary: MHATileSummary,
        state: MHATileState,
        pipeline_idx: int = 0,
        *,
        producer: bool = True,
        sync: MHASchedulerSynchronization = MHASchedulerSynchronization.NONE,
    ) -> SeqInfo | None: ...

    def unsafe_seq_info(self, summary: MHATileSummary, state: MHATileState) -> SeqInfo: ...


class _Ordered:
    """The order shared by all schedulers: linear index -> (batch, head, tile)."""

    def __init__(self, schedule: MHASchedule | str = MHASchedule.DEFAULT) -> None:
        self.mha_schedule = MHASchedule(schedule)
        self._lpt_cache: tuple[MHATileSummary, list[tuple[int, int, int]]] | None = None

    def _lpt(self, summary: MHATileSummary) -> list[tuple[int, int, int]]:
        if self._lpt_cache is None or self._lpt_cache[0] != summary:
            items = [
                (b, h, t)
                for b in range(summary.batch_size)
                for t in range(summary.max_num_prompt_tiles)
                for h in range(summary.num_heads)
            ]
            items.sort(key=lambda it: (-summary.cost(it[0], it[2]), it[0], it[2], it[1]))
            self._lpt_cache = (summary, items)
        return self._lpt_cache[1]

    def item(self, summary: MHATileSummary, idx: int) -> tuple[int, int, int]:
        """(batch, head, tile) of linear index ``idx``."""
        if self.mha_schedule is MHASchedule.LPT:
            return self._lpt(summary)[idx]
        tiles, heads = summary.max_num_prompt_tiles, summary.num_heads
        tile = idx % tiles
        head = (idx // tiles) % heads
        batch = idx // (tiles * heads)
        if self.mha_schedule is MHASchedule.PROMPT_ROTATE and head % 2 == 1:
            tile = tiles - 1 - tile
        return batch, head, tile

    def valid(self, summary: MHATileSummary, idx: int) -> bool:
        if idx >= summary.num_items:
            return False
        batch, _, tile = self.item(summary, idx)
        return tile * summary.block_m < summary.seq_len(batch)

    def info(self, summary: MHATileSummary, idx: int) -> WorkInfo:
        if idx >= summary.num_items:
            return WorkInfo(0, 0, 0, False)
        batch, head, tile = self.item(summary, idx)
        offset = tile * summary.block_m
        n = summary.seq_len(batch)
        if offset >= n:
            return WorkInfo(offset, head, batch, False)
        kv0, kv1 = summary.mask.kv_range(offset, min(offset + summary.block_m, n), n)
        return WorkInfo(offset, head, batch, True, kv0, kv1)

    def seq(self, summary: MHATileSummary, idx: int) -> SeqInfo:
        batch, head, tile = self.item(summary, min(idx, summary.num_items - 1))
        return SeqInfo(
            summary.seq_len(batch), summary.start_of_seq(batch), tile * summary.block_m, head, batch
        )

    def get_current_work_info(self, summary: MHATileSummary, state: MHATileState) -> WorkInfo:
        return self.info(summary, state.idx)

    def unsafe_seq_info(self, summary: MHATileSummary, state: MHATileState) -> SeqInfo:
        """The item's sequence info without checking that the item exists."""
        return self.seq(summary, state.idx)


class TransientScheduler(_Ordered):
    """One work item per worker (a CUDA grid of ``tiles x heads x batch`` blocks); with
    ``flip`` the tile order is reversed so the heaviest causal tile starts first."""

    may_advance: ClassVar[bool] = False

    def __init__(
        self,
        num_heads: int = 1,
        schedule: MHASchedule | str = MHASchedule.DEFAULT,
        flip: bool = False,
    ) -> None:
        super().__init__(schedule)
        self.num_heads = num_heads
        self.flip = flip

    def grid_dim(self, batch_size: int, max_num_prompt_tiles: int) -> tuple[int, int, int]:
        return (max_num_prompt_tiles, self.num_heads, batch_size)

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        if self.flip and self.mha_schedule is not MHASchedule.LPT:
            tiles = summary.max_num_prompt_tiles
            tile = worker % tiles
            worker = worker - tile + (tiles - 1 - tile)
        return MHATileState(worker, worker)

    def advance(
        self,
        summary: MHATileSummary,
        state: MHATileState,
        pipeline_idx: int = 0,
        *,
        producer: bool = True,
        sync: MHASchedulerSynchronization = MHASchedulerSynchronization.NONE,
    ) -> SeqInfo | None:
        state.idx = summary.num_items
        state.step += 1
        return None


class TileScheduler(_Ordered):
    """Static persistent: ``num_workers`` workers, worker ``w`` takes items ``w``, ``w + W``,
    ``w + 2W`` ... (items past a ragged sequence's end are skipped)."""

    may_advance: ClassVar[bool] = True

    def __init__(self, num_workers: int, schedule: MHASchedule | str = MHASchedule.DEFAULT) -> None:
        super().__init__(schedule)
        if num_workers < 1:
            raise ValueError(
                f"TileScheduler: invalid num_workers (got {num_workers}; expected >= 1)"
            )
        self.num_workers = num_workers

    def grid_dim(self, batch_size: int, max_num_prompt_tiles: int) -> tuple[int, int, int]:
        return (self.num_workers, 1, 1)

    def _skip(self, summary: MHATileSummary, idx: int, step: Callable[[int], int]) -> int:
        while idx < summary.num_items and not self.valid(summary, idx):
            idx = step(idx)
        return idx

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        return MHATileState(worker, self._skip(summary, worker, lambda i: i + self.num_workers))

    def advance(
        self,
        summary: MHATileSummary,
        state: MHATileState,
        pipeline_idx: int = 0,
        *,
        producer: bool = True,
        sync: MHASchedulerSynchronization = MHASchedulerSynchronization.NONE,
    ) -> SeqInfo | None:
        state.step += 1
        state.idx = self._skip(
            summary, state.idx + self.num_workers, lambda i: i + self.num_workers
        )
        return self.seq(summary, state.idx) if state.idx < summary.num_items else None


class QueuedTileScheduler(_Ordered):
    """Dynamic: a shared counter preset to ``num_workers``; worker ``w`` starts on item ``w``
    and each ``advance`` takes the next unclaimed item by fetch-and-add, skipping items past a
    ragged sequence's end. ``counter`` may be any object with ``fetch_add`` (the distributed
    scheduler passes one that lives in symmetric memory)."""

    may_advance: ClassVar[bool] = True

    def __init__(
        self,
        num_workers: int,
        schedule: MHASchedule | str = MHASchedule.DEFAULT,
        counter: AtomicCounter | None = None,
        *,
        consumers: int = 0,
        pipeline_stages: int = 1,
    ) -> None:
        super().__init__(schedule)
        if num_workers < 1:
            raise ValueError(
                f"QueuedTileScheduler: invalid num_workers (got {num_workers}; expected >= 1)"
            )
        if consumers < 0 or pipeline_stages < 1:
            raise ValueError(
                f"QueuedTileScheduler: invalid pipeline (got consumers {consumers}, stages "
                f"{pipeline_stages}; expected consumers >= 0 and stages >= 1)"
            )
        self.num_workers = num_workers
        self.counter = counter or AtomicCounter(num_workers)
        self.consumers = consumers
        self.pipeline_stages = pipeline_stages
        self._slots = [WorkSlots(pipeline_stages, consumers) for _ in range(num_workers)]

    def grid_dim(self, batch_size: int, max_num_prompt_tiles: int) -> tuple[int, int, int]:
        return (self.num_workers, 1, 1)

    def reset(self) -> None:
        """Preset the counter for a new launch (before the workers start)."""
        self.counter.reset(self.num_workers)

    def _take(self, summary: MHATileSummary, idx: int) -> int:
        while idx < summary.num_items and not self.valid(summary, idx):
            idx = self.counter.fetch_add(1)
        return idx

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        return MHATileState(worker, self._take(summary, worker))

    def advance(
        self,
        summary: MHATileSummary,
        state: MHATileState,
        pipeline_idx: int = 0,
        *,
        producer: bool = True,
        sync: MHASchedulerSynchronization = MHASchedulerSynchronization.NONE,
    ) -> SeqInfo | None:
        """Move ``state`` to its next item. The producer (``producer=True``, the default)
        claims it from the shared counter and, when the scheduler has consumers, publishes
        it in stage ``pipeline_idx`` of its worker's slots; a consumer (``producer=False``)
        reads it from there instead of claiming, synchronised as ``sync`` says."""
        if not 0 <= pipeline_idx < self.pipeline_stages:
            raise ValueError(
                f"advance: invalid pipeline_idx (got {pipeline_idx}; expected 0 <= "
                f"pipeline_idx < {self.pipeline_stages})"
            )
        state.step += 1
        slots = self._slots[state.worker]
        if producer:
            state.idx = self._take(summary, self.counter.fetch_add(1))
            if self.consumers:
                wait = sync is MHASchedulerSynchronization.ALL
                slots.publish(pipeline_idx, state.step, state.idx, wait_free=wait)
        else:
            if not self.consumers:
                raise ValueError(
                    "advance: producer=False needs a scheduler made with consumers >= 1"
                )
            wait = sync is not MHASchedulerSynchronization.NONE
            state.idx = slots.read(pipeline_idx, state.step, wait)
        return self.seq(summary, state.idx) if state.idx < summary.num_items else None
