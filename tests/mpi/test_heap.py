"""The symmetric heap and SHMEMBuffer across ranks: views, put/get, atomics, dtypes, errors."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shmem
from shmem import SUPPORTED_DTYPES, World
from shmem.errors import CollectiveMismatchError, HeapExhaustedError, ShmemError

pytestmark = pytest.mark.mpi


def test_same_offset_on_every_rank(world: World) -> None:
    bufs = [world.empty((n,), "float32") for n in (1, 100, 4097)]
    offsets = world.comm.allgather([b.offset for b in bufs])
    assert all(o == offsets[0] for o in offsets)
    for b in bufs:
        b.close()


def test_peer_views_see_peer_writes(world: World) -> None:
    with world.zeros((8, 3), "int64") as x:
        x.local()[...] = world.rank * 100 + np.arange(24).reshape(8, 3)
        world.barrier()
        for r in range(world.world_size):
            view = x.peer(r)
            if world.heap.is_local(r):
                assert view is not None
                np.testing.assert_array_equal(view, r * 100 + np.arange(24).reshape(8, 3))
            else:
                assert view is None
        assert x.peer(world.rank) is not None
        world.barrier()
        # a store through a peer view lands in the peer's local copy
        right = (world.rank + 1) % world.world_size
        pv = x.peer(right)
        if pv is not None:
            pv[0, 0] = -world.rank - 1
        world.barrier()
        left = (world.rank - 1) % world.world_size
        if x.peer(left) is not None:  # reachability is symmetric: left could write to me
            assert x.local()[0, 0] == -left - 1
        world.barrier()


def test_put_get_across_ranks(world: World) -> None:
    n = world.world_size
    with world.zeros((n, 5), "float64") as x:
        row = np.full(5, world.rank + 0.5)
        for r in range(n):  # every rank writes its row into every rank's copy
            x.put(r, row, offset=world.rank * 5 * 8)
        world.barrier()
        expected = np.repeat(np.arange(n) + 0.5, 5).reshape(n, 5)
        np.testing.assert_array_equal(x.local(), expected)
        for r in range(n):
            np.testing.assert_array_equal(x.get(r), expected)
            dst = np.empty(2, np.float64)
            assert x.get(r, dst, offset=(n * 5 - 2) * 8) is dst
            np.testing.assert_array_equal(dst, expected.reshape(-1)[-2:])
            np.testing.assert_array_equal(
                x.get(r, offset=8 * 5 * (n - 1)).reshape(-1), expected[-1]
            )
        world.barrier()


def test_put_with_signal_orders_data(world: World) -> None:
    right = (world.rank + 1) % world.world_size
    left = (world.rank - 1) % world.world_size
    with world.zeros(1000, "int32") as x:
        x.put(right, np.arange(1000) + world.rank, signal=(3, 1))
        world.wait_until(3, "ge", 1)
        np.testing.assert_array_equal(x.local(), np.arange(1000) + left)
        world.barrier()


@pytest.mark.parametrize("kind", ["processor", "mpi"])
def test_atomics_across_ranks(world: World, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both one-node atomic kinds (the processor's, and MPI's shared window where libatomic
    is missing); multi-node jobs always use MPI's."""
    if kind == "mpi":
        monkeypatch.setattr(world.heap, "_cpu", None)
    elif getattr(world.heap, "_cpu", None) is None and world.num_nodes == 1:
        pytest.skip("libatomic is not installed")
    n = world.world_size
    with world.zeros(4, "int64") as c, world.zeros(1, "uint32") as lock:
        for r in range(n):
            c.atomic_fetch_add(r, 1, world.rank + 1)
        world.barrier()
        assert c.local()[1] == n * (n + 1) // 2
        # fetch-add hands out distinct tickets
        ticket = c.atomic_fetch_add(0, 2, 1)
        tickets = world.comm.allgather(ticket)
        assert sorted(tickets) == list(range(n))
        # compare-swap elects exactly one winner
        old = lock.atomic_compare_swap(0, 0, 0, world.rank + 1)
        winners = world.comm.allgather(old == 0)
        assert sum(winners) == 1
        world.barrier()
        assert int(lock.get(0)[0]) == winners.index(True) + 1
        assert c.atomic_swap(world.rank, 3, 7) == 0
        assert c.local()[3] == 7
        world.barrier()


def test_atomics_reject_non_integer(world: World) -> None:
    with world.zeros(2, "float32") as x, pytest.raises(TypeError, match="atomics need an integer"):
        x.atomic_fetch_add(0, 0, 1)
    with world.zeros(2, "int32") as y, pytest.raises(ValueError, match="index out of range"):
        y.atomic_fetch_add(0, 2, 1)


@pytest.mark.parametrize("name", sorted(SUPPORTED_DTYPES))
def test_every_dtype_roundtrips(world: World, name: str) -> None:
    dt = SUPPORTED_DTYPES[name]
    values = np.arange(7).astype(np.float32) % 2 if name == "bool" else np.arange(7) % 5
    src = np.asarray(values).astype(dt)
    with world.zeros((7,), name) as x:
        assert (x.dtype, x.shape, x.nbytes, len(x), x.count) == (dt, (7,), 7 * dt.itemsize, 7, 7)
        x.put((world.rank + 1) % world.world_size, src)
        world.barrier()
        assert x.local().dtype == dt
        np.testing.assert_array_equal(x.local(), src)
        back = np.zeros(7, dt)
        x.enqueue_copy_to(back)  # stream-ordered on world.ctx
        world.ctx.synchronize()
        np.testing.assert_array_equal(back, src)
        x.enqueue_copy_from(np.zeros(7, dt))
        world.ctx.synchronize()
        assert not x.local().any()
        world.barrier()


def test_dlpack_roundtrip(world: World) -> None:
    with world.zeros((3, 4), "float32") as x:
        x.local()[...] = np.arange(12).reshape(3, 4)
        y = np.from_dlpack(x)
        assert y.shape == (3, 4)
        y[1, 1] = 42  # zero-copy: the heap sees it
        assert x.local()[1, 1] == 42
        assert x.__dlpack_device__() == (1, 0)
        assert y.ctypes.data == x.unsafe_ptr()
    # one producer for every buffer kind: bfloat16 exports like Buffer's (torch, jax and cupy
    # take it); numpy has no DLPack bfloat16 and refuses it itself; np.asarray works
    with world.zeros(4, "bfloat16") as b:
        a = np.asarray(b)
        assert a.dtype == b.dtype and a.ctypes.data == b.unsafe_ptr()
        with pytest.raises((BufferError, RuntimeError), match="Unsupported dtype"):
            np.from_dlpack(b)


def test_mismatched_alloc_raises_on_every_rank(world: World) -> None:
    if world.world_size == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(CollectiveMismatchError, match=r"ranks called different") as err:
        world.empty(10 + world.rank, "float32")
    texts = [line.text for line in err.value.calls]
    assert texts == [
        f"World.empty(shape=({10 + r},), dtype=float32): {4 * (10 + r)} bytes"
        for r in range(world.world_size)
    ]
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 in its call [0-9]+: World.empty"):
        world.empty(10, "float32" if world.rank == 0 else "int32")
    # the heap is unchanged and still symmetric
    with world.empty(10) as ok:
        assert len(set(world.comm.allgather(ok.offset))) == 1


def test_bad_arguments_on_one_rank_raise_everywhere(world: World) -> None:
    shape: Any = (-1,) if world.rank == 0 else (4,)
    with pytest.raises((ValueError, CollectiveMismatchError), match="invalid"):
        world.empty(shape, "float32")
    with pytest.raises(TypeError, match="unsupported dtype"):
        world.empty(4, "clongdouble")


def test_exhaustion_and_recovery(world: World) -> None:
    free = world.heap_stats().largest_free
    with pytest.raises(HeapExhaustedError, match=r"largest free block \d+ bytes") as info:
        world.empty(free + 1, "uint8")
    assert info.value.largest_free == free
    big = world.empty(free // 2, "uint8")  # still usable
    with pytest.raises(HeapExhaustedError):
        world.empty(free // 2 + 4096, "uint8")
    big.close()
    assert world.heap_stats().largest_free == free


def test_buffer_argument_errors(world: World) -> None:
    with world.zeros(4, "int32") as x:
        with pytest.raises(ValueError, match=r"SHMEMBuffer.put: invalid rank"):
            x.put(world.world_size, np.zeros(4, np.int32))
        with pytest.raises(ValueError, match="out of bounds"):
            x.put(0, np.zeros(5, np.int32))
        with pytest.raises(ValueError, match="multiple of the item size"):
            x.put(0, np.zeros(1, np.int32), offset=2)
        with pytest.raises(TypeError, match="cannot cast"):
            x.put(0, np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="invalid dst"):
            x.get(0, np.zeros(4, np.int64))
        with pytest.raises(ValueError, match="invalid signal"):
            x.put(0, np.zeros(4, np.int32), signal=(1,))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="wrong element count"):
            x.enqueue_copy_from(np.zeros(3, np.int32))
        assert isinstance(x.peer(0) if world.heap.is_local(0) else x.local(), np.ndarray)
        world.barrier()


def test_close_is_collective_and_del_only_warns(world: World) -> None:
    before = world.heap_stats()
    x = world.empty(100, "float32")
    x.close()
    x.close()  # a no-op
    assert world.heap_stats() == before
    y = world.empty(100, "float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del y
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert world.heap_stats().num_allocated == before.num_allocated + 1  # never freed by GC
    assert issubclass(HeapExhaustedError, ShmemError)


@pytest.mark.parametrize("name", list(shmem.SUPPORTED_DTYPES))
def test_shmem_buffer_vocabulary_and_dlpack_every_dtype(world: World, name: str) -> None:
    """The same accessors and the same DLPack producer as Buffer and the IPC buffers
    (tests/processes/test_buffer_kinds.py)."""
    dtype = shmem.SUPPORTED_DTYPES[name]
    with world.zeros((3, 4), name) as x:
        x.local()[...] = (np.arange(12) % 5).astype(np.float32).astype(dtype).reshape(3, 4)
        assert (x.shape, x.dtype, x.ndim, x.count, len(x)) == ((3, 4), dtype, 2, 12, 3)
        assert x.nbytes == 12 * dtype.itemsize
        host = x.to_numpy()
        assert host.ctypes.data == x.unsafe_ptr()
        assert np.asarray(x).ctypes.data == x.unsafe_ptr()
        if name == "longdouble":  # DLPack has no long double
            with pytest.raises(shmem.DLPackDTypeError, match="unsupported dtype"):
                shmem.Buffer.from_dlpack(x)
            return
        back = shmem.Buffer.from_dlpack(x)
        assert back.dtype == dtype and back.to_numpy().ctypes.data == x.unsafe_ptr()
        if name not in ("bfloat16", "float8_e4m3", "float8_e5m2"):
            assert np.from_dlpack(x).ctypes.data == x.unsafe_ptr()
        buf = x.as_buffer()
        assert isinstance(buf, shmem.Buffer) and buf.to_numpy().tobytes() == host.tobytes()


def test_put_refuses_lossy_casts_unless_asked(world: World) -> None:
    """Issue 14, bug 2: an int64 2**40 put into int32 used to land as 0 (a same-kind cast)."""
    right = (world.rank + 1) % world.world_size
    with world.zeros(4, "int32") as x, world.zeros(2, "float32") as f:
        world.barrier()
        with pytest.raises(ShmemError, match=r"put: value 1099511627776 does not fit int32"):
            x.put(right, np.array([1, 2, 3, 2**40], np.int64))
        with pytest.raises(ValueError, match="casting='unsafe'"):
            x.put(right, np.array([-(2**31) - 1, 0, 0, 0], np.int64))
        with pytest.raises(ShmemError, match=r"put: value 1e\+39 overflows float32"):
            f.put(right, np.array([1.0, 1e39]))
        world.barrier()
        x.put(right, np.array([1, 2, 3, 2**31 - 1], np.int64))  # in range: fine
        f.put(right, np.array([0.1, -2.5]))  # float rounding is not a loss
        world.barrier()
        assert x.local().tolist() == [1, 2, 3, 2**31 - 1]
        assert f.local().tolist() == [np.float32(0.1), -2.5]
        world.barrier()
        x.put(right, np.array([0, 0, 0, 2**40 + 7], np.int64), casting="unsafe")  # C wraps
        world.barrier()
        assert x.local()[3] == 7
        world.barrier()


def test_bad_operands_raise_the_documented_error_on_every_path(world: World) -> None:
    """Issue 14, bug 3: out-of-range atomic operands and signal values used to raise bare
    numpy OverflowError/ValueError (differently on the shared and RMA paths)."""
    right = (world.rank + 1) % world.world_size
    with world.zeros(2, "int32") as x, world.zeros(2, "uint32") as u:
        cases: list[tuple[Callable[[], object], str]] = [
            (lambda: x.atomic_fetch_add(right, 0, 2**40), r"atomic_fetch_add: value out of"),
            (lambda: x.atomic_swap(right, 0, -(2**40)), r"atomic_swap: value out of range"),
            (lambda: x.atomic_compare_swap(right, 0, 2**33, 1), r"compare out of range"),
            (lambda: x.atomic_fetch_add(right, 0, "1"), r"invalid value \(got '1' of type str"),  # type: ignore[arg-type]
            (lambda: u.atomic_swap(right, 0, -1), r"value out of range \(got -1; expected 0"),
            (lambda: world.signal(right, 0, 2**70), r"signal: value out of range"),
            (lambda: world.signal(right, 0, 1.5), r"signal: invalid value \(got 1.5"),  # type: ignore[arg-type]
            (lambda: world.wait_until(0, "ge", 2**70), r"wait_until: value out of range"),
            (lambda: x.put(right, np.zeros(2, np.int32), signal=(0, 2**64)), r"signal value"),
        ]
        for call, match in cases:
            with pytest.raises(shmem.errors.ArgumentError, match=match):
                call()
        world.barrier()
        # unsigned counters decrement by wrapping, as C does
        u.atomic_fetch_add(right, 1, 5)
        world.barrier()
        assert u.atomic_fetch_add(world.rank, 1, -1) == 5  # my own copy: 5 -> 4
        assert u.atomic_fetch_add(world.rank, 0, -1) == 0  # 0 -> 2**32 - 1
        assert u.local().tolist() == [2**32 - 1, 4]
        world.barrier()


@pytest.mark.parametrize("nbytes", [1 << 20, (1 << 20) + 16, (1 << 20) + 4000])
@pytest.mark.parametrize("alignment", [64, 256, 4096])
def test_every_buffer_is_aligned_as_documented(nbytes: int, alignment: int) -> None:
    """Issue 14, bug 1: the slab base was 16-byte aligned with one rank on a node, and rank
    k's slab was off by ``k * nbytes mod alignment`` when nbytes was not a multiple of it."""
    from tests.conftest import CI_CONFIG

    world = shmem.init(CI_CONFIG, heap_nbytes=nbytes, heap_alignment=alignment)
    try:
        bufs = [world.empty((4,), "float64"), world.empty(3, "int8"), world.zeros(5, "int32")]
        # agree first, so a misaligned rank fails the test on every rank instead of leaving
        # the others in the collectives below
        misaligned = world.comm.allgather([b.unsafe_ptr() % alignment for b in bufs])
        assert all(m == [0, 0, 0] for m in misaligned), misaligned
        # atomics and one-sided access still reach the same bytes on every path
        right = (world.rank + 1) % world.world_size
        counter = bufs[2]
        world.barrier()
        counter.atomic_fetch_add(right, 4, 1)
        bufs[0].put(right, np.arange(4, dtype=np.float64) + world.rank)
        world.barrier()
        left = (world.rank - 1) % world.world_size
        assert counter.local()[4] == 1 and counter.local()[:4].tolist() == [0, 0, 0, 0]
        assert bufs[0].local().tolist() == (np.arange(4) + left).tolist()
        assert counter.get(right)[4] == 1
        for b in reversed(bufs):
            b.close()
    finally:
        world.finalize()


@pytest.mark.parametrize("alignment", [8, 64, 1024, 4096])
def test_aligned_allocations_sit_at_the_same_aligned_offset_everywhere(
    world: World, alignment: int
) -> None:
    """``shmem_align``: the address of every rank's copy is a multiple of ``alignment``, on
    every path (the host slab starts on a page), and offsets agree."""
    assert world.heap.max_alignment >= 4096
    with world.zeros(3, "uint8") as pad, world.zeros(100, "float64", alignment=alignment) as x:
        assert pad.offset == 0 or pad.offset % 64 == 0
        assert x.unsafe_ptr() % alignment == 0
        assert len(set(world.comm.allgather((x.offset, x.unsafe_ptr() % alignment)))) == 1
        right = (world.rank + 1) % world.world_size
        x.put(right, np.full(100, world.rank, np.float64))
        world.barrier()
        assert (x.local() == (world.rank - 1) % world.world_size).all()
        world.barrier()


def test_alignment_errors_and_mismatches_raise_on_every_rank(world: World) -> None:
    top = world.heap.max_alignment
    for bad in (0, 3, 48, top * 2, -8, 2.0, True):
        with pytest.raises(
            ValueError, match=r"World.empty: invalid alignment \(got .*power of two"
        ):
            world.empty(4, "int64", alignment=bad)  # type: ignore[arg-type]
    if world.world_size > 1:
        with pytest.raises(CollectiveMismatchError, match=r"(?s)alignment=1024.*alignment=2048"):
            world.empty(4, "int64", alignment=1024 if world.rank == 0 else 2048)
    with world.empty(4, "int64", alignment=2048) as ok:  # the heap is still symmetric
        assert len(set(world.comm.allgather(ok.offset))) == 1
