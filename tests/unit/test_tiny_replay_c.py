"""The C replay of a cached small all-reduce (``collectives._replay``), on flag words and
inputs laid out in this process as three ranks would publish them: every answer of
``Replay.run`` (done, untouched, READY raised, DONE raised) leaves exactly the flags the
Python replay expects to go on from, and every reduction it takes is numpy's, bitwise."""

from __future__ import annotations

import importlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from collectives import replay
from collectives.ops import UFUNCS, reduce_into

if replay.replay_status() != "C":
    pytest.skip(replay.replay_status(), allow_module_level=True)
Replay: Any = importlib.import_module("collectives._replay").Replay

READY, DONE, SRC = 0, 2, 3  # the flag words (collectives.channel.Flag)
# what the Python replay applies (collectives.ops): the C replay must give its bits
UFUNC = {op: UFUNCS[op] for op in ("sum", "prod", "min", "max", "band", "bor", "bxor")}
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
CASES = [(op, "float32") for op in ("sum", "prod")] + [(op, "float64") for op in ("sum", "prod")]
CASES += [(op, name) for name in INTS for op in UFUNC]
WORDS = [111, 222, 333]  # each rank's SRC word (offset and signature tag) for this plan


class Ranks:
    """Three ranks' flag blocks and inputs; rank 0 is the one replaying in C."""

    def __init__(
        self,
        dtype: np.dtype[Any],
        op: str,
        count: int,
        spin_ns: int = 2000,
        acc: np.dtype[Any] | None = None,
    ) -> None:
        self.dtype, self.count = dtype, count
        codes = replay.c_reduce_codes(dtype, op, acc)
        assert codes is not None, (dtype, op, acc)
        self.flags = [np.zeros(16, np.int64) for _ in range(3)]
        self.stage = np.zeros(max(count * dtype.itemsize, 1), np.uint8)
        self.peer_inputs = [np.zeros(count, dtype) for _ in range(2)]
        self.replay = Replay(
            self.flags[0],
            (self.flags[1], self.flags[2]),
            tuple(self.flags),
            self.stage,
            WORDS[0],
            READY,
            DONE,
            SRC,
            codes[0],
            codes[1],
            count,
            spin_ns,
        )
        mine = self.stage[: count * dtype.itemsize].view(dtype)
        self.replay.set_inputs(WORDS, [mine, *self.peer_inputs])

    def peers_at(self, ready: int, done: int, words: tuple[int, int] = (222, 333)) -> None:
        for f, w in zip(self.flags[1:], words, strict=True):
            f[READY], f[DONE], f[SRC] = ready, done, w


def values(name: str, op: str, count: int, seed: int) -> np.ndarray[Any, Any]:
    """Inputs that reach the edges: integer wrap-around; for floats every magnitude whose
    products and sums stay normal, and signed zeros."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(name)
    if dt.kind == "f":
        x = (rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count)).astype(dt)
        x[: min(count, 2)] = np.array([-0.0, 0.0])[: min(count, 2)]
        return x
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)


@pytest.mark.parametrize(("op", "name"), CASES, ids=[f"{o}-{n}" for o, n in CASES])
def test_a_replay_reduces_like_numpy_in_rank_order(op: str, name: str) -> None:
    dt = np.dtype(name)
    for count in (0, 1, 5, 64, 1001):
        ranks = Ranks(dt, op, count)
        xs = [values(name, op, count, seed) for seed in range(3)]
        ranks.peer_inputs[0][...] = xs[1]
        ranks.peer_inputs[1][...] = xs[2]
        ranks.peers_at(ready=1, done=0)
        out = np.full(count, 7, dt)
        assert ranks.replay.run(1, xs[0], 0, out) == 0
        with np.errstate(over="ignore"):  # integers wrap (numpy warns for scalars only)
            want = UFUNC[op](UFUNC[op](xs[0], xs[1]), xs[2])
        assert out.tobytes() == want.tobytes(), (op, name, count)
        f = ranks.flags[0]
        assert (f[READY], f[DONE], f[SRC]) == (1, 1, WORDS[0])
        assert ranks.replay.answers() == (1, 0, 0, 0)


NAN_A = np.array([0x7FC00001], np.uint32).view(np.float32)[0]  # two NaNs numpy and C
NAN_B = np.array([0xFFC00002], np.uint32).view(np.float32)[0]  # may keep differently


@pytest.mark.parametrize(
    ("op", "a", "b", "c"),
    [
        ("sum", NAN_A, 1.0, NAN_B),  # NaNs from two ranks: which one survives is numpy's
        ("sum", 1.0, 2.0, NAN_A),
        ("sum", np.inf, -np.inf, 1.0),  # invalid
        ("sum", 3e38, 3e38, 0.0),  # overflow
        ("prod", 1e-30, 1e-30, 1.0),  # underflow
        ("prod", 0.0, np.inf, 1.0),  # invalid
    ],
)
def test_float_results_numpy_would_flag_or_nan_are_handed_back(
    op: str, a: float, b: float, c: float
) -> None:
    """Every rank must get numpy's bits and numpy's np.seterr handling: a float result that
    is a NaN or raised a floating-point flag stays with READY raised (answer 2, DONE not
    raised), and the Python replay reduces again with numpy."""
    dt = np.dtype(np.float32)
    ranks = Ranks(dt, op, 4)
    ranks.peer_inputs[0][...] = [b, 1, 1, 1]
    ranks.peer_inputs[1][...] = [c, 1, 1, 1]
    ranks.peers_at(ready=1, done=0)
    out = np.zeros(4, dt)
    assert ranks.replay.run(1, np.array([a, 1, 1, 1], dt), 0, out) == 2
    assert (ranks.flags[0][READY], ranks.flags[0][DONE]) == (1, 0)
    for x in ranks.peer_inputs:  # call 2: ones everywhere, done in C
        x[...] = 1
    ranks.peers_at(ready=2, done=1)
    assert ranks.replay.run(2, np.ones(4, dt), 0, out) == 0
    assert (out == (1 if op == "prod" else 3)).all()


F32 = np.dtype(np.float32)
WIDENED = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def low_precision(dt: np.dtype[Any], op: str, count: int, seed: int) -> np.ndarray[Any, Any]:
    """Inputs whose float32 sums and products of three stay in ``dt``'s normal range (the
    roundings to nearest even are what is compared), ties and signed zeros among them."""
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], count)
    if op == "prod":
        x = rng.uniform(0.25, 4.0, count) * signs
    elif dt == np.float16:  # positive: no sum cancels into float16's subnormals
        x = rng.uniform(0.5, 2.0, count) * 10.0 ** rng.integers(-2, 4, count)
    else:
        x = rng.standard_normal(count) * 10.0 ** rng.integers(-30, 30, count)
    y: np.ndarray[Any, Any] = np.asarray(x, np.float32).astype(dt)
    y[: min(count, 2)] = np.array([-0.0, 0.0])[: min(count, 2)]
    return y


@pytest.mark.parametrize("op", ["sum", "prod", "avg"])
@pytest.mark.parametrize("dt", WIDENED, ids=lambda d: d.name)
def test_float16_and_bfloat16_accumulate_in_float32_like_numpy(
    monkeypatch: pytest.MonkeyPatch, dt: np.dtype[Any], op: str
) -> None:
    """The widened replay (float16/bfloat16 in float32, an average divided there, rounded
    once) gives numpy's bits (reduce_into with its C reduction off), through its chunks (512
    elements) and a partial last one."""
    from collectives import ops

    monkeypatch.setattr(ops, "_c_reduce_wide", None)  # the reference: numpy alone
    assert replay.c_reduce_codes(dt, op) is None  # never without the float32 accumulator
    assert replay.c_reduce_codes(dt, "min", F32) is None
    assert replay.c_reduce_codes(dt, op, np.dtype(np.float64)) is None
    for count in (0, 1, 5, 512, 1501):
        ranks = Ranks(dt, op, count, acc=F32)
        xs = [low_precision(dt, op, count, seed) for seed in range(3)]
        ranks.peer_inputs[0][...] = xs[1]
        ranks.peer_inputs[1][...] = xs[2]
        ranks.peers_at(ready=1, done=0)
        out = np.full(count, 7, dt)
        assert ranks.replay.run(1, xs[0], 0, out) == 0, (dt, op, count)
        want = np.empty(count, dt)
        reduce_into(want, xs, op, F32, avg_count=3)
        assert out.tobytes() == want.tobytes(), (dt, op, count)


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_a_float_average_divides_the_rank_order_sum_like_numpy(name: str) -> None:
    """avg of float32/float64: the rank-order sum divided by the ranks (np.divide), in C; one
    whose division underflows is handed back; an integer average is never taken (it
    truncates: Python's)."""
    dt = np.dtype(name)
    for count in (1, 64, 1001):
        ranks = Ranks(dt, "avg", count)
        xs = [values(name, "sum", count, seed) for seed in range(3)]
        ranks.peer_inputs[0][...] = xs[1]
        ranks.peer_inputs[1][...] = xs[2]
        ranks.peers_at(ready=1, done=0)
        out = np.full(count, 7, dt)
        assert ranks.replay.run(1, xs[0], 0, out) == 0
        want = np.divide(np.add(np.add(xs[0], xs[1]), xs[2]), dt.type(3))
        assert out.tobytes() == want.tobytes(), (name, count)
    tiny = np.finfo(dt).smallest_normal
    ranks = Ranks(dt, "avg", 4)
    ranks.peers_at(ready=1, done=0)
    assert ranks.replay.run(1, np.full(4, tiny, dt), 0, np.zeros(4, dt)) == 2  # underflow
    assert replay.c_reduce_codes(np.dtype(np.int32), "avg") is None
    assert replay.c_reduce_codes(np.dtype(np.int32), "sum") is not None


BF16_NAN = np.array([0x7F81], np.uint16).view(ml_dtypes.bfloat16)[0]


@pytest.mark.parametrize(
    ("dt", "op", "a", "b"),
    [
        ("float16", "sum", 60000.0, 6000.0),  # rounds to inf: numpy flags the cast
        ("float16", "sum", 1e-5, -1.0),  # a subnormal result: numpy may flag underflow
        ("float16", "sum", np.inf, 1.0),
        ("float16", "sum", np.nan, 1.0),
        ("bfloat16", "sum", BF16_NAN, 1.0),  # which NaN the rounding keeps is ml_dtypes'
        ("bfloat16", "sum", 3e38, 3e38),  # float32 overflow
        ("bfloat16", "prod", 1e-30, 1e-30),  # float32 underflow
    ],
)
def test_widened_results_numpy_would_flag_or_nan_are_handed_back(
    dt: str, op: str, a: float, b: float
) -> None:
    dtype = np.dtype(ml_dtypes.bfloat16) if dt == "bfloat16" else np.dtype(dt)
    ranks = Ranks(dtype, op, 600, acc=F32)  # (the second chunk holds the case)
    ranks.peer_inputs[0][...] = 1
    ranks.peer_inputs[1][...] = 1
    ranks.peer_inputs[0][550] = b
    ranks.peers_at(ready=1, done=0)
    x = np.ones(600, dtype)
    x[550] = a
    out = np.zeros(600, dtype)
    with np.errstate(all="ignore"):
        assert ranks.replay.run(1, x, 0, out) == 2
    assert (ranks.flags[0][READY], ranks.flags[0][DONE]) == (1, 0)


def test_a_widened_replay_of_one_rank_rounds_as_numpy() -> None:
    """One rank: the input widened and rounded back (its bits, but for a NaN, which is
    handed back: the rounding's NaN is ml_dtypes')."""
    dt = np.dtype(ml_dtypes.bfloat16)
    flags = np.zeros(16, np.int64)
    stage = np.zeros(64, np.uint8)
    codes = replay.c_reduce_codes(dt, "sum", F32)
    assert codes is not None
    one = Replay(flags, (), (flags,), stage, 5, READY, DONE, SRC, *codes, 8, 0)
    one.set_inputs([5], [stage[:16].view(dt)])
    x = low_precision(dt, "sum", 8, 1)
    out = np.zeros(8, dt)
    assert one.run(1, x, 0, out) == 0 and out.tobytes() == x.tobytes()
    x[3] = BF16_NAN
    assert one.run(2, x, 0, out) == 2


def test_each_answer_leaves_the_flags_the_python_replay_goes_on_from() -> None:
    dt = np.dtype(np.float32)
    ranks = Ranks(dt, "sum", 4)
    mine, x, out = ranks.flags[0], np.ones(4, dt), np.zeros(4, dt)
    # a peer still on call 0 (DONE 0 < 1): nothing is touched, not even my stage
    ranks.peers_at(ready=1, done=0)
    mine[READY] = mine[DONE] = 1
    assert ranks.replay.run(2, x, 0, out) == 1
    assert (mine[READY], mine[DONE], mine[SRC]) == (1, 1, 0) and not ranks.stage.any()
    # the peers finished call 1 but have not raised READY for call 2: mine is raised
    ranks.peers_at(ready=1, done=1)
    assert ranks.replay.run(2, x, 0, out) == 2
    assert (mine[READY], mine[DONE], mine[SRC]) == (2, 1, WORDS[0]) and not out.any()
    # a peer published something else (a new buffer, or another call): READY, no reduction
    ranks.peers_at(ready=3, done=2, words=(222, 999))
    assert ranks.replay.run(3, x, 0, out) == 2 and mine[DONE] == 1 and not out.any()
    # a zero-copy input: DONE is raised, the peers still read it (their DONE < 4)
    ranks.peers_at(ready=4, done=3)
    assert ranks.replay.run(4, None, WORDS[0], out) == 3
    assert (mine[READY], mine[DONE]) == (4, 4) and (out == 1).all()  # call 2's stage
    ranks.peers_at(ready=5, done=5)
    ranks.peer_inputs[1][...] = 2
    assert ranks.replay.run(5, None, WORDS[0], out) == 0 and (out == 3).all()
    assert ranks.replay.answers() == (1, 1, 2, 1)


def test_inputs_and_outputs_it_does_not_take_are_left_to_python() -> None:
    dt = np.dtype(np.int64)
    ranks = Ranks(dt, "sum", 4)
    ranks.peers_at(ready=1, done=0)
    x, out = np.arange(4, dtype=dt), np.zeros(4, dt)
    strided = np.arange(8, dtype=dt)[::2]
    readonly = np.zeros(4, dt)
    readonly.flags.writeable = False
    for args in [
        (strided, 0, out),  # not contiguous: the Python replay copies it
        (x[:3], 0, out),  # another size
        (x, 0, np.zeros(5, dt)),
        (x, 0, strided),
        (x, 0, readonly),
        (x, 0, ranks.peer_inputs[1]),  # out is an input: numpy handles the overlap
        (x, 0, ranks.stage.view(dt)),
    ]:
        assert ranks.replay.run(1, *args) == 1
        assert ranks.flags[0][READY] == 0 and not ranks.stage.any()
    ranks.replay.close()
    assert ranks.replay.run(1, x, 0, out) == 1  # closed: every address forgotten
    with pytest.raises(ValueError, match="closed"):
        ranks.replay.set_inputs(WORDS, [x, x, x])


def test_bad_construction_and_inputs_raise_clearly() -> None:
    flags = np.zeros(16, np.int64)
    stage = np.zeros(64, np.uint8)
    args = (flags, (flags,), (flags, flags), stage, 1, READY, DONE, SRC)
    with pytest.raises(ValueError, match="out of range"):
        Replay(*args, 0, 4, 4, 1000)  # band on float32
    with pytest.raises(ValueError, match="out of range"):
        Replay(*args, 4, 7, 4, 1000)  # avg on int32
    with pytest.raises(ValueError, match="out of range"):
        Replay(*args, 12, 0, 4, 1000)  # no such type
    with pytest.raises(ValueError, match="stage has 64 bytes, at least 128 needed"):
        Replay(*args, 1, 0, 16, 1000)  # 16 float64 do not fit the stage
    with pytest.raises(ValueError, match="mine has 16 bytes, at least 32 needed"):
        Replay(np.zeros(2, np.int64), *args[1:], 0, 0, 4, 1000)  # too few flag words
    with pytest.raises(BufferError):
        Replay(bytes(128), *args[1:], 0, 0, 4, 1000)  # read-only flags
    rep = Replay(*args, 0, 0, 4, 1000)
    with pytest.raises(TypeError, match="one item per rank"):
        rep.set_inputs([1], [stage])
    with pytest.raises(ValueError, match=r"inputs\[1\] has 8 bytes, at least 16 needed"):
        rep.set_inputs([1, 2], [stage, np.zeros(2, np.float32)])
    assert rep.run(1, np.zeros(4, np.float32), 0, np.zeros(4, np.float32)) == 1  # unset


# -- Memo: a remembered call, the engine's checks made in C ----------------------------------

Memo: Any = importlib.import_module("collectives._replay").Memo


class Stats:
    def __init__(self, algorithms: dict[str, int] | None) -> None:
        self.calls, self.staged_bytes, self.algorithms = 0, 0, algorithms
        self.counted: list[str] = []

    def count(self, name: str) -> None:
        self.counted.append(name)


class Chan:
    def __init__(self, algorithms: dict[str, int] | None = None) -> None:
        self.seq, self.sig_seq = 0, -1
        self.signature: object = None
        self.stats, self.broken = Stats(algorithms), False


def memo_over(ranks: Ranks, ch: Chan, x: Any, out: Any, dst: Any, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        replay=ranks.replay, x=x, out=out, op="sum", guards=((ch, "broken", False),), ch=ch,
        signature="sig", src=x, shm_word=0, dst=dst, result=out, make=np.empty,
        make_args=((ranks.count,), ranks.dtype), staged=ranks.count * ranks.dtype.itemsize,
        name="one_shot",
    )  # fmt: skip
    args.update(kw)
    return Memo(**args)


def test_a_memo_replays_its_own_call_and_counts_it() -> None:
    """The same x and out (and an equal op): one run, the channel's seq and signature set,
    the call, its staged bytes and its algorithm counted; a new array where it has no out."""
    dt = np.dtype(np.float32)
    ranks = Ranks(dt, "sum", 4)
    ranks.peer_inputs[0][...] = 1.0
    ranks.peer_inputs[1][...] = 2.0
    ch = Chan({"one_shot": 5})
    x, out = np.arange(4, dtype=dt), np.zeros(4, dt)
    memo = memo_over(ranks, ch, x, out, out)
    ranks.peers_at(ready=1, done=0)
    assert memo.replay(x, out, "".join(["s", "um"])) is out  # (an equal op, not the same)
    assert out.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert (ch.seq, ch.signature, ch.stats.calls, ch.stats.staged_bytes) == (1, "sig", 1, 16)
    assert ch.stats.algorithms == {"one_shot": 6}
    fresh = memo_over(ranks, ch, x, None, None)
    ch.stats.algorithms = None  # (CommStats.count makes the mapping)
    ranks.peers_at(ready=2, done=1)
    got = fresh.replay(x, None, "sum")
    assert type(got) is np.ndarray and got is not out and got.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert (ch.seq, ch.stats.calls, ch.stats.counted) == (2, 2, ["one_shot"])


def test_a_memo_does_nothing_where_a_check_fails() -> None:
    """Another x, out or op, a guard that no longer holds, a closed replay, or a previous
    call whose SIG word Python must check: None, and no flag, seq or counter moved."""
    dt = np.dtype(np.int64)
    ranks = Ranks(dt, "sum", 2)
    ch = Chan()
    x, out = np.ones(2, dt), np.zeros(2, dt)
    memo = memo_over(ranks, ch, x, out, out)
    ranks.peers_at(ready=1, done=0)
    assert memo.replay(x.copy(), out, "sum") is None
    assert memo.replay(x, None, "sum") is None
    assert memo.replay(x, out, "prod") is None
    ch.broken = True
    assert memo.replay(x, out, "sum") is None
    ch.broken = False
    ch.sig_seq = 0  # == seq: the previous call wrote its SIG word
    assert memo.replay(x, out, "sum") is None
    assert (ch.seq, ch.stats.calls, ranks.flags[0][READY]) == (0, 0, 0)
    ch.sig_seq = -1
    ranks.replay.close()
    assert memo.replay(x, out, "sum") is None
    assert ranks.replay.answers() == (0, 0, 0, 0)


def test_a_memo_hands_back_where_the_run_stops() -> None:
    """A peer not READY within the spin: (answer, s, result) for the Python replay to go on
    from, the staged bytes counted (the input was published), the call not yet."""
    dt = np.dtype(np.float64)
    ranks = Ranks(dt, "sum", 3, spin_ns=1000)
    ch = Chan()
    x, out = np.ones(3, dt), np.zeros(3, dt)
    memo = memo_over(ranks, ch, x, out, out)
    ranks.peers_at(ready=0, done=0)  # no peer's READY of call 1
    code, s, res = memo.replay(x, out, "sum")
    assert (code, s, res is out) == (2, 1, True)
    assert (ch.seq, ch.stats.calls, ch.stats.staged_bytes, ranks.flags[0][READY]) == (1, 0, 24, 1)


def test_a_memo_refuses_malformed_arguments() -> None:
    ranks = Ranks(np.dtype(np.float32), "sum", 1)
    ch, x = Chan(), np.zeros(1, np.float32)
    with pytest.raises(TypeError, match="guard"):
        memo_over(ranks, ch, x, x, x, guards=((ch, "broken"),))
    with pytest.raises(TypeError):
        memo_over(ranks, ch, x, x, x, replay=object())
    with pytest.raises(TypeError, match="replay"):
        memo_over(ranks, ch, x, x, x).replay(x, x)
