"""The RMA path's per-call shortcuts (issue 19): ``SHMEMBuffer.put`` straight to
``Win.Put`` + ``Flush`` for a rank off this node, blocking atomics and signals with reused
origin/result arrays. Every shortcut must move the same data and refuse the same bad input
as the general path, and stop at ``close()``/``finalize()``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import shmem
from shmem.errors import ArgumentError, ShmemStateError

pytestmark = pytest.mark.mpi


@pytest.fixture
def world() -> Iterator[Any]:
    w = shmem.init(heap_nbytes="4MiB")
    try:
        yield w
    finally:
        w.finalize()


def _right(w: Any) -> int:
    return int((w.rank + 1) % w.world_size)


def test_put_shortcut_moves_what_the_general_path_moves(world: Any) -> None:
    w = world
    to = _right(w)
    buf = w.zeros(64, "int64")
    src = np.arange(64, dtype=np.int64) + 1000 * w.rank
    buf.put(to, src[:8])  # first put fills the cache; the rest take the shortcut if off-node
    buf.put(to, src[8:16], offset=8 * 8)
    buf.put(to, src[16:64:2], offset=16 * 8)  # a strided 1-D source: BufferError -> copied
    buf.put(to, src[40:48].reshape(2, 4), offset=40 * 8)  # 2-D: the general path
    buf.put(to, src[48:56].astype(np.int32), offset=48 * 8)  # another dtype: cast
    w.barrier()
    frm = (w.rank - 1) % w.world_size
    want = np.zeros(64, np.int64)
    want[:16] = np.arange(16) + 1000 * frm
    want[16:40] = (np.arange(64) + 1000 * frm)[16:64:2]
    want[40:56] = np.arange(40, 56) + 1000 * frm
    np.testing.assert_array_equal(buf.local(), want)
    w.barrier()
    if w.num_nodes > 1:
        assert to in buf._remote or w.heap.is_local(to)
    buf.close()


@pytest.mark.parametrize(
    ("rank", "offset", "n", "match"),
    [
        (True, 0, 1, "rank"),
        (-1, 0, 1, "rank"),
        (None, 0, 1, "rank"),
        ("right", 4, 1, "offset"),  # not a multiple of the item size
        ("right", -8, 1, "offset"),
        ("right", 8 * 60, 8, "out of bounds"),
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


def test_put_shortcut_ends_at_close_and_finalize() -> None:
    w = shmem.init(heap_nbytes="4MiB")
    buf = w.zeros(8, "float64")
    keep = w.zeros(8, "float64")
    to = _right(w)
    buf.put(to, np.ones(8))
    keep.put(to, np.ones(8))
    buf.close()
    assert not buf._remote
    with pytest.raises(ShmemStateError):
        buf.put(to, np.ones(8))
    w.finalize()
    assert not keep._remote
    with pytest.raises(ShmemStateError):
        keep.put(to, np.ones(8))


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
