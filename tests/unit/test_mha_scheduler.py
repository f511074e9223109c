"""Tile schedulers: the Modular MAX worked example, and every tile exactly once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives.mha import (
    MaskSpec,
    MHASchedule,
    MHATileSummary,
    QueuedTileScheduler,
    TileScheduler,
    TransientScheduler,
)


def run_worker(sched: Any, summary: MHATileSummary, worker: int) -> list[tuple[int, int, int]]:
    state = sched.initial_state(worker, summary)
    got = []
    while True:
        info = sched.get_current_work_info(summary, state)
        if info.is_valid:
            got.append((info.prompt_offset, info.head_idx, info.prompt_idx))
        if not sched.may_advance or sched.advance(summary, state, 0) is None:
            return got


def modular_summary() -> MHATileSummary:
    return MHATileSummary.create(num_heads=3, block_m=32, seq_len=100, batch_size=1)


def test_modular_worked_example_default() -> None:
    summary = modular_summary()
    assert summary.max_num_prompt_tiles == 4 and summary.num_items == 12
    sched = TileScheduler(8, MHASchedule.DEFAULT)
    per_worker = {w: [(o, h) for o, h, _ in run_worker(sched, summary, w)] for w in range(8)}
    assert per_worker[0] == [(0, 0), (0, 2)]
    assert per_worker[1] == [(32, 0), (32, 2)]
    assert per_worker[2] == [(64, 0), (64, 2)]
    assert per_worker[3] == [(96, 0), (96, 2)]
    assert per_worker[4] == [(0, 1)]
    assert per_worker[7] == [(96, 1)]


def test_modular_worked_example_prompt_rotate() -> None:
    summary = modular_summary()
    sched = TileScheduler(8, MHASchedule.PROMPT_ROTATE)
    first = {w: run_worker(sched, summary, w)[0][:2] for w in range(8)}
    assert first[4] == (96, 1) and first[5] == (64, 1)
    assert first[6] == (32, 1) and first[7] == (0, 1)
    assert first[0] == (0, 0)


def test_lpt_takes_the_longest_causal_tiles_first() -> None:
    summary = MHATileSummary.create(
        num_heads=2, block_m=32, block_n=32, seq_len=128, batch_size=1, mask=MaskSpec(causal=True)
    )
    sched = TileScheduler(1, MHASchedule.LPT)
    order = run_worker(sched, summary, 0)
    costs = [summary.cost(b, o // 32) for o, _, b in order]
    assert costs == sorted(costs, reverse=True)
    assert order[0][0] == 96  # the last query tile sees every key


def test_transient_and_flip() -> None:
    summary = modular_summary()
    sched = TransientScheduler(num_heads=3)
    assert sched.grid_dim(1, 4) == (4, 3, 1) and not sched.may_advance
    assert run_worker(sched, summary, 0) == [(0, 0, 0)]
    flipped = TransientScheduler(num_heads=3, flip=True)
    assert run_worker(flipped, summary, 0) == [(96, 0, 0)]  # the heaviest causal tile first


def test_kv_ranges_follow_the_mask() -> None:
    m = MaskSpec(causal=True, left=10)
    assert m.kv_range(32, 64, 100) == (22, 64)
    assert MaskSpec().kv_range(32, 64, 100) == (0, 100)
    assert MaskSpec(left=5, right=3).kv_range(32, 64, 100) == (27, 67)
    summary = MHATileSummary.create(
        num_heads=1, block_m=32, block_n=16, seq_len=100, batch_size=1, mask=m
    )
    info = TileScheduler(1).get_current_work_info(
        summary, TileScheduler(1).initial_state(0, summary)
    )
    assert (info.kv_start, info.kv_end) == (0, 32)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=5),
    ragged=st.booleans(),
    heads=st.integers(1, 4),
    block_m=st.sampled_from([1, 7, 32, 64]),
    workers=st.integers(1, 9),
    schedule=st.sampled_from(list(MHASchedule)),
    kind=st.sampled_from(["static", "queued", "transient"]),
    causal=st.booleans(),
)
def test_every_tile_exactly_once(
    lengths: list[int],
    ragged: bool,
    heads: int,
    block_m: int,
    workers: int,
    schedule: MHASchedule,
    kind: str,
    causal: bool,
) -> None:
    mask = MaskSpec(causal=causal)
    if ragged:
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        if offsets[-1] == 0:
            offsets[-1] = 1
        summary = MHATileSummary.create(
            num_heads=heads, block_m=block_m, row_offsets=offsets, mask=mask
        )
    else:
        summary = MHATileSummary.create(
            num_heads=heads,
            block_m=block_m,
            seq_len=max(lengths[0], 1),
            batch_size=len(lengths),
            mask=mask,
        )
    expected = {
        (t * block_m, h, b)
        for b in range(summary.batch_size)
        for h in range(heads)
        for t in range(-(-summary.seq_len(b) // block_m))
    }
    if kind == "transient":
        sched: Any = TransientScheduler(heads, schedule)
        got = [it for w in range(summary.num_items) for it in run_worker(sched, summary, w)]
    elif kind == "static":
        sched = TileScheduler(workers, schedule)
        got = [it for w in range(workers) for it in run_worker(sched, summary, w)]
    else:
        sched = QueuedTileScheduler(workers, schedule)
        results: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
        threads = [
            threading.Thread(target=lambda w=w: results[w].extend(run_worker(sched, summary, w)))
            for w in range(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [it for r in results for it in r]
    assert len(got) == len(set(got)), "no tile twice"
    assert set(got) == expected, "every tile once"


def test_summary_errors() -> None:
    with pytest.raises(ValueError, match="invalid row offsets"):
        MHATileSummary.create(num_heads=1, block_m=8, row_offsets=[1, 5])
    with pytest.raises(ValueError, match="invalid sizes"):
        MHATileSummary.create(num_heads=0, block_m=8, seq_len=4, batch_size=1)
    with pytest.raises(ValueError, match="invalid num_workers"):
        TileScheduler(0)
