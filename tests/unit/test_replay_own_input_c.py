"""The C replay (``collectives._replay``) reads a rank's own input from its x, not from the
stage its peers are reading meanwhile, except where out overlaps x: then from the stage,
which holds x as it was when the call began. On flag words and buffers laid out in this
process as three ranks would publish them; the replaying rank is rank-order index ``me``."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from collectives import replay
from collectives.channel import Flag

if replay.replay_status() != "C":
    pytest.skip(replay.replay_status(), allow_module_level=True)
Replay: Any = importlib.import_module("collectives._replay").Replay

READY, DONE, SRC = int(Flag.READY), int(Flag.DONE), int(Flag.SRC)
WORDS = [111, 222, 333]  # each rank's SRC word for this plan
N = 1001  # int32 elements of one input
I32, U8 = 4, 6  # the C replay's codes (collectives.replay._C_TYPES)


def rank_sum(xs: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The rank-order sum in int64 (no wrap-around to mind)."""
    total: np.ndarray[Any, Any] = np.stack([a.astype(np.int64) for a in xs]).sum(axis=0)
    return total


def replay_at(me: int, mode: int) -> tuple[Any, list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    """(replay, every rank's input in rank order (my stage at me), my stage): every peer
    READY for call 1 and done with call 0; ``mode`` 0 an int32 sum, 1 a broadcast from me,
    2 an all-gather (these two in bytes)."""
    flags = [np.zeros(16, np.int64) for _ in range(3)]
    stage = np.zeros(N, np.int32)
    ctype, count = (I32, N) if mode == 0 else (U8, 4 * N)
    rep = Replay(
        flags[me], tuple(f for r, f in enumerate(flags) if r != me), tuple(flags),
        stage, WORDS[me], READY, DONE, SRC, ctype, 0, count, 2000, mode, me,
    )  # fmt: skip
    rng = np.random.default_rng(me)
    inputs = [rng.integers(-1000, 1000, N, dtype=np.int32) for _ in range(3)]
    inputs[me] = stage
    rep.set_inputs(WORDS, inputs if mode == 0 else [a.view(np.uint8) for a in inputs])
    for r, f in enumerate(flags):
        if r != me:
            f[READY], f[DONE], f[SRC] = 1, 0, WORDS[r]
    return rep, inputs, stage


@pytest.mark.parametrize("me", [0, 1, 2])
@pytest.mark.parametrize("where", ["apart", "in_place", "shifted_back", "shifted_on"])
def test_a_reduction_reads_my_input_as_it_was_when_out_overlaps_it(me: int, where: str) -> None:
    rep, inputs, stage = replay_at(me, mode=0)
    x0 = np.arange(N, dtype=np.int32) * 3 - 500
    buf = np.zeros(N + 1, np.int32)
    # shifted_back: out starts one element after x, so each result overwrites the element
    # of x read next (a read of x itself would see results); shifted_on: the other way
    x, out = {
        "apart": (buf[:N], np.zeros(N, np.int32)),
        "in_place": (buf[:N], buf[:N]),
        "shifted_back": (buf[:N], buf[1:]),
        "shifted_on": (buf[1:], buf[:N]),
    }[where]
    x[...] = x0
    want = rank_sum([x0 if r == me else inputs[r] for r in range(3)])
    assert rep.run(1, x, 0, out) == 0
    assert np.array_equal(out, want.astype(np.int32)), (me, where)
    assert np.array_equal(stage, x0)  # staged for the peers, whatever out is


@pytest.mark.parametrize("me", [0, 1, 2])
@pytest.mark.parametrize("block", [0, 1, 2])
def test_an_all_gather_copies_my_input_as_it_was_when_out_overlaps_it(me: int, block: int) -> None:
    """x is rank-order block ``block`` of out: blocks before mine are written before mine
    is copied, so a copy from x itself would copy a peer's input."""
    rep, inputs, stage = replay_at(me, mode=2)
    out = np.zeros(3 * N, np.int32)
    x = out[block * N : (block + 1) * N]
    x[...] = np.arange(N, dtype=np.int32) + 7
    want = np.concatenate([x.copy() if r == me else inputs[r] for r in range(3)])
    assert rep.run(1, x.view(np.uint8), 0, out.view(np.uint8)) == 0
    assert np.array_equal(out, want), (me, block)
    assert np.array_equal(stage, np.arange(N, dtype=np.int32) + 7)


@pytest.mark.parametrize("where", ["apart", "shifted_back", "shifted_on"])
def test_a_broadcast_root_copies_its_input_as_it_was_when_out_overlaps_it(where: str) -> None:
    rep, _, stage = replay_at(1, mode=1)
    x0 = np.arange(N, dtype=np.int32) * 5 + 1
    buf = np.zeros(N + 1, np.int32)
    x, out = {
        "apart": (buf[:N], np.zeros(N, np.int32)),
        "shifted_back": (buf[:N], buf[1:]),
        "shifted_on": (buf[1:], buf[:N]),
    }[where]
    x[...] = x0
    assert rep.run(1, x.view(np.uint8), 0, out.view(np.uint8)) == 0
    assert np.array_equal(out, x0), where
    assert np.array_equal(stage, x0)


def test_mine_must_be_one_of_the_words() -> None:
    flags = [np.zeros(16, np.int64) for _ in range(3)]
    with pytest.raises(ValueError, match="mine is none of words"):
        Replay(
            flags[0], (flags[1],), (flags[1], flags[2]), np.zeros(N, np.int32), 1,
            READY, DONE, SRC, I32, 0, N, 2000,
        )  # fmt: skip


F32 = 0  # the C replay's float32 code


def reduce_replay(
    me: int, count: int, dtype: Any, lo: int = 0, n: int = -1
) -> tuple[Any, list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    """A sum of ``count`` elements of ``dtype`` (int32 or float32) over the elements
    ``[lo, lo + n)``, replayed by rank-order index ``me``: (replay, every rank's input
    (my stage at me), my stage), the peers READY for call 1."""
    flags = [np.zeros(16, np.int64) for _ in range(3)]
    stage = np.zeros(count, dtype)
    rep = Replay(
        flags[me], tuple(f for r, f in enumerate(flags) if r != me), tuple(flags),
        stage, WORDS[me], READY, DONE, SRC, I32 if dtype == np.int32 else F32, 0, count,
        2000, 0, 0, lo, n,
    )  # fmt: skip
    rng = np.random.default_rng(count + me)
    inputs = [rng.integers(-1000, 1000, count).astype(dtype) for _ in range(3)]
    inputs[me] = stage
    rep.set_inputs(WORDS, inputs)
    for r, f in enumerate(flags):
        if r != me:
            f[READY], f[DONE], f[SRC] = 1, 0, WORDS[r]
    return rep, inputs, stage


@pytest.mark.parametrize("me", [0, 1, 2])
@pytest.mark.parametrize("count", [1, 1001, 1024, 5000, 8192, 8193, 20000])
def test_in_place_every_block_reads_my_input_as_it_was(me: int, count: int) -> None:
    """Exactly in place: up to 32 KiB block by block through an accumulator (one block of
    1024 int32 or several, the last one short), beyond it from the stage."""
    rep, inputs, stage = reduce_replay(me, count, np.int32)
    x = np.arange(count, dtype=np.int32) * 7 - 3
    x0 = x.copy()
    want = rank_sum([x0 if r == me else inputs[r] for r in range(3)])
    assert rep.run(1, x, 0, x) == 0
    assert np.array_equal(x, want.astype(np.int32)), (me, count)
    assert np.array_equal(stage, x0)


@pytest.mark.parametrize("me", [0, 2])
def test_a_shard_in_place_reads_my_input_as_it_was(me: int) -> None:
    """A reduce-scatter's shard into my own x's shard: the elements [lo, lo + n) only."""
    count, lo, n = 3000, 1000, 1500
    rep, inputs, stage = reduce_replay(me, count, np.int32, lo, n)
    x = np.arange(count, dtype=np.int32) - 1234
    x0 = x.copy()
    assert rep.run(1, x, 0, x[lo : lo + n]) == 0
    want = rank_sum([x0 if r == me else inputs[r] for r in range(3)])
    assert np.array_equal(x[lo : lo + n], want[lo : lo + n].astype(np.int32))
    assert np.array_equal(x[:lo], x0[:lo]) and np.array_equal(x[lo + n :], x0[lo + n :])
    assert np.array_equal(stage, x0)


def test_in_place_a_nan_in_a_late_block_is_handed_back_with_my_stage_whole() -> None:
    """numpy's case met in the fourth block: answer 2 (READY raised, no DONE), and the stage
    (what the Python replay reduces again, x being partly written) holds x as it was."""
    count = 6000  # float32: blocks of 1024
    rep, inputs, stage = reduce_replay(1, count, np.float32)
    inputs[2][3500] = np.nan
    x = np.linspace(-1.0, 1.0, count, dtype=np.float32)
    x0 = x.copy()
    assert rep.run(1, x, 0, x) == 2
    assert np.array_equal(stage, x0)
    assert rep.answers() == (0, 0, 1, 0)


def alone(count: int) -> tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """An int32 sum replayed by a rank alone on its node: (replay, my flags, my stage)."""
    flags = np.zeros(16, np.int64)
    stage = np.zeros(count, np.int32)
    rep = Replay(
        flags, (), (flags,), stage, WORDS[0], READY, DONE, SRC, I32, 0, count, 2000
    )  # fmt: skip
    rep.set_inputs(WORDS[:1], [stage])
    return rep, flags, stage


def test_a_stage_is_written_both_ways_in_turn_then_the_faster_way() -> None:
    """Each way of writing a staged input (memcpy, then streaming stores) is timed in half
    of the plan's first 16 staged runs and of the first 16 of every 1024, the first 2 runs
    of each way left out; in between the faster is kept. The stage is right every call
    either way."""
    rep, flags, stage = alone(4096)  # 16 KiB
    rng = np.random.default_rng(0)
    for s in range(1, 1042):
        x = rng.integers(-(1 << 30), 1 << 30, 4096, dtype=np.int32)
        out = np.zeros(4096, np.int32)
        assert rep.run(s, x, 0, out) == 0
        assert np.array_equal(stage, x) and np.array_equal(out, x), s
        streamed, copied, streams = rep.staging()
        k = (s - 1) % 1024 + 1  # the run's place in its window (1-16)
        if s <= 16 or 1024 < s <= 1040:  # runs 3-8 timed copying, 11-16 streaming
            assert (copied, streams) == (min(max(k - 2, 0), 6), max(k - 10, 0)), s
        elif s <= 1024:
            assert (copied, streams) == (0, 0) and streamed in (0, 1), s
        else:
            assert (copied, streams) == (0, 0), s
    assert flags[DONE] == 1041


def test_a_small_stage_is_always_copied() -> None:
    rep, _, stage = alone(1000)  # 4000 bytes: below 4 KiB
    for s in range(1, 20):
        x = np.full(1000, s, np.int32)
        assert rep.run(s, x, 0, np.zeros(1000, np.int32)) == 0
        assert (stage == s).all()
        assert rep.staging() == (0, 0, 0)


def test_a_plan_called_every_other_call_still_times_both_ways() -> None:
    """The turns follow the plan's own runs, not the call numbers: a plan whose calls are
    all even (another collective between them) times both ways too."""
    rep, _, _ = alone(4096)
    for i in range(1, 17):
        x = np.full(4096, i, np.int32)
        assert rep.run(2 * i, x, 0, np.zeros(4096, np.int32)) == 0
    assert rep.staging()[1:] == (6, 6)


PROG = int(Flag.PROG)


def broadcast_root(
    count: int, spin_ns: int = 2000
) -> tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A broadcast of ``count`` int32 elements from me (index 0), staged in chunks of 16 KiB
    (``spin_ns`` 0: a crowded node's, all at once), with one reader: (replay, the reader's
    flags, my stage)."""
    mine, peer = np.zeros(16, np.int64), np.zeros(16, np.int64)
    stage = np.zeros(count, np.int32)
    rep = Replay(
        mine, (peer,), (mine, peer), stage, WORDS[0], READY, DONE, SRC, U8, 0, 4 * count,
        spin_ns, 1, 0, prog=PROG, chunk=16 << 10,
    )  # fmt: skip
    rep.set_inputs(WORDS[:2], [stage.view(np.uint8), np.zeros(4 * count, np.uint8)])
    peer[SRC] = WORDS[1]
    return rep, peer, stage


@pytest.mark.parametrize("spin_ns", [2000, 0])
@pytest.mark.parametrize("count", [4096, 40000])  # one chunk, and ten (the last short)
def test_a_broadcast_root_times_both_ways_until_its_reader_is_done(
    count: int, spin_ns: int
) -> None:
    """A broadcast's root writes its stage both ways in turn (chunk by chunk beyond one, on
    a node with a core per rank), and times each run until its reader's DONE: the reader's
    copy is what the way changes. The stage is right every run either way."""
    rep, peer, stage = broadcast_root(count, spin_ns)
    rng = np.random.default_rng(1)
    for s in range(1, 18):
        peer[READY] = peer[DONE] = s  # (the reader's DONE already there: no wait)
        x = rng.integers(-(1 << 30), 1 << 30, count, dtype=np.int32)
        out = np.zeros(count, np.int32)
        assert rep.run(s, x.view(np.uint8), 0, out.view(np.uint8)) == 0
        assert np.array_equal(stage, x) and np.array_equal(out, x), s
        if s == 16:
            assert rep.staging()[1:] == (6, 6)
    assert rep.staging()[1:] == (0, 0)  # a choice made


def test_a_first_window_without_timings_is_tried_again_soon() -> None:
    """Runs whose reader is not done within the spin are not timed (and still done: a
    root's input is staged); a first window left without timings is followed by another
    64 runs later, not a whole period."""
    rep, peer, stage = broadcast_root(40000)
    x = np.arange(40000, dtype=np.int32)
    out = np.zeros(40000, np.int32)
    for s in range(1, 98):
        peer[READY] = s
        peer[DONE] = s - 1 if s <= 17 else s  # a slow reader in the first window only
        assert rep.run(s, x.view(np.uint8), 0, out.view(np.uint8)) == 0
        assert np.array_equal(stage, x)
        counts = rep.staging()[1:]
        if s <= 81:
            assert counts == (0, 0), s
        elif s == 97:  # runs 82-97: the second window
            assert counts == (6, 6)
