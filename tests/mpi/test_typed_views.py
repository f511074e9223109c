"""Typed views of a symmetric allocation (``buf.view(dtype)``, ``buf[a:b]``; issue 29): every
routine works on them as on the allocation itself, at 1-4 ranks, on one node and on the RMA
path; their lifetime is the allocation's."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from shmem import SHMEMBuffer, World
from shmem.errors import ArgumentError, ShmemStateError

pytestmark = pytest.mark.mpi


def _ring(world: World) -> tuple[int, int]:
    return (world.rank + 1) % world.world_size, (world.rank - 1) % world.world_size


def test_views_share_the_allocations_bytes(world: World) -> None:
    with world.zeros(256, "uint8") as raw:
        words = raw.view("int64")
        assert isinstance(words, SHMEMBuffer) and words.shape == (32,) and words.nbytes == 256
        assert words.offset == raw.offset and words.unsafe_ptr() == raw.unsafe_ptr()
        tail = words[24:]
        assert tail.shape == (8,) and tail.offset == raw.offset + 192
        assert words[-1].shape == () and words[-1].offset == raw.offset + 248
        grid = raw.view("float32")[:48]
        rows = SHMEMBuffer.view(grid, "float64")  # 48 float32 -> 24 float64
        assert rows.shape == (24,)
        right, left = _ring(world)
        tail.put(right, np.arange(8, dtype=np.int64) + 100 * world.rank)
        world.barrier()
        got = raw.local()[192:].view(np.int64)
        np.testing.assert_array_equal(got, np.arange(8) + 100 * left)
        np.testing.assert_array_equal(tail.get(right), np.arange(8) + 100 * world.rank)
        world.barrier()


def test_atomics_waits_and_tests_on_a_view(world: World) -> None:
    right, _ = _ring(world)
    with world.zeros(4096, "uint8") as raw:
        counters = raw[1024:2048].view("int64")  # 128 int64 in the middle of the bytes
        for _ in range(5):
            counters.atomic_fetch_add(right, 3, 1)
        counters.atomic_add(right, 4, 7)
        counters.atomic_inc(right, 5)
        assert counters.atomic_compare_swap(right, 6, 0, 9) == 0
        world.barrier()
        assert counters.wait_until("ge", 5, index=3) >= 5
        assert counters.test("eq", 7, index=4) and counters.test("eq", 1, index=5)
        assert counters.local()[[3, 4, 5, 6]].tolist() == [5, 7, 1, 9]
        assert raw.local()[1024 + 8 * 3 : 1024 + 8 * 4].view(np.int64)[0] == 5
        f = counters.atomic_nbi(right, 3, "fetch_add", 0)
        world.quiet()
        assert f.value == 5
        world.barrier()


def test_signals_and_put_signal_into_a_view(world: World) -> None:
    right, left = _ring(world)
    with world.zeros(1024, "uint8") as raw:
        data = raw[:512].view("float64")  # 64 float64
        sig = raw[512:].view("uint64")  # 64 signal words
        for rnd in range(1, 6):
            data.put_signal(right, np.full(64, rnd + world.rank / 10), sig, rnd, "set", sig_index=7)
            sig.signal_wait_until("ge", rnd, index=7)
            assert sig.signal_fetch(7) == rnd
            np.testing.assert_array_equal(data.local(), rnd + left / 10)
            world.barrier()
        sig.signal(right, 5, "add", index=9)
        world.barrier()
        assert sig.signal_fetch(9) == 5
        world.barrier()


def test_locks_and_strided_rma_on_views(world: World) -> None:
    right, left = _ring(world)
    with world.zeros(8192, "uint8") as raw:
        lock = raw[:64].view("int64")
        log = raw[64 : 64 + 8 * world.world_size].view("int64")
        grid = raw[4096:].view("int32")  # 1024 int32
        for _ in range(3):
            with lock.lock(index=2):
                log.p(0, 0, log.g(0, 0) + 1)  # a read-modify-write under the lock
        world.barrier()
        if world.rank == 0:
            assert log.local().tolist() == [3 * world.world_size] + [0] * (world.world_size - 1)
        mine = 3 + world.rank % 5  # a lock word of its own: free, so acquired
        assert lock.test_lock(index=mine) == 0  # OpenSHMEM's value: 0 when acquired
        lock.clear_lock(index=mine)
        grid.iput(right, np.arange(16, dtype=np.int32) + 1000 * world.rank, stride=4)
        world.barrier()
        np.testing.assert_array_equal(grid.local()[:64:4], np.arange(16) + 1000 * left)
        got = grid.iget(right, 16, stride=4)
        np.testing.assert_array_equal(got, np.arange(16) + 1000 * world.rank)
        world.barrier()


def test_a_views_lifetime_is_its_allocations(world: World) -> None:
    raw = world.zeros(512, "uint8")
    words = raw.view("int64")
    part = words[2:4]
    with pytest.raises(ShmemStateError, match="a view of an allocation"):
        part.close()
    kept = part.local()  # a numpy view through a typed view keeps the block, as raw's own do
    raw.close()
    assert words.closed and part.closed
    with pytest.raises(ShmemStateError, match="closed"):
        part.put(0, np.zeros(2, np.int64))
    assert world.heap_stats().held > 0
    del kept
    gc.collect()
    with world.zeros(8, "int64") as other:  # the next heap call frees the held block
        assert world.heap_stats().held == 0
        assert other.offset >= 0


def test_view_errors(world: World) -> None:
    with world.zeros(100, "uint8") as raw:
        with pytest.raises(ArgumentError, match=r"SHMEMBuffer.view: the last axis \(100 bytes\)"):
            raw.view("int64")
        with pytest.raises(ArgumentError, match="not aligned to int64's 8 bytes"):
            raw[4:20].view("int64")  # 16 bytes, from offset + 4
        with pytest.raises(ArgumentError, match=r"only contiguous slices \(got step 2"):
            raw[::2]
        with pytest.raises(ArgumentError, match=r"index out of range \(got 100; expected"):
            raw[100]
        with pytest.raises(ArgumentError, match="invalid index"):
            raw["a"]  # type: ignore[index]
        with pytest.raises(TypeError, match="not iterable"):
            iter(raw)
        assert raw[5:2].shape == (0,)
