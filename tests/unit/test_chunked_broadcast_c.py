"""The C replay of a cached broadcast beyond one chunk (``collectives._replay``, mode
"copy_one" with ``prog``/``chunk``), on flag words and buffers laid out in this process as
three ranks would publish them: the root stages its input chunk by chunk and counts the
chunks in its ``PROG`` word; a reader copies exactly the chunks the root's ``PROG`` counts
and, where the rest does not come within the spin, hands the call back after ``READY``
with nothing beyond them written."""

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

READY, DONE, SRC, PROG = int(Flag.READY), int(Flag.DONE), int(Flag.SRC), int(Flag.PROG)
WORDS = [111, 222, 333]  # each rank's SRC word for this plan
CHUNK = 256
NBYTES = 3 * CHUNK + 40  # four chunks, the last one short
U8 = 6  # the C replay's uint8 code (collectives.replay._C_TYPES): a copy counts bytes


class Ranks:
    """Three ranks' flags and stages; rank 0 replays in C, rank ``root`` is the root."""

    def __init__(self, root: int, spin_ns: int = 2000) -> None:
        self.flags = [np.zeros(16, np.int64) for _ in range(3)]
        self.stages = [np.zeros(NBYTES, np.uint8) for _ in range(3)]
        self.replay = Replay(
            self.flags[0],
            (self.flags[1], self.flags[2]),
            tuple(self.flags),
            self.stages[0],
            WORDS[0],
            READY,
            DONE,
            SRC,
            U8,
            0,
            NBYTES,
            spin_ns,
            1,  # copy_one
            root,
            prog=PROG,
            chunk=CHUNK,
        )
        self.replay.set_inputs(WORDS, list(self.stages))

    def peers_at(self, ready: int, done: int) -> None:
        for f, w in zip(self.flags[1:], WORDS[1:], strict=True):
            f[READY], f[DONE], f[SRC] = ready, done, w


def test_a_reader_copies_only_the_chunks_the_roots_prog_counts() -> None:
    ranks = Ranks(root=1)
    data = np.random.default_rng(0).integers(0, 256, NBYTES, dtype=np.uint8)
    ranks.stages[1][...] = data
    root = ranks.flags[1]
    mine = ranks.flags[0]
    x = np.zeros(NBYTES, np.uint8)  # a non-root's x: read by no one
    for have in (0, 1, 3):  # the root raised READY, then staged `have` chunks
        out = np.full(NBYTES, 7, np.uint8)
        ranks.peers_at(ready=1, done=0)
        root[PROG] = have
        assert ranks.replay.run(1, x, 0, out) == 2  # handed back after READY
        assert (out[: have * CHUNK] == data[: have * CHUNK]).all()
        assert (out[have * CHUNK :] == 7).all(), have  # nothing the root had not staged
        assert (mine[READY], mine[DONE]) == (1, 0)
        mine[READY] = 0
    out = np.full(NBYTES, 7, np.uint8)
    root[PROG] = 4  # all of it (the last chunk short)
    assert ranks.replay.run(1, x, 0, out) == 0
    assert (out == data).all() and (mine[READY], mine[DONE]) == (1, 1)
    assert not ranks.stages[0].any()  # a non-root stages nothing
    root[PROG] = -1  # a root that abandoned the call retracts it: nothing is copied
    ranks.peers_at(ready=2, done=1)
    out[...] = 7
    assert ranks.replay.run(2, x, 0, out) == 2 and (out == 7).all()


def test_the_root_counts_every_chunk_it_staged() -> None:
    # (0: a crowded node's root stages it all before READY; the order of its stores is not
    # visible from one thread, so both must end in the same state)
    for spin_ns in (2000, 0):
        ranks = Ranks(root=0, spin_ns=spin_ns)
        data = np.random.default_rng(1).integers(0, 256, NBYTES, dtype=np.uint8)
        out = np.zeros(NBYTES, np.uint8)
        ranks.peers_at(ready=1, done=0)
        assert ranks.replay.run(1, data, 0, out) == 0
        mine = ranks.flags[0]
        assert (mine[READY], mine[DONE], mine[PROG], mine[SRC]) == (1, 1, 4, WORDS[0])
        assert (ranks.stages[0] == data).all() and (out == data).all()
        # a zero-copy input (its SRC word given): PROG counts it all at once
        ranks.peers_at(ready=2, done=2)
        mine[PROG] = 0
        assert ranks.replay.run(2, None, WORDS[0], out) == 0
        assert (mine[READY], mine[DONE], mine[PROG]) == (2, 2, 4)


def test_one_chunk_or_less_is_not_counted() -> None:
    """A broadcast of one chunk publishes as before: no PROG store, no PROG wait."""
    flags = [np.zeros(16, np.int64) for _ in range(2)]
    stage = np.zeros(CHUNK, np.uint8)
    rep = Replay(
        flags[0], (flags[1],), tuple(flags), stage, WORDS[0], READY, DONE, SRC, U8, 0, CHUNK,
        2000, 1, 1, prog=PROG, chunk=CHUNK,
    )  # fmt: skip
    peer = np.arange(CHUNK, dtype=np.uint8)
    rep.set_inputs(WORDS[:2], [stage, peer])
    flags[1][READY], flags[1][SRC] = 1, WORDS[1]
    flags[1][PROG] = 0  # never raised by such a root
    out = np.zeros(CHUNK, np.uint8)
    assert rep.run(1, np.zeros(CHUNK, np.uint8), 0, out) == 0 and (out == peer).all()


def test_bad_chunks_raise_clearly() -> None:
    flags = np.zeros(16, np.int64)
    stage = np.zeros(NBYTES, np.uint8)
    args = (flags, (flags,), (flags, flags), stage, 1, READY, DONE, SRC, U8, 0, NBYTES, 1000)
    for mode, kw in (
        (1, {"chunk": CHUNK}),  # a chunk with no PROG word
        (1, {"prog": PROG}),  # a PROG word with no chunk
        (2, {"prog": PROG, "chunk": CHUNK}),  # chunks for an all-gather
        (1, {"prog": PROG, "chunk": -1}),
    ):
        with pytest.raises(ValueError, match="chunk"):
            Replay(*args, mode, 0, **kw)
    with pytest.raises(ValueError, match="mine has 8 bytes, at least 88 needed"):
        Replay(np.zeros(1, np.int64), *args[1:], 1, 0, prog=PROG, chunk=CHUNK)
