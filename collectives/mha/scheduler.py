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
    slot per pipeline stage, holding ``(step, item)``, and how many consumers read it.

    Parameters
    ----------
    stages : int
        Pipeline stages, one slot each.
    consumers : int
        Consumers that read each published item.
    timeout_s : float, default 60.0
        Seconds a publish or a read waits for the other side before raising.
    """

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
        """The producer's side: put ``item`` of advance ``step`` in ``stage``'s slot and wake
        the consumers.

        Parameters
        ----------
        stage : int
            The pipeline stage.
        step : int
            The producer's advance count; consumers read the item of the same step.
        item : int
            The linear work index claimed.
        wait_free : bool
            Wait until every consumer has read the slot's previous item first (``ALL``).

        Raises
        ------
        TimeoutError
            When ``wait_free`` and the consumers do not read within ``timeout_s``.
        """
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
        """A consumer's side: the item the producer published in ``stage`` for ``step``.

        Parameters
        ----------
        stage : int
            The pipeline stage.
        step : int
            The consumer's advance count, matching the producer's.
        wait : bool
            Wait for the producer's publish (``PRODUCER``, ``ALL``); else it must be there.

        Returns
        -------
        int
            The linear work index the producer claimed.

        Raises
        ------
        RuntimeError
            When not ``wait`` and the item is not published yet.
        TimeoutError
            When ``wait`` and the producer does not publish within ``timeout_s``.
        """
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
    of ``left`` keys before and ``right`` keys after the row (None: unbounded).

    Parameters
    ----------
    causal : bool, default False
        Rows see keys at or before their own position only.
    left : int, optional
        Keys a row sees before its own position (None: unbounded).
    right : int, optional
        Keys a row sees after its own position (None: unbounded).
    """

    causal: bool = False
    left: int | None = None
    right: int | None = None

    def kv_range(self, q0: int, q1: int, seq_len: int) -> tuple[int, int]:
        """Keys ``[kv_start, kv_end)`` that rows ``[q0, q1)`` may see (a superset per row).

        Parameters
        ----------
        q0 : int
            The first query row (within the sequence).
        q1 : int
            One past the last query row.
        seq_len : int
            The sequence's length (keys beyond it do not exist).

        Returns
        -------
        tuple of (int, int)
            ``(kv_start, kv_end)``, with ``kv_end >= kv_start`` (equal: no keys).
        """
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
    increasing ints, ragged) or None (every sequence ``max_seq_len`` long, padded).

    Parameters
    ----------
    batch_size : int
        Sequences in the batch.
    max_num_prompt_tiles : int
        Query tiles of ``block_m`` rows in the longest sequence.
    valid_length : tuple of int or None
        Row offsets of a ragged batch (``batch_size + 1`` non-decreasing ints from 0), or
        None for a padded one.
    max_seq_len : int
        The longest sequence's length (every sequence's, padded).
    num_heads : int, default 1
        Attention heads.
    block_m : int, default 64
        Query rows per tile.
    block_n : int, default 64
        Key rows per KV tile.
    mask : MaskSpec, default MaskSpec()
        Which keys each query row sees.
    """

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
        """From a padded ``(batch_size, seq_len)`` shape or ragged ``row_offsets``.

        Parameters
        ----------
        num_heads : int
            Attention heads (>= 1).
        block_m : int
            Query rows per tile (>= 1).
        block_n : int, default 64
            Key rows per KV tile (>= 1).
        seq_len : int, optional
            Every sequence's length (padded; with ``batch_size``).
        batch_size : int, optional
            Sequences in the batch (padded; with ``seq_len``).
        row_offsets : sequence of int, optional
            Ragged: 0, then each sequence's end row (non-decreasing); overrides ``seq_len``
            and ``batch_size``.
        mask : MaskSpec, optional
            Which keys each query row sees (default: all).

        Returns
        -------
        MHATileSummary
            The summary, with ``max_num_prompt_tiles`` computed from the longest sequence.

        Raises
        ------
        ValueError
            When ``row_offsets`` has fewer than 2 entries, does not start at 0 or decreases;
            when neither ``row_offsets`` nor both ``seq_len`` and ``batch_size`` are given;
            or when ``block_m``, ``block_n`` or ``num_heads`` is below 1.
        """
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
        """The length of sequence ``batch``.

        Parameters
        ----------
        batch : int
            The sequence's index in the batch.

        Returns
        -------
        int
            Its rows (``max_seq_len`` when padded).
        """
        if self.valid_length is None:
            return self.max_seq_len
        return self.valid_length[batch + 1] - self.valid_length[batch]

    def start_of_seq(self, batch: int) -> int:
        """The first row of sequence ``batch`` in the flattened rows.

        Parameters
        ----------
        batch : int
            The sequence's index in the batch.

        Returns
        -------
        int
            Its row offset (``batch * max_seq_len`` when padded).
        """
        if self.valid_length is None:
            return batch * self.max_seq_len
        return self.valid_length[batch]

    @property
    def num_items(self) -> int:
        """Work items counted with padding (every sequence as long as the longest)."""
        return self.batch_size * self.num_heads * self.max_num_prompt_tiles

    def cost(self, batch: int, tile: int) -> int:
        """KV tiles a query tile reads under the mask (0 for a tile past the sequence).

        Parameters
        ----------
        batch : int
            The sequence's index in the batch.
        tile : int
            The query tile's index within the sequence.

        Returns
        -------
        int
            KV tiles of ``block_n`` keys the tile reads.
        """
        n = self.seq_len(batch)
        q0 = tile * self.block_m
        if q0 >= n:
            return 0
        start, end = self.mask.kv_range(q0, min(q0 + self.block_m, n), n)
        return -(-(end - start) // self.block_n) if end > start else 0


@dataclass(frozen=True)
class WorkInfo:
    """A work item: rows ``[prompt_offset, prompt_offset + block_m)`` of head ``head_idx`` of
    sequence ``prompt_idx``, reading keys ``[kv_start, kv_end)``.

    Parameters
    ----------
    prompt_offset : int
        The tile's first query row within its sequence.
    head_idx : int
        The head.
    prompt_idx : int
        The sequence's index in the batch.
    is_valid : bool
        Whether there is an item (False: past the work's end, or past a ragged sequence's
        end).
    kv_start : int, default 0
        The first key the tile reads.
    kv_end : int, default 0
        One past the last key the tile reads.
    """

    prompt_offset: int
    head_idx: int
    prompt_idx: int
    is_valid: bool
    kv_start: int = 0
    kv_end: int = 0


@dataclass(frozen=True)
class SeqInfo:
    """Where the item's sequence lives: its length and first row, and the item itself.

    Parameters
    ----------
    seq_len : int
        The sequence's length.
    start_of_seq : int
        The sequence's first row in the flattened rows.
    prompt_offset : int
        The item's first query row within the sequence.
    head_idx : int
        The item's head.
    prompt_idx : int
        The sequence's index in the batch.
    """

    seq_len: int
    start_of_seq: int
    prompt_offset: int
    head_idx: int
    prompt_idx: int

    def is_valid(self) -> bool:
        """Whether the item's rows start inside its sequence.

        Returns
        -------
        bool
            True when ``prompt_offset < seq_len``.
        """
        return self.prompt_offset < self.seq_len


@dataclass
class MHATileState:
    """One worker's position: the linear work index it holds (``idx >= total`` when done).

    Parameters
    ----------
    worker : int
        The worker's index in the grid.
    idx : int
        The linear work index it holds.
    step : int, default 0
        Advances made (pairs a producer's publish with its consumers' reads).
    """

    worker: int
    idx: int
    step: int = 0  # advances made (pairs a producer's publish with its consumers' reads)


class AtomicCounter:
    """A fetch-and-add counter shared by the workers of a queued scheduler.

    Parameters
    ----------
    start : int, default 0
        The counter's first value.
    """

    def __init__(self, start: int = 0) -> None:
        self._value = start
        self._lock = threading.Lock()

    def fetch_add(self, n: int = 1) -> int:
        """Add ``n`` atomically.

        Parameters
        ----------
        n : int, default 1
            The increment.

        Returns
        -------
        int
            The value before the addition.
        """
        with self._lock:
            old = self._value
            self._value += n
            return old

    def reset(self, value: int) -> None:
        """Set the counter to ``value`` (before the workers start).

        Parameters
        ----------
        value : int
            The new value.
        """
        with self._lock:
            self._value = value


class MHATileScheduler(Protocol):
    """The protocol every scheduler follows (see the module docstring)."""

    may_advance: ClassVar[bool]
    mha_schedule: MHASchedule

    def grid_dim(self, batch_size: int, max_num_prompt_tiles: int) -> tuple[int, int, int]:
        """The launch grid for the work.

        Parameters
        ----------
        batch_size : int
            Sequences in the batch.
        max_num_prompt_tiles : int
            Query tiles of the longest sequence.

        Returns
        -------
        tuple of (int, int, int)
            The launch grid ``(x, y, z)``: one block (worker) per entry.
        """
        ...

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        """Worker ``worker``'s position at its first item.

        Parameters
        ----------
        worker : int
            The worker's index in the grid.
        summary : MHATileSummary
            The shape of the work.

        Returns
        -------
        MHATileState
            The worker's position at its first item (``idx >= summary.num_items``: no work).
        """
        ...

    def get_current_work_info(self, summary: MHATileSummary, state: MHATileState) -> WorkInfo:
        """The item ``state`` holds: what to compute now.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position.

        Returns
        -------
        WorkInfo
            The item (``is_valid`` False when there is none).
        """
        ...

    def advance(
        self,
        summary: MHATileSummary,
        state: MHATileState,
        pipeline_idx: int = 0,
        *,
        producer: bool = True,
        sync: MHASchedulerSynchronization = MHASchedulerSynchronization.NONE,
    ) -> SeqInfo | None:
        """Move ``state`` to the worker's next item.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position; ``idx`` and ``step`` are updated in place.
        pipeline_idx : int, default 0
            The pipeline stage the item goes through (queued schedulers with consumers).
        producer : bool, default True
            Whether this thread claims the item (the producer) or reads it from the
            producer's slot (a consumer).
        sync : MHASchedulerSynchronization, default NONE
            How a consumer waits for its producer (and the producer for its consumers).

        Returns
        -------
        SeqInfo or None
            The next item's sequence info, or None when the worker has no work left.
        """
        ...

    def unsafe_seq_info(self, summary: MHATileSummary, state: MHATileState) -> SeqInfo:
        """The sequence info of the item ``state`` holds, without checking that it exists.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position.

        Returns
        -------
        SeqInfo
            The item's sequence info (past the end: the last item's).
        """
        ...


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
        """(batch, head, tile) of linear index ``idx``.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        idx : int
            A linear work index, ``0 <= idx < summary.num_items``.

        Returns
        -------
        tuple of (int, int, int)
            ``(batch, head, tile)`` in this scheduler's order.
        """
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
        """Whether linear index ``idx`` is an item to compute.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        idx : int
            A linear work index.

        Returns
        -------
        bool
            False past the work's end or when the tile starts past its sequence's end.
        """
        if idx >= summary.num_items:
            return False
        batch, _, tile = self.item(summary, idx)
        return tile * summary.block_m < summary.seq_len(batch)

    def info(self, summary: MHATileSummary, idx: int) -> WorkInfo:
        """The work item at linear index ``idx``, with the keys it reads.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        idx : int
            A linear work index.

        Returns
        -------
        WorkInfo
            The item (``is_valid`` False past the work's or its sequence's end).
        """
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
        """The sequence info of linear index ``idx`` (clamped to the last item).

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        idx : int
            A linear work index.

        Returns
        -------
        SeqInfo
            The item's sequence length and first row, and the item itself.
        """
        batch, head, tile = self.item(summary, min(idx, summary.num_items - 1))
        return SeqInfo(
            summary.seq_len(batch), summary.start_of_seq(batch), tile * summary.block_m, head, batch
        )

    def get_current_work_info(self, summary: MHATileSummary, state: MHATileState) -> WorkInfo:
        """The item ``state`` holds: what to compute now.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position.

        Returns
        -------
        WorkInfo
            The item (``is_valid`` False when there is none).
        """
        return self.info(summary, state.idx)

    def unsafe_seq_info(self, summary: MHATileSummary, state: MHATileState) -> SeqInfo:
        """The item's sequence info without checking that the item exists.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position.

        Returns
        -------
        SeqInfo
            The item's sequence info (past the end: the last item's).
        """
        return self.seq(summary, state.idx)


class TransientScheduler(_Ordered):
    """One work item per worker (a CUDA grid of ``tiles x heads x batch`` blocks); with
    ``flip`` the tile order is reversed so the heaviest causal tile starts first.

    Parameters
    ----------
    num_heads : int, default 1
        Attention heads (the grid's ``y``).
    schedule : MHASchedule or str, default MHASchedule.DEFAULT
        The order of the work items.
    flip : bool, default False
        Reverse each head's tile order (not with ``LPT``).
    """

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
        """One block per work item: ``(tiles, heads, batch)``.

        Parameters
        ----------
        batch_size : int
            Sequences in the batch.
        max_num_prompt_tiles : int
            Query tiles of the longest sequence.

        Returns
        -------
        tuple of (int, int, int)
            The launch grid ``(x, y, z)``: one block (worker) per entry.
        """
        return (max_num_prompt_tiles, self.num_heads, batch_size)

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        """Worker ``worker``'s single item (its tile reversed with ``flip``).

        Parameters
        ----------
        worker : int
            The worker's index in the grid.
        summary : MHATileSummary
            The shape of the work.

        Returns
        -------
        MHATileState
            The worker's position at its first item (``idx >= summary.num_items``: no work).
        """
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
        """Finish: a transient worker has one item, so ``state`` moves past the end.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position; ``idx`` and ``step`` are updated in place.
        pipeline_idx : int, default 0
            The pipeline stage the item goes through (queued schedulers with consumers).
        producer : bool, default True
            Whether this thread claims the item (the producer) or reads it from the
            producer's slot (a consumer).
        sync : MHASchedulerSynchronization, default NONE
            How a consumer waits for its producer (and the producer for its consumers).

        Returns
        -------
        None
            Always: no next item.
        """
        state.idx = summary.num_items
        state.step += 1
        return None


class TileScheduler(_Ordered):
    """Static persistent: ``num_workers`` workers, worker ``w`` takes items ``w``, ``w + W``,
    ``w + 2W`` ... (items past a ragged sequence's end are skipped).

    Parameters
    ----------
    num_workers : int
        Persistent workers (>= 1).
    schedule : MHASchedule or str, default MHASchedule.DEFAULT
        The order of the work items.

    Raises
    ------
    ValueError
        When ``num_workers`` is below 1.
    """

    may_advance: ClassVar[bool] = True

    def __init__(self, num_workers: int, schedule: MHASchedule | str = MHASchedule.DEFAULT) -> None:
        super().__init__(schedule)
        if num_workers < 1:
            raise ValueError(
                f"TileScheduler: invalid num_workers (got {num_workers}; expected >= 1)"
            )
        self.num_workers = num_workers

    def grid_dim(self, batch_size: int, max_num_prompt_tiles: int) -> tuple[int, int, int]:
        """One block per persistent worker: ``(num_workers, 1, 1)``.

        Parameters
        ----------
        batch_size : int
            Sequences in the batch.
        max_num_prompt_tiles : int
            Query tiles of the longest sequence.

        Returns
        -------
        tuple of (int, int, int)
            The launch grid ``(x, y, z)``: one block (worker) per entry.
        """
        return (self.num_workers, 1, 1)

    def _skip(self, summary: MHATileSummary, idx: int, step: Callable[[int], int]) -> int:
        while idx < summary.num_items and not self.valid(summary, idx):
            idx = step(idx)
        return idx

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        """Worker ``worker``'s first valid item among ``worker``, ``worker + W``, ...

        Parameters
        ----------
        worker : int
            The worker's index in the grid.
        summary : MHATileSummary
            The shape of the work.

        Returns
        -------
        MHATileState
            The worker's position at its first item (``idx >= summary.num_items``: no work).
        """
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
        """Move ``state`` ``num_workers`` items on (skipping items past a sequence's end).

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position; ``idx`` and ``step`` are updated in place.
        pipeline_idx : int, default 0
            The pipeline stage the item goes through (queued schedulers with consumers).
        producer : bool, default True
            Whether this thread claims the item (the producer) or reads it from the
            producer's slot (a consumer).
        sync : MHASchedulerSynchronization, default NONE
            How a consumer waits for its producer (and the producer for its consumers).

        Returns
        -------
        SeqInfo or None
            The next item's sequence info, or None when the worker has no work left.
        """
        state.step += 1
        state.idx = self._skip(
            summary, state.idx + self.num_workers, lambda i: i + self.num_workers
        )
        return self.seq(summary, state.idx) if state.idx < summary.num_items else None


class QueuedTileScheduler(_Ordered):
    """Dynamic: a shared counter preset to ``num_workers``; worker ``w`` starts on item ``w``
    and each ``advance`` takes the next unclaimed item by fetch-and-add, skipping items past a
    ragged sequence's end. ``counter`` may be any object with ``fetch_add`` (the distributed
    scheduler passes one that lives in symmetric memory).

    Parameters
    ----------
    num_workers : int
        Persistent workers (>= 1).
    schedule : MHASchedule or str, default MHASchedule.DEFAULT
        The order of the work items.
    counter : AtomicCounter, optional
        The shared counter (default: a new one); any object with ``fetch_add`` and
        ``reset``.
    consumers : int, default 0
        Consumers per worker that read the producer's claimed items (0: no pipeline).
    pipeline_stages : int, default 1
        Pipeline stages per worker (>= 1).

    Raises
    ------
    ValueError
        When ``num_workers`` or ``pipeline_stages`` is below 1, or ``consumers`` is
        negative.
    """

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
        """One block per persistent worker: ``(num_workers, 1, 1)``.

        Parameters
        ----------
        batch_size : int
            Sequences in the batch.
        max_num_prompt_tiles : int
            Query tiles of the longest sequence.

        Returns
        -------
        tuple of (int, int, int)
            The launch grid ``(x, y, z)``: one block (worker) per entry.
        """
        return (self.num_workers, 1, 1)

    def reset(self) -> None:
        """Preset the counter for a new launch (before the workers start)."""
        self.counter.reset(self.num_workers)

    def _take(self, summary: MHATileSummary, idx: int) -> int:
        while idx < summary.num_items and not self.valid(summary, idx):
            idx = self.counter.fetch_add(1)
        return idx

    def initial_state(self, worker: int, summary: MHATileSummary) -> MHATileState:
        """Worker ``worker`` starts on item ``worker`` (or the next unclaimed valid one).

        Parameters
        ----------
        worker : int
            The worker's index in the grid.
        summary : MHATileSummary
            The shape of the work.

        Returns
        -------
        MHATileState
            The worker's position at its first item (``idx >= summary.num_items``: no work).
        """
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
        reads it from there instead of claiming, synchronised as ``sync`` says.

        Parameters
        ----------
        summary : MHATileSummary
            The shape of the work.
        state : MHATileState
            The worker's position; ``idx`` and ``step`` are updated in place.
        pipeline_idx : int, default 0
            The pipeline stage the item goes through (queued schedulers with consumers).
        producer : bool, default True
            Whether this thread claims the item (the producer) or reads it from the
            producer's slot (a consumer).
        sync : MHASchedulerSynchronization, default NONE
            How a consumer waits for its producer (and the producer for its consumers).

        Returns
        -------
        SeqInfo or None
            The next item's sequence info, or None when the worker has no work left.

        Raises
        ------
        ValueError
            When ``pipeline_idx`` is outside ``[0, pipeline_stages)``, or a consumer
            advances on a scheduler made without consumers.
        RuntimeError
            With ``sync=NONE``, when a consumer reads a stage not yet published.
        TimeoutError
            When a producer or consumer waits longer than its slots' ``timeout_s``.
        """
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
