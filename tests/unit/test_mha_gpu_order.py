"""The GPU attention's work order comes from the host schedulers (collectives/mha/gpu.py):
the table the kernel steps through is the scheduler's own enumeration, and the per-CTA
sequences the kernel's trace must show are the host loop's. Needs no GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectives.mha import (
    MaskSpec,
    MHASchedule,
    MHATileSummary,
    QueuedTileScheduler,
    TileScheduler,
    TransientScheduler,
    attention,
)
from collectives.mha.gpu import is_gpu_array, kernel_name, work_order, worker_items
from shmem import Buffer
from shmem.errors import AttentionArgumentError

SUMMARIES = {
    "padded": MHATileSummary.create(num_heads=3, block_m=64, seq_len=200, batch_size=2),
    "causal": MHATileSummary.create(
        num_heads=2, block_m=64, seq_len=300, batch_size=1, mask=MaskSpec(causal=True)
    ),
    "ragged": MHATileSummary.create(
        num_heads=2, block_m=64, row_offsets=[0, 10, 400, 401, 530], mask=MaskSpec(causal=True)
    ),
}


@pytest.mark.parametrize("schedule", list(MHASchedule))
@pytest.mark.parametrize("scheduler", ["transient", "static", "queued"])
@pytest.mark.parametrize("name", list(SUMMARIES))
def test_the_table_is_the_schedulers_enumeration(name: str, scheduler: str, schedule: Any) -> None:
    summary = SUMMARIES[name]
    table, grid, mode = work_order(summary, scheduler, schedule, workers=5)
    assert table.dtype == np.int32 and table.shape == (summary.num_items, 3)
    sched: Any
    if scheduler == "transient":
        sched = TransientScheduler(summary.num_heads, schedule)
        assert (grid, mode) == (summary.num_items, 0)
        idx = [sched.initial_state(w, summary).idx for w in range(grid)]
    else:
        cls = TileScheduler if scheduler == "static" else QueuedTileScheduler
        sched = cls(5, schedule)
        assert (grid, mode) == (min(5, summary.num_items), 1 if scheduler == "static" else 2)
        idx = list(range(summary.num_items))
    assert [tuple(row) for row in table.tolist()] == [sched.item(summary, i) for i in idx]
    # every (batch, head, tile) exactly once
    assert len({tuple(row) for row in table.tolist()}) == summary.num_items


@pytest.mark.parametrize("name", list(SUMMARIES))
def test_worker_items_follow_the_host_loop(name: str) -> None:
    """worker_items (what a CTA's trace must show) is the host attention loop's sequence:
    static workers stride by the worker count and skip tiles past a ragged end; together
    the workers take every valid item once."""
    summary = SUMMARIES[name]
    sched = TileScheduler(4, MHASchedule.LPT)
    taken = [worker_items(sched, summary, w) for w in range(4)]
    for w, items in enumerate(taken):
        assert all(i % 4 == w for i in items)
        assert items == sorted(items)
    valid = [i for i in range(summary.num_items) if sched.valid(summary, i)]
    assert sorted(i for items in taken for i in items) == valid
    transient = TransientScheduler(summary.num_heads)
    assert [worker_items(transient, summary, w) for w in range(3)] == [[0], [1], [2]]


def test_kernel_choice() -> None:
    assert kernel_name("bfloat16", 128) == "mha_fwd_bfloat16_d128"
    assert kernel_name("float16", 80) == "mha_fwd_float16_d80"
    assert kernel_name("bfloat16", 72) == "mha_fwd_bfloat16_general"
    assert kernel_name("float32", 64) == "mha_fwd_float32_general"


def test_host_arrays_are_not_gpu_arrays() -> None:
    assert not is_gpu_array(np.zeros(3))
    assert not is_gpu_array(Buffer.from_numpy(np.zeros(3)))
    assert not is_gpu_array([1, 2])


class FakeCudaArray:
    """Looks like a CUDA array (``__cuda_array_interface__``) without being one."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0, False)}


def test_gpu_inputs_are_checked_before_any_gpu_work() -> None:
    """Shape errors on GPU inputs are the host's errors, raised before the GPU is touched."""
    q = FakeCudaArray((1, 8, 4, 64))
    with pytest.raises(AttentionArgumentError, match="num_kv_heads must divide"):
        attention(q, FakeCudaArray((1, 8, 3, 64)), FakeCudaArray((1, 8, 3, 64)))
    with pytest.raises(AttentionArgumentError, match="head_dim of q and k differ"):
        attention(q, FakeCudaArray((1, 8, 4, 32)), FakeCudaArray((1, 8, 4, 32)))
    with pytest.raises(AttentionArgumentError, match="must be a GPU array"):
        attention(q, q, q)  # not a real CUDA array: a clear error, not a crash
    with pytest.raises(AttentionArgumentError, match="stream= applies to GPU inputs"):
        x = np.zeros((1, 8, 4, 64), np.float32)
        attention(x, x, x, stream=object())
