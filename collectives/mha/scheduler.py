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
    "MHATileScheduler",
    "MHATileState",
    "MHATileSummary",
    "MaskSpec",
    "QueuedTileScheduler",
    "SeqInfo",
    "TileScheduler",
    "TransientScheduler",
    "WorkInfo",
]


class MHASchedule(enum.Enum):
    DEFAULT = "default"
    PROMPT_ROTATE = "prompt_rotate"
    LPT = "lpt"


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
        self, summary: MHATileSummary, state: MHATileState, pipeline_idx: int = 0
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
        self, summary: MHATileSummary, state: MHATileState, pipeline_idx: int = 0
    ) -> SeqInfo | None:
        state.idx = summary.num_items
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
        self, summary: MHATileSummary, state: MHATileState, pipeline_idx: int = 0
    ) -> SeqInfo | None:
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
    ) -> None:
        super().__init__(schedule)
        if num_workers < 1:
            raise ValueError(
                f"QueuedTileScheduler: invalid num_workers (got {num_workers}; expected >= 1)"
            )
        self.num_workers = num_workers
        self.counter = counter or AtomicCounter(num_workers)

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
        self, summary: MHATileSummary, state: MHATileState, pipeline_idx: int = 0
    ) -> SeqInfo | None:
        state.idx = self._take(summary, self.counter.fetch_add(1))
        return self.seq(summary, state.idx) if state.idx < summary.num_items else None
