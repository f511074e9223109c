"""The arena allocator: determinism, alignment, no overlap, coalescing, exhaustion."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmem.arena import Arena
from shmem.errors import HeapExhaustedError, ShmemError


def _check_invariants(arena: Arena) -> None:
    blocks = sorted(
        [(o, n, "a") for o, n in arena.allocated().items()]
        + [(o, n, "f") for o, n in arena.free_blocks()]
    )
    pos = 0
    for offset, nbytes, _kind in blocks:
        assert offset == pos, "blocks tile the arena with no gap or overlap"
        assert offset % arena.alignment == 0 and nbytes % arena.alignment == 0
        assert nbytes > 0
        pos += nbytes
    assert pos == arena.capacity
    free = arena.free_blocks()
    for (o1, n1), (o2, _) in itertools.pairwise(free):
        assert o1 + n1 < o2, "adjacent free blocks are always coalesced"


ops = st.lists(
    st.tuples(st.booleans(), st.integers(min_value=0, max_value=5000), st.integers(0, 1000)),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, alignment=st.sampled_from([64, 256, 4096]))
def test_random_sequences_never_overlap_and_coalesce(
    ops: list[tuple[bool, int, int]], alignment: int
) -> None:
    arena = Arena(64 * 1024, alignment)
    twin = Arena(64 * 1024, alignment)  # a second "rank" running the same sequence
    live: list[int] = []
    for do_alloc, nbytes, pick in ops:
        if do_alloc or not live:
            # every third allocation asks for its own alignment (shmem_align), up to 16 KiB
            own = 1 << (6 + pick % 9) if pick % 3 == 0 else None
            try:
                off = arena.alloc(nbytes, own)
            except HeapExhaustedError:
                with pytest.raises(HeapExhaustedError):
                    twin.alloc(nbytes, own)
                continue
            assert twin.alloc(nbytes, own) == off, "identical sequences give identical offsets"
            assert off % max(alignment, own or 1) == 0
            live.append(off)
        else:
            off = live.pop(pick % len(live))
            arena.free(off)
            twin.free(off)
        _check_invariants(arena)
    for off in live:
        arena.free(off)
    assert arena.free_blocks() == [(0, arena.capacity)], "everything coalesces back"


def test_first_fit_reuses_the_lowest_hole() -> None:
    a = Arena(4096, 256)
    x, y, z = a.alloc(256), a.alloc(512), a.alloc(256)
    assert (x, y, z) == (0, 256, 768)
    a.free(y)
    assert a.alloc(100) == 256  # first fit: the hole left by y
    assert a.alloc(0) == 512  # zero bytes still takes one aligned unit


def test_exhaustion_names_sizes_and_leaves_arena_usable() -> None:
    a = Arena(4096, 256)
    first = a.alloc(1024)
    a.alloc(1024)
    a.free(first)
    before = (a.allocated(), a.free_blocks())
    with pytest.raises(
        HeapExhaustedError, match=r"3000 bytes.*free 3072 bytes.*largest free block 2048"
    ) as info:
        a.alloc(3000)
    assert (info.value.requested, info.value.free_total, info.value.largest_free) == (
        3000,
        3072,
        2048,
    )
    assert isinstance(info.value, MemoryError) and isinstance(info.value, ShmemError)
    assert (a.allocated(), a.free_blocks()) == before
    assert a.alloc(2048) == 2048


def test_bad_frees_and_arguments() -> None:
    a = Arena(4096, 256)
    off = a.alloc(10)
    a.free(off)
    with pytest.raises(ValueError, match="double free"):
        a.free(off)
    with pytest.raises(ValueError, match="no allocated block at offset 17"):
        a.free(17)
    with pytest.raises(ValueError, match="power of two"):
        Arena(4096, 100)
    with pytest.raises(ValueError, match="negative"):
        a.alloc(-1)


def test_stats() -> None:
    a = Arena(10_000, 256)  # rounded down to 9984
    a.alloc(300)
    s = a.stats()
    assert (s.capacity, s.used, s.free_total, s.num_allocated) == (9984, 512, 9472, 1)


def test_alloc_with_a_larger_alignment_keeps_the_skipped_bytes_free() -> None:
    a = Arena(64 * 1024, 256)
    first = a.alloc(300)  # [0, 512)
    aligned = a.alloc(100, alignment=4096)
    assert (first, aligned) == (0, 4096)
    assert a.free_blocks()[0] == (512, 4096 - 512)  # the skipped bytes: still free
    assert a.alloc(1000) == 512  # and used by the next allocation that fits there
    a.free(aligned)
    assert a.alloc(10, alignment=8192) == 8192
    assert a.alloc(10, alignment=16) == 1536  # below the arena's own: the arena's
    # a free returns the block and coalesces as before
    for off in list(a.allocated()):
        a.free(off)
    assert a.free_blocks() == [(0, 64 * 1024)]
    with pytest.raises(ValueError, match="power of two"):
        a.alloc(10, alignment=3000)
    assert a.alloc(300) == 0
    before = (a.allocated(), a.free_blocks())
    with pytest.raises(HeapExhaustedError):
        a.alloc(60 * 1024, alignment=8192)  # fits in [512, 64 KiB), not from 8 KiB on
    assert (a.allocated(), a.free_blocks()) == before
    assert a.alloc(60 * 1024) == 512


def test_heap_signatures_carry_the_alignment() -> None:
    from shmem.agreement import describe_heap_record, heap_signature

    plain = heap_signature(("alloc", 4096, "float32", (1024,), None))
    aligned = heap_signature(("alloc", 4096, "float32", (1024,), 4096))
    assert plain != aligned
    assert heap_signature(("free", 512, 64)) != heap_signature(("free", 576, 64))
    record = ("alloc", 4096, "float32", (1024,), 4096)
    assert describe_heap_record("World.empty", record) == (
        "World.empty(shape=(1024,), dtype=float32, alignment=4096): 4096 bytes"
    )
    assert describe_heap_record("SHMEMBuffer.close", ("free", 512, 64)) == (
        "SHMEMBuffer.close() of the buffer at offset 512 (64 bytes)"
    )
    assert describe_heap_record("World.empty", ("alloc", "invalid")) == (
        "World.empty(invalid arguments)"
    )
