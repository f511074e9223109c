"""Bad input and edge cases of the OpenSHMEM calls (issue 14, found by an audit): every one
gets a clear ``ArgumentError``/``ShmemStateError`` the same on the shared and RMA paths, and
nothing is lost or silently changed; and the context operations the other tests leave out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import collectives
import shmem
from shmem.errors import ArgumentError, RemoteTimeoutError, ShmemStateError

pytestmark = pytest.mark.mpi


@pytest.fixture
def world() -> Iterator[Any]:
    w = shmem.init(heap_nbytes="8MiB", signal_timeout_s=10.0)
    try:
        yield w
    finally:
        w.finalize()


def _right(w: Any) -> int:
    return int((w.rank + 1) % w.world_size)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "value",
    [1e300, 2**1100, -(2**1100), "x", True, None],
    ids=["1e300", "2**1100", "-2**1100", "str", "bool", "None"],
)
def test_float_atomics_refuse_values_the_dtype_cannot_hold(
    world: Any, dtype: str, value: Any
) -> None:
    w = world
    buf = w.zeros(2, dtype)
    if dtype == "float64" and value == 1e300:
        pytest.skip("1e300 is a float64")
    to = _right(w)
    calls: list[Callable[[], object]] = [
        lambda: buf.atomic_set(to, 0, value),
        lambda: buf.atomic_swap(to, 0, value),
        lambda: buf.atomic_nbi(to, 0, "swap", value),
    ]
    for call in calls:
        with pytest.raises(ArgumentError, match="value"):
            call()
    w.quiet()
    w.barrier()
    assert buf.local().tolist() == [0.0, 0.0]  # nothing landed
    w.barrier()
    buf.close()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_atomics_still_take_inf_nan_and_the_largest_finite(world: Any, dtype: str) -> None:
    w = world
    buf = w.zeros(3, dtype)
    big = float(np.finfo(dtype).max)
    w.barrier()
    buf.atomic_set(_right(w), 0, np.inf)
    buf.atomic_set(_right(w), 1, big)
    old = buf.atomic_swap(_right(w), 2, float("nan"))
    assert old == 0.0
    w.barrier()
    got = buf.local()
    assert got[0] == np.inf and got[1] == big and np.isnan(got[2])
    w.barrier()
    buf.close()


def test_put_refuses_float8_overflow_that_becomes_nan(world: Any) -> None:
    """float8_e4m3fn has no infinity: an overflowing value turns into NaN, a loss."""
    w = world
    e4 = w.zeros(4, np.dtype(ml_dtypes.float8_e4m3fn))
    to = _right(w)
    for src in (np.array([1000.0]), np.array([1000], np.int64)):
        with pytest.raises(ArgumentError, match="overflows float8_e4m3"):
            e4.put(to, src)
        with pytest.raises(ArgumentError, match="overflows"):
            e4.p(to, 0, 1000.0)
    e4.put(to, np.array([448.0, 1.0]))  # the largest finite value fits
    w.barrier()
    assert e4.local()[:2].astype(np.float32).tolist() == [448.0, 1.0]
    w.barrier()
    e4.put(to, np.array([1000.0]), offset=2, casting="unsafe")  # C semantics on request
    w.barrier()
    assert np.isnan(e4.local()[2].astype(np.float32))
    w.barrier()
    e4.close()


def test_put_casts_between_signed_and_unsigned_when_every_value_fits(world: Any) -> None:
    w = world
    u = w.zeros(3, "uint64")
    i = w.zeros(2, "int32")
    to = _right(w)
    u.put(to, [1, 2, 3])  # a Python list is int64 to numpy: it fits
    i.put(to, np.array([7, 2**31 - 1], np.uint64))
    with pytest.raises(ArgumentError, match="does not fit"):
        u.put(to, [-1])
    with pytest.raises(ArgumentError, match="does not fit"):
        i.put(to, np.array([2**31], np.uint64))
    w.barrier()
    assert u.local().tolist() == [1, 2, 3] and i.local().tolist() == [7, 2**31 - 1]
    w.barrier()
    u.close()
    i.close()


@pytest.mark.parametrize(
    "call",
    [
        lambda x: x.test("eq", 7, index=1.5),
        lambda x: x.test("eq", 7, index=True),
        lambda x: x.test_all("eq", 7, indices=[1.9]),
        lambda x: x.test_any("eq", 7, indices=["a"]),
        lambda x: x.test_some("eq", 7, indices=5),
        lambda x: x.test_all("eq", 7, indices="01"),
        lambda x: x.wait_until("eq", 7, index=1.5, timeout=0.01),
        lambda x: x.wait_until_all("eq", 7, indices=[0, 1], status=["x", 0], timeout=0.01),
        lambda x: x.test_all("eq", 7, indices=[0, 1], status=1),
        lambda x: x.test("eq", 7, index=4),
    ],
    ids=[
        "index-float",
        "index-bool",
        "indices-float",
        "indices-str-entry",
        "indices-int",
        "indices-str",
        "wait-index-float",
        "status-entry",
        "status-int",
        "index-range",
    ],
)
def test_waits_and_tests_refuse_bad_indices(world: Any, call: Any) -> None:
    x = world.zeros(4, "int64")
    with pytest.raises(ArgumentError, match=r"index|indices|status"):
        call(x)
    world.barrier()
    x.close()


def test_communicator_on_a_destroyed_team(world: Any) -> None:
    w = world
    team = w.team_world.split_strided(w.world_size - 1, -1, w.world_size)
    same = w.team_world.split_strided(0, 1, w.world_size)
    team.destroy()
    same.destroy()
    for t in (team, same):
        with pytest.raises(ShmemStateError, match="destroyed"):
            collectives.Communicator(t)
        with pytest.raises(ShmemStateError, match="destroyed"):
            collectives.Communicator(w, team=t)
    with pytest.raises(ArgumentError, match="team"):
        collectives.Communicator(w, team="x")  # type: ignore[arg-type]
    w.barrier()


def test_objects_of_the_wrong_kind_are_refused(world: Any) -> None:
    w = world
    x = w.zeros(4, "int64")
    with pytest.raises(ArgumentError, match="ctx"):
        x.put_nbi(_right(w), np.ones(4, np.int64), ctx="x")
    with pytest.raises(ArgumentError, match="team"):
        w.create_context(team="x")
    with pytest.raises(ArgumentError, match="dest"):
        w.team_world.translate_pe(0, "x")
    with pytest.raises(ArgumentError, match="config"):  # on every rank (agreed)
        w.team_world.split_strided(0, 1, w.world_size, config="x")
    with pytest.raises(ArgumentError, match="config"):
        w.team_world.split_2d(1, xconfig="x")
    assert not w.pe_accessible(True)
    assert w.pe_accessible(0) and not w.pe_accessible(w.world_size)
    w.quiet()
    w.barrier()
    assert not x.local().any()  # nothing moved
    w.barrier()
    x.close()


def test_every_context_operation_on_a_team_context(world: Any) -> None:
    """put_signal[_nbi], ibput/ibget, atomic_nbi and get_nbi on a context made from a
    reversed team: ranks are team ranks, completion is the context's quiet."""
    w = world
    r, n = w.rank, w.world_size
    team = w.team_world.split_strided(n - 1, -1, n)
    me = team.my_pe
    tr = (me + 1) % team.n_pes
    wl = team.members[(me - 1) % team.n_pes]  # the world rank that writes into me
    x = w.zeros((4, 8), "int64")
    sig = w.zeros(2, "uint64")
    c = w.zeros(2, "uint32")
    with team.create_ctx() as ctx:
        ctx.put_signal_nbi(x, tr, np.full(8, r, np.int64), sig, 5, "add", sig_index=1, offset=64)
        ctx.quiet()
        sig.signal_wait_until("ge", 5, index=1)
        assert x.local()[1].tolist() == [wl] * 8
        w.barrier()
        ctx.put_signal(x, tr, np.full(8, 100 + r, np.int64), sig, 1, "set", offset=0)
        sig.signal_wait_until("eq", 1, index=0)
        assert x.local()[0].tolist() == [100 + wl] * 8
        w.barrier()
        ctx.ibput(x, tr, np.arange(4, dtype=np.int64) + 1000 * r, block=1, stride=8, index=7)
        w.barrier()
        assert x.local()[:, 7].tolist() == (np.arange(4) + 1000 * wl).tolist()
        got = ctx.ibget(x, tr, block=1, stride=8, nblocks=4, index=7)
        assert got.tolist() == (np.arange(4) + 1000 * r).tolist()
        w.barrier()
        fetched = [ctx.atomic_nbi(c, 0, 0, "fetch_inc") for _ in range(2)]
        ctx.quiet()
        every = sorted(v for vs in w.comm.allgather([f.value for f in fetched]) for v in vs)
        assert every == list(range(2 * n))  # team rank 0 is world rank n - 1
        w.barrier()
        if r == n - 1:
            assert c.local()[0] == 2 * n
        d = ctx.get_nbi(x, tr, np.empty((4, 8), np.int64))
        ctx.quiet()
        assert d[1][:7].tolist() == [r] * 7 and d[1][7] == 1000 * r + 1
    w.barrier()
    team.destroy()
    for b in (x, sig, c):
        b.close()


def test_a_bad_signal_in_put_is_refused_before_the_data_moves(world: Any) -> None:
    w = world
    x = w.zeros(4, "int64")
    to = _right(w)
    for signal in ((0, 1, "bogus"), (10**6, 1), (-1, 1), (0, 1, np.array(["set"]))):
        with pytest.raises(ArgumentError, match="signal"):
            x.put(to, np.ones(4, np.int64), signal=signal)
    w.barrier()
    assert not x.local().any()  # nothing landed anywhere
    w.barrier()
    x.close()


def test_locks_refuse_misuse_and_stay_usable(world: Any) -> None:
    w = world
    lock = w.zeros(1, "int64")
    for bad in ("x", float("nan"), -1.0):
        with pytest.raises(ArgumentError, match="timeout"):
            lock.set_lock(0, timeout=bad)  # no ticket drawn: the lock is not broken
    with pytest.raises(ShmemStateError, match="does not hold"):
        lock.clear_lock(0)  # nobody holds it: unchanged
    w.barrier()
    for _ in range(3):  # every rank takes it in turn: still fair and usable
        with lock.lock(0, timeout=10.0):
            with pytest.raises(ShmemStateError, match="not recursive"):
                lock.set_lock(0, timeout=1.0)
            assert not lock.try_lock(0)
    w.barrier()
    assert lock.test_lock(0) == 0 or w.world_size > 1  # alone, it is free now
    if lock._locks_held:
        lock.clear_lock(0)
    w.barrier()
    lock.close()


def test_a_clear_lock_whose_quiet_times_out_keeps_the_lock_and_can_be_retried(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    lock = w.zeros(1, "int64")
    w.barrier()
    for turn in range(w.world_size):
        if turn == w.rank:
            lock.set_lock(0, timeout=10.0)

            def stuck(*args: Any, **kwargs: Any) -> None:
                raise RemoteTimeoutError("quiet: a put did not complete (test)", peer=0)

            monkeypatch.setattr(w, "quiet", stuck)
            with pytest.raises(RemoteTimeoutError):
                lock.clear_lock(0)
            monkeypatch.undo()
            assert 0 in lock._locks_held  # still ours: the lock word was not passed on
            lock.clear_lock(0)  # the retry passes it on
            assert not lock._locks_held
        w.barrier()
    if w.world_size == 1:
        assert lock.test_lock(0) == 0
    w.barrier()
    lock.close()


def test_complex_overflow_is_refused_like_float(world: Any) -> None:
    w = world
    c64 = w.zeros(2, "complex64")
    to = _right(w)
    with pytest.raises(ArgumentError, match="overflows complex64"):
        c64.put(to, np.array([1e300 + 0j]))
    with pytest.raises(ArgumentError, match="overflows complex64"):
        c64.put(to, np.array([1.0 + 1e300j]))
    with pytest.raises(ArgumentError, match="overflows"):
        c64.p(to, 0, 1e300)
    c64.put(to, np.array([1.5 + 2j, np.inf + 0j]))  # infinity itself is a value
    w.barrier()
    assert c64.local().tolist() == [1.5 + 2j, complex(np.inf, 0)]
    w.barrier()
    c64.close()


def test_more_objects_of_the_wrong_kind(world: Any) -> None:
    w = world
    x = w.zeros(4, "int64")
    sig = w.zeros(1, "uint64")
    to = _right(w)
    arr = np.zeros(4, np.int64)
    with pytest.raises(ArgumentError, match="World or a Team"):
        collectives.Communicator(None)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"World\.ptr"):
        w.ptr(arr, 0)
    with pytest.raises(ArgumentError, match="signal"):
        x.put_signal(to, arr, arr, 1)
    with pytest.raises(ArgumentError, match="signal op"):
        x.put_signal(to, arr, sig, 1, np.array(["set"]))
    with pytest.raises(ArgumentError, match="comparison"):
        x.wait_until(["eq"], 0, timeout=0.01)
    with pytest.raises(ArgumentError, match="invalid op"):
        x.atomic_nbi(to, 0, ["fetch_add"], 1)
    ctx = w.default_context
    calls: list[Callable[[], object]] = [
        lambda: ctx.put(arr, to, np.ones(4, np.int64)),
        lambda: ctx.put_nbi(arr, to, np.ones(4, np.int64)),
        lambda: ctx.get_nbi(arr, to, np.empty(4, np.int64)),
        lambda: ctx.ibput(arr, to, np.ones(4, np.int64), stride=1),
        lambda: ctx.atomic_nbi(arr, to, 0, "fetch_add", 1),
    ]
    for call in calls:
        with pytest.raises(ArgumentError, match="invalid buffer"):
            call()
    assert not arr.any()  # numpy's own ndarray.put did not run
    w.quiet()
    w.barrier()
    assert not x.local().any()
    w.barrier()
    x.close()
    sig.close()


def test_strided_errors_name_the_call_and_the_argument(world: Any) -> None:
    x = world.zeros(8, "int64")
    to = _right(world)
    with pytest.raises(ArgumentError, match=r"^Context.iput: .*src_stride"):
        x.iput(to, np.arange(4, dtype=np.int64), src_stride=0)
    with pytest.raises(ArgumentError, match=r"^Context.iget: .*dst_stride"):
        x.iget(to, 2, dst=np.empty(8, np.int64), dst_stride=0)
    with pytest.raises(ArgumentError, match=r"^Context.iput: out of bounds"):
        x.iput(to, np.arange(4, dtype=np.int64), stride=3)
    with pytest.raises(ArgumentError, match=r"^SHMEMBuffer.ptr: "):
        world.ptr(x, world.world_size)
    world.barrier()
    x.close()


def test_a_context_of_a_destroyed_team_refuses_work(world: Any) -> None:
    w = world
    team = w.team_world.split_strided(w.world_size - 1, -1, w.world_size)
    x = w.zeros(4, "int64")
    ctx = team.create_ctx()
    ctx.put(x, 0, np.ones(4, np.int64))
    ctx.quiet()
    w.barrier()
    team.destroy()
    with pytest.raises(ShmemStateError, match="destroyed"):
        ctx.put(x, 0, np.ones(4, np.int64))
    with pytest.raises(ShmemStateError, match="destroyed"):
        ctx.put_nbi(x, 0, np.ones(4, np.int64))
    ctx.close()
    w.barrier()
    x.close()


def test_alltoalls_out_too_small_on_one_rank_raises_everywhere_with_check_args() -> None:
    w = shmem.init(heap_nbytes="32MiB", signal_timeout_s=5.0, collectives_check_args=True)
    try:
        if w.world_size < 2:
            pytest.skip("needs two ranks to disagree")
        comm = collectives.Communicator(w)
        p = w.world_size
        out = np.zeros(p - 1 if w.rank == 0 else p, np.float32)
        with pytest.raises((ArgumentError, shmem.errors.CollectiveMismatchError)):
            comm.alltoalls(np.ones(p, np.float32), 1, out=out)
        comm.close()
    finally:
        w.finalize()


def test_finalize_completes_every_open_context() -> None:
    """Operations still outstanding on a user context land before the heap goes (finalize
    completed the default context only)."""
    w = shmem.init(heap_nbytes="8MiB", signal_timeout_s=10.0)
    x = w.zeros(1024, "int64")
    ctx = w.create_context()
    ctx.put_nbi(x, _right(w), np.ones(1024, np.int64))
    w.finalize()
    assert "pending=0" in repr(ctx), repr(ctx)
