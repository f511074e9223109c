"""How the general route writes a numpy input into its stage: with memcpy or with streaming
(non-temporal) stores, chosen per size of stage by timing both now and then, as the C replay
chooses for a cached plan (``collectives/_replay.c``, ``stage_way``). The bytes are the same
either way; only who pulls which cache lines across differs. Cores that share a cache read a
stage just written through it fastest; where every line the peers read must cross from this
core's cache (this VM in its slow mode), a stage written to memory is read several times
faster (docs/benchmarks.md, "tenth pass" and "eleventh pass").

Each size's staged calls are timed, from the stage's first byte to this rank's ``DONE``, in
half of the first :data:`EXPLORE_CALLS` of every :data:`EXPLORE_EVERY` each way (the first
:data:`SETTLE_CALLS` of each way not timed); in between, streaming is kept where its median
is below :data:`STREAM_MARGIN` of memcpy's. A first window left without times (the call
raised) is followed by another :data:`RETRY_AFTER` calls later. Stages of less than
:data:`ADAPT_MIN` bytes are always copied; from :data:`collectives.ops.STREAM_MIN` always
streamed; a broadcast's root (whose readers' copies a time to its own ``DONE`` would not
see) copies below that too. An in-place all-reduce's results (``key="shards"``: my reduced
shard of x and the shards I copy into it, which my peers read next) are chosen the same
way, apart, at every size from :data:`ADAPT_MIN` (``collectives.shards``). Each rank
chooses for itself: nothing here is agreed.
"""

from __future__ import annotations

import statistics
import time

from . import ops

__all__ = [
    "ADAPT_MIN",
    "EXPLORE_CALLS",
    "EXPLORE_EVERY",
    "RETRY_AFTER",
    "SETTLE_CALLS",
    "STREAM_MARGIN",
    "StageWays",
]

ADAPT_MIN = 64 << 10
EXPLORE_CALLS = 16
EXPLORE_EVERY = 1024
SETTLE_CALLS = 2
STREAM_MARGIN = 0.85
RETRY_AFTER = 64
MAX_SIZES = 64  # the sizes remembered (beyond, forgotten all at once)


class _Size:
    """One size of stage: its staged calls so far, the way chosen, this window's times."""

    __slots__ = ("ns", "runs", "streamed")

    def __init__(self) -> None:
        self.runs = 0
        self.streamed = False
        self.ns: tuple[list[int], list[int]] = ([], [])


class StageWays:
    """A channel's choice of how to write each size of stage (the module's rules)."""

    def __init__(self) -> None:
        self.sizes: dict[tuple[str, int], _Size] = {}  # by (key, nbytes)
        # the timed call in progress: (its size, its way, its start in ns), or None
        self.timing: tuple[_Size, int, int] | None = None

    def way(self, nbytes: int, timed: bool = True, key: str = "") -> bool:
        """Whether a stage of ``nbytes`` is written with streaming stores in this call (and,
        in an exploring window, start timing it). ``timed``: False for a stage whose readers'
        copies this rank's ``DONE`` does not wait for (a broadcast's root). ``key``: another
        kind of write chosen apart (``"shards"``: an in-place all-reduce's results), timed
        both ways at every size from :data:`ADAPT_MIN` (streaming never taken for granted)."""
        self.timing = None
        if not key and nbytes >= ops.STREAM_MIN:  # (read each call: a test may move it)
            return ops.stream_copy_available()
        if nbytes < ADAPT_MIN or not timed or not ops.stream_copy_available():
            return False
        at = (key, nbytes)
        size = self.sizes.get(at)
        if size is None:
            if len(self.sizes) >= MAX_SIZES:
                self.sizes.clear()
            size = self.sizes[at] = _Size()
        k = size.runs % EXPLORE_EVERY
        size.runs += 1
        half = EXPLORE_CALLS // 2
        if k < EXPLORE_CALLS:  # half the window each way, the first calls of each untimed
            way = k >= half
            if k % half >= SETTLE_CALLS:
                self.timing = (size, int(way), time.perf_counter_ns())
            return way
        copied, streamed = size.ns
        if copied and streamed:  # a window ended: streaming where clearly faster
            size.streamed = statistics.median_low(streamed) < STREAM_MARGIN * statistics.median_low(
                copied
            )
        elif k == EXPLORE_CALLS and size.runs <= EXPLORE_EVERY:
            size.runs = EXPLORE_EVERY - RETRY_AFTER  # the first window timed too little
        size.ns = ([], [])
        return size.streamed

    def done(self) -> None:
        """This rank's ``DONE`` of the call that staged: a timed call's time is kept."""
        timing = self.timing
        if timing is not None:
            self.timing = None
            size, way, start = timing
            if len(size.ns[way]) < EXPLORE_CALLS // 2:
                size.ns[way].append(time.perf_counter_ns() - start)

    def staging(self, nbytes: int, key: str = "") -> tuple[bool, int, int]:
        """(streamed, calls, streamed_calls) for stages of ``nbytes`` (of ``key``): the way
        chosen now and the calls timed each way since the last choice (the C replay's
        ``staging()``)."""
        size = self.sizes.get((key, nbytes))
        if size is None:
            streamed = not key and nbytes >= ops.STREAM_MIN and ops.stream_copy_available()
            return (streamed, 0, 0)
        return (size.streamed, len(size.ns[0]), len(size.ns[1]))
