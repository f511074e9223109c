"""How the general route writes a stage (:mod:`collectives.stage_way`): both ways timed in
turn, in windows, the faster kept between them; on a clock the test drives."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from collectives import ops, stage_way
from collectives.stage_way import (
    ADAPT_MIN,
    EXPLORE_CALLS,
    EXPLORE_EVERY,
    RETRY_AFTER,
    SETTLE_CALLS,
    StageWays,
)

pytestmark = pytest.mark.skipif(
    not ops.stream_copy_available(), reason="the C extension is not built"
)
SIZE = 1 << 20


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The module's clock: a list whose one item is now, in ns."""
    now = [0]
    monkeypatch.setattr(time, "perf_counter_ns", lambda: now[0])  # (the module reads it so)
    return now


def run(ways: StageWays, now: list[int], cost: Callable[[bool], int], nbytes: int = SIZE) -> bool:
    """One staged call that takes ``cost(way)`` ns from its stage to its DONE: its way."""
    way = ways.way(nbytes)
    now[0] += cost(way)
    ways.done()
    return way


def test_both_ways_in_turn_then_the_faster(clock: list[int]) -> None:
    ways = StageWays()
    half = EXPLORE_CALLS // 2
    seen = [run(ways, clock, lambda w: 600 if w else 1000) for _ in range(EXPLORE_CALLS)]
    assert seen == [False] * half + [True] * half
    timed = half - SETTLE_CALLS
    assert ways.staging(SIZE) == (False, timed, timed)
    assert run(ways, clock, lambda w: 600 if w else 1000)  # 600 < 0.85 * 1000: streaming
    assert ways.staging(SIZE) == (True, 0, 0)
    for _ in range(EXPLORE_EVERY - EXPLORE_CALLS - 1):
        assert run(ways, clock, lambda w: 1)
    # the next window: both ways again, then memcpy (streaming now only a little faster)
    seen = [run(ways, clock, lambda w: 900 if w else 1000) for _ in range(EXPLORE_CALLS)]
    assert seen == [False] * half + [True] * half
    assert not run(ways, clock, lambda w: 900 if w else 1000)


def test_the_first_calls_of_each_way_are_not_timed(clock: list[int]) -> None:
    """A slow first call after a change of way (its lines still elsewhere) is left out."""
    ways = StageWays()
    calls = iter(range(EXPLORE_CALLS))

    def cost(w: bool) -> int:  # each way's first SETTLE_CALLS calls very slow
        k = next(calls) % (EXPLORE_CALLS // 2)
        return 10**6 if k < SETTLE_CALLS else (600 if w else 1000)

    for _ in range(EXPLORE_CALLS):
        run(ways, clock, cost)
    assert run(ways, clock, lambda w: 1)  # streaming, from the settled times alone


def test_a_first_window_without_times_is_tried_again_soon(clock: list[int]) -> None:
    ways = StageWays()
    for _ in range(EXPLORE_CALLS):
        ways.way(SIZE)  # every call raised before its DONE: nothing timed
    assert not ways.way(SIZE)  # the window's end: memcpy, and another window soon
    for _ in range(RETRY_AFTER):
        assert not run(ways, clock, lambda w: 1)
    seen = [run(ways, clock, lambda w: 500 if w else 1000) for _ in range(EXPLORE_CALLS)]
    assert seen == [False] * (EXPLORE_CALLS // 2) + [True] * (EXPLORE_CALLS // 2)
    assert run(ways, clock, lambda w: 1)


def test_small_large_and_untimed_stages_are_not_explored(
    clock: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    ways = StageWays()
    for _ in range(EXPLORE_CALLS):
        assert not run(ways, clock, lambda w: 1, ADAPT_MIN - 1)  # small: memcpy
        assert run(ways, clock, lambda w: 1, ops.STREAM_MIN)  # large: streaming
        assert not ways.way(SIZE, timed=False)  # a broadcast's root: memcpy, no timing
        assert ways.timing is None
    assert ways.sizes == {}
    monkeypatch.setattr(ops, "_c_stream_copy", None)  # no C extension: memcpy everywhere
    assert not ways.way(ops.STREAM_MIN) and not ways.way(SIZE)


def test_sizes_are_chosen_apart_and_forgotten_beyond_the_limit(clock: list[int]) -> None:
    ways = StageWays()
    for _ in range(EXPLORE_CALLS + 1):
        run(ways, clock, lambda w: 500 if w else 1000, SIZE)
        run(ways, clock, lambda w: 1000 if w else 500, 2 * SIZE)
    assert ways.staging(SIZE)[0] and not ways.staging(2 * SIZE)[0]
    for k in range(stage_way.MAX_SIZES):
        ways.way(ADAPT_MIN + k)
    assert len(ways.sizes) <= stage_way.MAX_SIZES


def test_a_keyed_write_is_timed_at_every_size(clock: list[int]) -> None:
    """A kind of write chosen apart (an in-place all-reduce's shards) is explored from
    ADAPT_MIN at every size, 16 MiB and more too (streaming never taken for granted), apart
    from a stage of the same size."""
    ways = StageWays()
    big = ops.STREAM_MIN
    seen = []
    for _ in range(EXPLORE_CALLS):
        seen.append(ways.way(big, key="shards"))
        clock[0] += 1000 if seen[-1] else 500  # streaming slower here
        ways.done()
    assert seen == [False] * (EXPLORE_CALLS // 2) + [True] * (EXPLORE_CALLS // 2)
    timed = EXPLORE_CALLS // 2 - SETTLE_CALLS
    assert ways.staging(big, "shards") == (False, timed, timed)
    assert ways.way(big)  # a stage that large: streamed, and not from the keyed table
    assert list(ways.sizes) == [("shards", big)]
    assert not ways.way(big, key="shards")  # the window's end: memcpy, the faster
    assert not ways.way(ADAPT_MIN - 1, key="shards")
