"""OpenSHMEM routines on the host backend (issue 14, first part): single-element p/g and the
atomic family, at 1-4 ranks and on the RMA path (``SHMEM_HEAP_NODE_SPLIT=rank``)."""

from __future__ import annotations

import numpy as np
import pytest

from shmem import World
from shmem.errors import ArgumentError

pytestmark = pytest.mark.mpi

ATOMIC = ["int32", "int64", "uint32", "uint64"]


@pytest.mark.parametrize("name", ["float64", "int32", "bfloat16", "uint8"])
def test_p_and_g_move_one_element(world: World, name: str) -> None:
    right = (world.rank + 1) % world.world_size
    left = (world.rank - 1) % world.world_size
    with world.zeros(5, name) as x:
        world.barrier()
        x.p(right, 3, world.rank + 1)
        world.barrier()
        assert x.local().astype(np.float64).tolist() == [0, 0, 0, left + 1, 0]
        assert x.g(right, 3) == world.rank + 1  # what this rank wrote there
        assert isinstance(x.g(world.rank, 0), int | float)
        world.barrier()
        with pytest.raises(ArgumentError, match=r"p: index out of range \(got 5"):
            x.p(right, 5, 1)
        with pytest.raises(ArgumentError, match=r"g: invalid index"):
            x.g(right, 1.0)  # type: ignore[arg-type]
        world.barrier()


@pytest.mark.parametrize("name", ATOMIC)
def test_the_atomic_family(world: World, name: str) -> None:
    """Every rank applies each operation once to element ``k`` of rank 0's copy; results
    are order-independent, so every rank can check them after a barrier."""
    p = world.world_size
    with world.zeros(8, name) as x:
        x.local()[...] = [0, 0, 0, 0b1111, 0, 0, 7, 0]
        world.barrier()
        assert x.atomic_fetch(0, 6) == 7  # nobody changes element 6 until the next barrier
        x.atomic_inc(0, 0)
        old = x.atomic_fetch_inc(0, 1)
        x.atomic_add(0, 2, 3)
        x.atomic_and(0, 3, ~(1 << world.rank % 4) & 0b1111)
        x.atomic_or(0, 4, 1 << world.rank)
        x.atomic_xor(0, 5, 1 << world.rank)
        fetched_or = x.atomic_fetch_or(0, 7, 1 << world.rank)
        world.barrier()
        olds = world.comm.allgather(old)
        assert sorted(olds) == list(range(p))  # fetch_inc hands out distinct tickets
        assert x.atomic_fetch(0, 0) == p
        assert x.atomic_fetch(0, 1) == p
        assert x.atomic_fetch(0, 2) == 3 * p
        cleared = 0
        for r in range(p):
            cleared |= 1 << (r % 4)
        assert x.atomic_fetch(0, 3) == 0b1111 & ~cleared
        assert x.atomic_fetch(0, 4) == (1 << p) - 1
        assert x.atomic_fetch(0, 5) == (1 << p) - 1
        assert fetched_or & ~((1 << p) - 1) == 0
        world.barrier()
        if world.rank == 0:
            x.atomic_set(0, 6, 42)
            assert x.atomic_fetch_and(0, 6, 0b101010) == 42
            assert x.atomic_fetch_xor(0, 6, 0b1) == 42
            assert x.atomic_fetch(0, 6) == 43
        world.barrier()
        if np.dtype(name).kind == "u":  # unsigned: -1 is all ones, as in C
            if world.rank == 0:
                x.atomic_set(0, 6, 5)
                x.atomic_add(0, 6, -1)
                assert x.atomic_fetch(0, 6) == 4
                assert x.atomic_fetch_and(0, 6, -1) == 4
            world.barrier()


def test_atomics_refuse_non_integer_buffers(world: World) -> None:
    with world.zeros(2, "float32") as f:
        assert f.atomic_fetch(0, 0) == 0.0  # float32/float64 take fetch, set and swap only
        with pytest.raises(ArgumentError, match="atomics need an integer buffer"):
            f.atomic_fetch_add(0, 0, 1)
        with pytest.raises(ArgumentError, match="atomics need an integer buffer"):
            f.atomic_fetch_xor(0, 0, 1)


def test_seed_names_type_name_and_raw_pointer_copies(world: World) -> None:
    import ctypes

    with world.zeros(6, "bfloat16") as x:
        assert x.get_type_name() == "bfloat16"
    with world.zeros(4, "int64") as y:
        raw = (ctypes.c_int64 * 4)(5, 6, 7, 8)
        y.enqueue_copy_from(ctypes.addressof(raw))  # a raw host pointer, as the seed passes
        world.ctx.synchronize()
        assert y.local().tolist() == [5, 6, 7, 8]
        y.local()[...] += 1
        out = (ctypes.c_int64 * 4)()
        y.enqueue_copy_to(ctypes.addressof(out))
        world.ctx.synchronize()
        assert list(out) == [6, 7, 8, 9]
        with pytest.raises(ArgumentError, match="invalid pointer"):
            y.enqueue_copy_to(0)
        world.barrier()
