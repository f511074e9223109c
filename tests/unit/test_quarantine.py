"""shmem.quarantine: which views keep an anchored array alive, and the held-block bookkeeping."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shmem.arena import Arena
from shmem.quarantine import FREED_BIT, MAX_HELD, Quarantine, anchored, views_alive

DERIVED: dict[str, Callable[[np.ndarray[Any, Any]], Any]] = {
    "view": lambda a: a.view(np.float32).reshape(4, 4),
    "slice": lambda a: a[8:],
    "strided": lambda a: a.view(np.int16)[::3],
    "asarray": lambda a: np.asarray(a.view(np.float64)),
    "memoryview": lambda a: memoryview(a.data),
    "dlpack": lambda a: np.from_dlpack(a.view(np.int32)),
    "view-of-view": lambda a: a.view(np.uint16)[1:].view(np.uint8)[2:],
}


@pytest.mark.parametrize("kind", list(DERIVED))
def test_every_derived_view_keeps_the_anchor_alive(kind: str) -> None:
    slab = np.zeros(1024, np.uint8)
    base = anchored(slab[64:128].data)
    ref = weakref.ref(base)
    derived = DERIVED[kind](base)
    del base
    gc.collect()
    assert views_alive((ref,)), f"a {kind} view no longer holds the anchor"
    del derived
    gc.collect()
    assert not views_alive((ref,))


def test_a_copy_does_not_keep_the_anchor_alive() -> None:
    base = anchored(np.zeros(64, np.uint8).data)
    ref = weakref.ref(base)
    copy = base.view(np.float32).copy()
    del base
    assert not views_alive((ref,)) and copy.shape == (16,)


def test_held_blocks_are_freed_in_order_once_no_rank_has_a_view() -> None:
    arena = Arena(1 << 16, 256)
    q = Quarantine()
    offsets = [arena.alloc(100) for _ in range(3)]
    bases = [anchored(np.zeros(8, np.uint8).data) for _ in offsets]
    for i, (off, base) in enumerate(zip(offsets, bases, strict=True)):
        assert q.mask((weakref.ref(base),)) == FREED_BIT | ((1 << i) - 1)
        assert q.hold(off, 100, (weakref.ref(base),))
    del base
    assert len(q) == 3 and q.held_nbytes == 300
    del bases[1]
    assert q.mask() == 0b101
    q.settle(0b101 | 0b010, arena)  # another rank still has a view of block 1: kept
    assert len(q) == 3
    q.settle(0b101, arena)
    assert len(q) == 2 and offsets[1] not in arena.allocated()
    assert q.mask() == 0b11  # the slots moved up, alike on every rank
    bases.clear()
    q.settle(q.mask(), arena)
    assert len(q) == 0 and arena.stats().num_allocated == 0


def test_a_full_quarantine_pins_the_block() -> None:
    q = Quarantine()
    keep = [anchored(np.zeros(8, np.uint8).data) for _ in range(MAX_HELD)]
    for i, base in enumerate(keep):
        assert q.hold(256 * i, 8, (weakref.ref(base),))
    assert not q.hold(1 << 20, 8, ())
    assert q.pinned_nbytes == 8 and q.held_nbytes == 8 * (MAX_HELD + 1)
    assert q.mask() == (1 << MAX_HELD) - 1 and q.mask() < FREED_BIT
