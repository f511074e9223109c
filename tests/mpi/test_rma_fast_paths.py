"""The RMA path's per-call shortcuts (issue 19): ``SHMEMBuffer.put`` straight to
``MPI_Put`` + ``MPI_Win_flush`` and signals straight to ``MPI_Rget_accumulate`` for a rank off
this node (in C where ``shmem._rmafast`` is built, else through mpi4py), blocking atomics with
reused origin/result arrays. Every shortcut must move the same data and refuse the same bad
input as the general path, and stop at ``close()``/``finalize()``. The put and signal tests
run on both the C path and the pure-Python one."""

from __future__ import annotations

import itertools
import os
import shutil
import sysconfig
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import shmem
from shmem.backends import rma_accel
from shmem.errors import ArgumentError, RemoteTimeoutError, ShmemStateError

pytestmark = pytest.mark.mpi


def _init(path: str) -> Any:
    w = shmem.init(heap_nbytes="4MiB")
    if path == "python":  # the fallback a build without the C extension takes
        w.heap.rma_putter = lambda nbytes, dtype: None  # type: ignore[method-assign]
        w.signals._fast = w.signals._fast_raw = w.signals._fast_barrier = w.signals._spin = None
    return w


def _c_built() -> bool:
    return rma_accel.status().startswith("C:")


@pytest.fixture(params=["c", "python"])
def world(request: pytest.FixtureRequest) -> Iterator[Any]:
    w = _init(request.param)
    try:
        yield w
    finally:
        w.finalize()


def _right(w: Any) -> int:
    return int((w.rank + 1) % w.world_size)


def _check_path(w: Any, buf: Any, to: int) -> None:
    """Off the node the put shortcut is armed for ``to``: in C unless the test disabled it."""
    if w.heap.is_local(to):
        assert buf._fast is None and not buf._remote
        return
    assert to in buf._remote
    if _c_built() and "rma_putter" not in vars(w.heap):
        assert buf._fast is not None and to in buf._putter.enabled()
    else:
        assert buf._fast is None


def test_the_c_put_is_built_where_it_can_be() -> None:
    """The editable install builds shmem._rmafast when a C compiler and Python's headers are
    there (CI has both): a silent fall back to the pure-Python put would go unnoticed."""
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not headers or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler or Python headers: the pure-Python put is expected")
    assert _c_built(), rma_accel.status()


def test_put_shortcut_moves_what_the_general_path_moves(world: Any) -> None:
    w = world
    to = _right(w)
    buf = w.zeros(64, "int64")
    src = np.arange(64, dtype=np.int64) + 1000 * w.rank
    buf.put(to, src[:8])  # first put fills the cache; the rest take the shortcut if off-node
    _check_path(w, buf, to)
    buf.put(to, src[8:16], offset=8 * 8)
    buf.put(to, src[16:64:2], offset=16 * 8)  # a strided 1-D source: BufferError -> copied
    buf.put(to, src[40:48].reshape(2, 4), offset=40 * 8)  # 2-D: the general path
    buf.put(to, src[48:56].astype(np.int32), offset=48 * 8)  # another dtype: cast
    ro = src[56:60].copy()
    ro.flags.writeable = False
    buf.put(to, ro, offset=56 * 8)  # a read-only source is fine
    buf.put(to, src[60:62].astype(">i8"), offset=60 * 8)  # big-endian: cast, not raw bytes
    buf.put(np.int64(to), src[62:63], offset=62 * 8)  # a numpy integer rank
    buf.put(to, src[63:64].view(np.ndarray), offset=np.int64(63 * 8))  # numpy offset
    buf.put(to, src[:0], offset=64 * 8)  # nothing, at the very end
    w.barrier()
    frm = (w.rank - 1) % w.world_size
    want = np.zeros(64, np.int64)
    want[:16] = np.arange(16) + 1000 * frm
    want[16:40] = (np.arange(64) + 1000 * frm)[16:64:2]
    want[40:64] = np.arange(40, 64) + 1000 * frm
    np.testing.assert_array_equal(buf.local(), want)
    w.barrier()
    buf.close()


def test_put_shortcut_takes_every_builtin_dtype_and_subclasses(world: Any) -> None:
    w = world
    to = _right(w)
    frm = (w.rank - 1) % w.world_size
    for name in ("bool", "uint8", "int16", "float16", "float32", "complex128", "bfloat16"):
        buf = w.zeros(16, name)
        src = (np.arange(16) % 2 + w.rank).astype(buf.dtype)
        buf.put(to, src[:1])
        buf.put(to, src[1:], offset=buf.dtype.itemsize)  # the shortcut for builtin dtypes
        sub = np.ma.MaskedArray(src[3:5])  # an ndarray subclass: the general path
        buf.put(to, sub, offset=3 * buf.dtype.itemsize)
        w.barrier()
        want = (np.arange(16) % 2 + frm).astype(buf.dtype)
        np.testing.assert_array_equal(buf.local(), want, err_msg=name)
        w.barrier()
        buf.close()


@pytest.mark.parametrize(
    ("rank", "offset", "n", "match"),
    [
        (True, 0, 1, "rank"),
        (-1, 0, 1, "rank"),
        (None, 0, 1, "rank"),
        (1 << 70, 0, 1, "rank"),
        ("right", 4, 1, "offset"),  # not a multiple of the item size
        ("right", -8, 1, "offset"),
        ("right", 8 * 60, 8, "out of bounds"),
        ("right", 8 * 65, 0, "out of bounds"),
        ("right", 1 << 70, 1, "offset"),
        ("right", 8.0, 1, "offset"),
    ],
)
def test_put_shortcut_refuses_what_the_general_path_refuses(
    world: Any, rank: Any, offset: Any, n: int, match: str
) -> None:
    w = world
    buf = w.zeros(64, "int64")
    to = _right(w)
    buf.put(to, np.zeros(1, np.int64))  # the shortcut is armed for this rank
    target = to if rank == "right" else rank
    with pytest.raises(ArgumentError, match=match):
        buf.put(target, np.ones(n, np.int64), offset=offset)
    w.barrier()
    assert not buf.local().any()  # nothing landed anywhere
    w.barrier()
    buf.close()


@pytest.mark.parametrize("path", ["c", "python"])
def test_put_shortcut_ends_at_close_and_finalize(path: str) -> None:
    w = _init(path)
    buf = w.zeros(8, "float64")
    keep = w.zeros(8, "float64")
    to = _right(w)
    buf.put(to, np.ones(8))
    keep.put(to, np.ones(8))
    putter = keep._putter
    buf.close()
    assert not buf._remote and buf._fast is None
    with pytest.raises(ShmemStateError):
        buf.put(to, np.ones(8))
    w.finalize()
    assert not keep._remote and keep._fast is None and keep._putter is None
    if putter is not None:
        assert putter.enabled() == []  # nothing left pointing at the freed window
    with pytest.raises(ShmemStateError):
        keep.put(to, np.ones(8))


def test_signals_land_on_both_paths(world: Any) -> None:
    """Set and add, the words' extremes, many writers: the same result through C and Python
    (slots are unsigned 64-bit words: a negative value is its two's complement)."""
    w = world
    to, frm = _right(w), (w.rank - 1) % w.world_size
    pad = w.signals
    off_node = [r for r in range(w.world_size) if not w.heap.is_local(r)]
    if pad._fast is not None:
        assert off_node and _c_built()
    elif off_node and _c_built():
        assert "rma_putter" in vars(w.heap)  # only where the test turned it off
    w.barrier()
    w.signal(to, 0, -(1 << 63))
    w.signal(to, 1, (1 << 63) - 1)
    w.signal(to, 4, (1 << 64) - 1)  # beyond int64: the C path hands it to Python
    w.signal(to, 2, 7 + w.rank, shmem.SignalOp.SET)  # an enum member is a str too
    for r in range(w.world_size):
        w.signal(r, 3, w.rank + 1, "add")  # every rank adds into every rank's slot
    w.barrier()
    assert w.wait_until(0, "eq", -(1 << 63)) == 1 << 63  # read back unsigned
    assert w.wait_until(1, "eq", (1 << 63) - 1) == (1 << 63) - 1
    assert w.wait_until(4, "gt", 1 << 63) == (1 << 64) - 1
    assert w.signals.read(2) == 7 + frm  # from the left neighbour
    assert w.wait_until(3, "eq", w.world_size * (w.world_size + 1) // 2)
    w.barrier()


@pytest.mark.parametrize(
    ("rank", "slot", "value", "op", "match"),
    [
        (True, 0, 1, "set", "rank"),
        ("right", False, 1, "set", "slot"),
        (-1, 0, 1, "set", "rank"),
        (1 << 70, 0, 1, "set", "rank"),
        ("right", -1, 1, "set", "slot"),
        ("right", "slots", 1, "set", "slot"),  # the first barrier slot is not the user's
        ("right", 0, 1 << 64, "set", "value"),
        ("right", 0, 1.5, "set", "value"),
        ("right", 0, 1, "xor", "op"),
        ("right", 0, 1, b"set", "op"),
    ],
)
def test_signal_refuses_bad_arguments_on_both_paths(
    world: Any, rank: Any, slot: Any, value: Any, op: Any, match: str
) -> None:
    w = world
    target = _right(w) if rank == "right" else rank
    slot = w.signals.slots if slot == "slots" else slot
    before = [w.signals.read(s) for s in range(w.signals.slots)]
    with pytest.raises(ArgumentError, match=match):
        w.signal(target, slot, value, op)
    w.barrier()
    assert [w.signals.read(s) for s in range(w.signals.slots)] == before
    w.barrier()
    w.barrier()  # the barrier slots still work


def test_a_signal_in_flight_completes_when_the_target_progresses(world: Any) -> None:
    """On a window MPI serves through the target's progress engine (``Win.Create``) the C
    signal usually cannot complete at once: it returns True once MPI started it, and stays
    the process's signal in flight (``pending()``) until the target calls MPI. The next signal
    sends nothing while that one is in flight: it hands back its Pending (Test, Wait, rank)
    for the caller to complete first. Each value lands once."""
    w = world
    if w.world_size < 2 or not _c_built():
        pytest.skip("needs two ranks and the C extension")
    mod = rma_accel._bound()
    w.heap.complete_signals()  # nothing of an earlier test still in flight
    comm = w.comm
    mem = np.zeros(4, np.int64)
    win = MPI.Win.Create(mem, 1, comm=comm)
    win.Lock_all(MPI.MODE_NOCHECK)
    sig = rma_accel.signaller(win, [0] * w.world_size, 4)
    failure: BaseException | None = None  # raised after the collective steps (no hang)
    blocked: list[Any] = []
    comm.Barrier()
    if w.rank == 0:
        time.sleep(0.1)  # rank 1 asleep first: still in the Barrier, it would progress them
        try:
            assert sig.signal(1, 2, -5, "set") is True  # sent (in flight or applied)
            first = mod.pending()
            assert first is None or (isinstance(first, mod.Pending) and first.rank == 1)
            got = sig.signal(1, 3, 4, "add")
            if got is not True:  # the first is still in flight: nothing sent
                assert got is first and first is not None and first.Test() is False
                blocked.append(got)
        except BaseException as exc:
            failure = exc
    elif w.rank == 1:
        time.sleep(0.4)  # no MPI call: no progress (the signals wait for it, or not)
    comm.Barrier()  # rank 1 progresses here
    if w.rank == 0 and failure is None:
        try:
            for p in blocked:
                p.Wait()
                assert p.Test() is True and sig.signal(1, 3, 4, "add") is True
            last = mod.pending()
            if last is not None:
                last.Wait()
            assert mod.pending() is None
        except BaseException as exc:
            failure = exc
    comm.Barrier()
    win.Sync()
    got_mem = mem.tolist()
    sig.clear()
    win.Unlock_all()
    win.Free()
    if failure is not None:
        raise failure
    if w.rank == 1:
        assert got_mem == [0, 0, -5, 4]
    assert sig.enabled() == [] and sig.signal(1, 2, 1, "set") is False


def test_a_signal_that_cannot_allocate_sends_nothing(world: Any) -> None:
    """The C signal makes what it needs before calling MPI: out of memory it raises
    MemoryError with nothing sent (an "add" retried after it must not count twice)."""
    w = world
    testcapi = pytest.importorskip("_testcapi")
    to, frm = _right(w), (w.rank - 1) % w.world_size
    pad = w.signals
    sig = w.heap.rma_signaller(pad.offset, pad.slots)  # a fresh one: nothing made yet
    sends = sig is not None and not w.heap.is_local(to)
    w.barrier()
    w.heap.complete_signals()  # (a signal in flight would be handed back before allocating)
    if sends:
        send, stop = sig.signal, testcapi.remove_mem_hooks  # (bound now: no allocation later)
        failed = False
        testcapi.set_nomemory(0, 1)  # the next allocation fails
        try:
            send(to, 4, 1, "add")
        except MemoryError:
            failed = True
        finally:
            stop()
        assert failed
        assert sig.signal(to, 4, 1, "add") is True  # then it works
    w.barrier()
    if sig is not None and not w.heap.is_local(frm):  # frm sent to me through C
        assert pad.read(4) == 1, "the failed add was applied, or the second one lost"
    w.barrier()


def test_an_operation_past_its_deadline_raises_and_completes_later(world: Any) -> None:
    """heap.wait_started (the C signal's slow path, and the atomics'): RemoteTimeoutError
    naming the peer at the deadline; the request is kept and completed by progress()."""
    w = world

    class Late:
        def __init__(self) -> None:
            self.tests = 0
            self.ready = False

        def Test(self) -> bool:
            self.tests += 1
            return self.ready

        def Wait(self) -> None:
            self.ready = True

    late = Late()
    t0 = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match=r"signal: rank \d+: the operation on rank 0"):
        w.heap.wait_started(late, 0, "signal", 0.05)
    assert 0.05 <= time.monotonic() - t0 < 5 and late.tests > 1
    assert late in w.heap._pending
    late.ready = True
    if w.heap._rma_win is not None:
        w.heap.progress()  # tests and drops what completed
        assert late not in w.heap._pending
    else:
        w.heap._pending.remove(late)  # one node: no RMA window, nothing polls it


def test_pooled_atomics_and_signals_return_each_old_value(world: Any) -> None:
    """Blocking atomics reuse their arrays: every call must still return its own old
    value, for each dtype, interleaved."""
    w = world
    counters = w.zeros(2, "int64")
    words = w.zeros(1, "uint64")
    w.barrier()
    seen = [counters.atomic_fetch_add(0, 0, 1) for _ in range(50)]
    big = [words.atomic_fetch_add(0, 0, 1 << 62) for _ in range(2)]
    w.barrier()
    # each rank's 50 fetches saw strictly increasing values (other ranks interleave)
    assert all(b > a for a, b in itertools.pairwise(seen))
    assert all(0 <= v < (1 << 64) for v in big)
    if w.rank == 0:
        assert counters.g(0, 0) == 50 * w.world_size
    w.barrier()
    for k in range(1, 20):  # signals through the pooled path, checked by the receiver
        w.signal(_right(w), 0, k)
        w.wait_until(0, "ge", k)
    w.barrier()
    counters.close()
    words.close()


def test_spin_compares_unsigned_words_and_gives_up() -> None:
    """``shmem._rmafast.spin``: the word once it compares (unsigned, each comparison), None
    after its loads; a bad address or comparison is refused."""
    if not _c_built():
        pytest.skip("needs the C extension")
    spin = rma_accel._bound().spin
    word = np.array([(1 << 63) + 5], np.uint64)
    at = int(word.ctypes.data)
    big = (1 << 63) + 5
    assert spin(at, 0, big, 1, 0) == big  # eq
    assert spin(at, 1, big, 3, 0) is None  # ne
    assert spin(at, 2, 1 << 63, 1, 0) == big  # gt: unsigned (as int64 it is negative)
    assert spin(at, 3, big + 1, 5, 0) is None  # ge
    assert spin(at, 4, 5, 2, 0) is None  # lt
    assert spin(at, 5, big, 0, 0) == big  # le: no loop, the final load
    with pytest.raises(ValueError, match="spin"):
        spin(at + 4, 0, 0, 1, 0)  # not aligned
    with pytest.raises(ValueError, match="spin"):
        spin(at, 6, 0, 1, 0)


def test_the_next_operation_completes_a_signal_in_flight(world: Any) -> None:
    """A signal off the node returns once MPI started it; the process's next operation
    through MPI completes it first. Rank 0 signals rank 1, which sleeps (no progress: the
    signal stays in flight), then puts to rank 2: the put waits for rank 1 to wake, and
    nothing is left in flight after it."""
    w = world
    nodes = w.comm.allgather(w.node)  # the same answer on every rank: all skip or none
    if w.world_size < 3 or len(set(nodes[:3])) < 3:
        pytest.skip("needs ranks 0, 1 and 2 on three nodes")
    buf = w.zeros(8, np.int64)
    pad = w.signals
    w.barrier()
    if w.rank == 0:
        time.sleep(0.1)  # rank 1 asleep first: still in the barrier, it would progress it
        w.signal(1, 5, 11)
        pending = rma_accel.pending()
        in_flight = pending is not None and pending() is not None
        t0 = time.monotonic()
        buf.put(2, np.arange(8, dtype=np.int64))
        took = time.monotonic() - t0
        if in_flight:  # (almost always: rank 1 is asleep)
            assert took > 0.1, f"the put did not wait for the signal in flight ({took:.3f} s)"
            assert pending is not None and pending() is None
    elif w.rank == 1:
        time.sleep(0.5)  # no MPI call here meanwhile
    w.barrier()
    if w.rank == 1:
        assert pad.read(5) == 11
    if w.rank == 2:
        assert buf.local().tolist() == list(range(8))
    w.barrier()


def test_the_barrier_in_c_waits_for_a_late_rank(world: Any) -> None:
    """The barrier's rounds in C hand a wait back to Python once their loads run out: a rank
    that arrives late is still waited for (every rank leaves after the late one entered),
    and barriers after it keep their epochs."""
    w = world
    comm = w.comm
    late = w.world_size - 1
    comm.Barrier()
    if w.rank == late:
        time.sleep(0.2)
    t0 = time.monotonic()
    w.barrier()
    waited = time.monotonic() - t0
    arrivals = comm.allgather(waited)
    if w.world_size > 1:
        # every rank but the late one waited for it (about 0.2 s)
        assert all(a > 0.15 for r, a in enumerate(arrivals) if r != late), arrivals
    for _ in range(50):
        w.barrier()
