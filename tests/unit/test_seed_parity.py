"""Seed-API parity (issue 14): cuda.core's Buffer API and memory resources, the Mojo
DeviceContext names, and MHASchedulerSynchronization for producer/consumer pipelines."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import pytest

from collectives.mha import (
    MHASchedulerSynchronization,
    MHATileSummary,
    QueuedTileScheduler,
    TileScheduler,
)
from shmem import Buffer, DeviceContext
from shmem.device import CPU, DeviceMemoryResource, HostMemoryResource, MemoryInfo, MemoryResource
from shmem.errors import ArgumentError, DescriptorError, ShmemStateError
from shmem.ipc import IpcHostMemoryResource

# -- cuda.core's Buffer ---------------------------------------------------------------------


def test_host_resource_buffers_read_like_cuda_core() -> None:
    mr = HostMemoryResource()
    buf = mr.allocate(64)
    assert (buf.size, buf.nbytes, buf.device_id) == (64, 64, -1)
    assert buf.memory_resource is mr
    assert buf.is_host_accessible and not buf.is_device_accessible
    assert buf.handle == buf.unsafe_ptr() != 0
    assert isinstance(mr, MemoryResource) and mr.device_id == -1
    buf.close(stream=None)
    assert buf.closed
    with pytest.raises(ShmemStateError, match="closed"):
        buf.handle  # noqa: B018


def test_copy_to_and_copy_from_move_bytes_on_a_stream() -> None:
    mr = HostMemoryResource()
    src = Buffer.from_numpy(np.arange(16, dtype=np.float32))
    with DeviceContext() as ctx:
        out = src.copy_to(stream=ctx)  # a new buffer of the same device, 64 bytes
        ctx.synchronize()
        assert out.size == 64
        np.testing.assert_array_equal(out.to_numpy().view(np.float32), np.arange(16))
        dst = mr.allocate(64)
        dst.copy_from(src, stream=ctx)
        ctx.synchronize()
        np.testing.assert_array_equal(dst.to_numpy().view(np.float32), np.arange(16))
        again = dst.copy_to(stream=None)
        assert again.memory_resource is mr  # from the source's resource
        with pytest.raises(ArgumentError, match="size mismatch"):
            src.copy_to(mr.allocate(8), stream=ctx)
        with pytest.raises(ArgumentError, match="invalid stream"):
            src.copy_to(stream="ctx")  # type: ignore[arg-type]
        with pytest.raises(ArgumentError, match="src must be a Buffer"):
            dst.copy_from(np.zeros(64, np.uint8), stream=ctx)  # type: ignore[arg-type]
        dst.close(stream=ctx)


def test_from_handle_wraps_foreign_host_memory() -> None:
    raw = (ctypes.c_uint8 * 32)()
    ptr = ctypes.addressof(raw)
    buf = Buffer.from_handle(ptr, 32)
    assert buf.handle == ptr and buf.size == 32 and buf.memory_resource is None
    buf.to_numpy()[:4] = [1, 2, 3, 4]
    assert list(raw[:4]) == [1, 2, 3, 4]  # the same memory
    with pytest.raises(ArgumentError, match="invalid pointer"):
        Buffer.from_handle(0, 4)
    with pytest.raises(ArgumentError, match="invalid size"):
        Buffer.from_handle(ptr, -1)
    with pytest.raises(ArgumentError, match="invalid mr"):
        Buffer.from_handle(ptr, 4, mr="host")  # type: ignore[arg-type]


def test_ipc_flow_reads_like_cuda_core() -> None:
    mr = IpcHostMemoryResource()
    assert mr.is_ipc_enabled and mr.is_host_accessible
    buf = mr.allocate(128)
    buf.to_numpy()[:] = np.arange(128, dtype=np.uint8)
    desc = buf.get_ipc_descriptor()
    other = Buffer.from_ipc_descriptor(mr, str(desc))  # an importer (here: this process)
    try:
        assert other.memory_resource is mr
        assert other.handle != buf.handle  # its own mapping of the same memory
        np.testing.assert_array_equal(other.to_numpy(), np.arange(128, dtype=np.uint8))
        other.to_numpy()[0] = 200
        assert buf.to_numpy()[0] == 200
    finally:
        other.close()
        buf.close()
    with pytest.raises(ArgumentError, match="not IPC-enabled"):
        HostMemoryResource().allocate(8).get_ipc_descriptor()
    with pytest.raises(ArgumentError, match="IPC-enabled memory resource"):
        Buffer.from_ipc_descriptor(HostMemoryResource(), str(desc))


def test_device_resource_refuses_the_host() -> None:
    with pytest.raises(ArgumentError, match="expected a GPU"):
        DeviceMemoryResource("cpu")


def test_from_ipc_descriptor_checks_the_memory_kind() -> None:
    from shmem.ipc import IpcDescriptor

    mr = IpcHostMemoryResource()
    buf = mr.allocate(8)
    try:
        desc = buf.get_ipc_descriptor()
        cuda_desc = IpcDescriptor(**{**desc.__dict__, "kind": "cuda"})
        fake_gpu_mr = object.__new__(DeviceMemoryResource)
        fake_gpu_mr.device = CPU()
        fake_gpu_mr.is_ipc_enabled = True
        with pytest.raises(DescriptorError, match="descriptor is for host memory"):
            Buffer.from_ipc_descriptor(fake_gpu_mr, desc)
        with pytest.raises(DescriptorError, match="descriptor is for cuda memory"):
            Buffer.from_ipc_descriptor(mr, cuda_desc)
    finally:
        buf.close()


# -- the seed's DeviceContext ----------------------------------------------------------------


def test_device_context_queries() -> None:
    with DeviceContext() as ctx:
        assert ctx.name == CPU().name and ctx.id == 0
        assert ctx.get_attribute("cores") == CPU().attributes.cores
        assert ctx.get_attribute("multiprocessor_count") is None
        with pytest.raises(ArgumentError, match="unknown attribute"):
            ctx.get_attribute("warp_size")
        info = ctx.get_memory_info()
        free, total = info
        assert isinstance(info, MemoryInfo) and 0 < free <= total
        assert ctx.is_compatible()
        assert ctx.can_access(DeviceContext())
        ctx.enable_peer_access(ctx)
        assert DeviceContext.number_of_devices("cpu") == 1
        with pytest.raises(ArgumentError, match="expected a DeviceContext or Device"):
            ctx.can_access("cuda:0")  # type: ignore[arg-type]


def test_device_context_directional_copies_and_memset() -> None:
    with DeviceContext() as ctx:
        dev = ctx.create_buffer_sync("int32", 8)
        ctx.copy_to_device_sync(dev, np.arange(8, dtype=np.int32))
        host = np.zeros(8, np.int32)
        ctx.copy_from_device_sync(host, dev)
        assert host.tolist() == list(range(8))
        other = ctx.create_buffer_sync("int32", 8)
        ctx.copy_device_to_device_sync(other, dev)
        assert other.to_numpy().tolist() == list(range(8))
        ctx.memset(other, 7)
        ctx.synchronize()
        assert other.to_numpy().tolist() == [7] * 8
        seen: list[int] = []
        ns = ctx.execution_time_iter(lambda c, i: seen.append(i), 5)
        assert seen == [0, 1, 2, 3, 4] and ns >= 0
        # the host is this context's device: a host array cannot be its "device" side
        with pytest.raises(ArgumentError, match="dst is host memory"):
            ctx.enqueue_copy_to_device(np.zeros(8, np.int32), dev)  # type: ignore[arg-type]


# -- MHASchedulerSynchronization -------------------------------------------------------------


def _summary(n_tiles: int) -> MHATileSummary:
    return MHATileSummary.create(batch_size=1, num_heads=1, seq_len=n_tiles * 16, block_m=16)


def test_producer_publishes_and_consumers_follow() -> None:
    summary = _summary(12)
    sched = QueuedTileScheduler(2, consumers=2, pipeline_stages=2)
    got: dict[str, list[int]] = {"p": [], "c0": [], "c1": []}
    errors: list[BaseException] = []

    def run(name: str, producer: bool) -> None:
        try:
            state = sched.initial_state(0, summary)
            stage = 0
            while True:
                info = sched.advance(
                    summary, state, stage, producer=producer, sync=MHASchedulerSynchronization.ALL
                )
                if info is None:
                    break
                got[name].append(state.idx)
                stage = (stage + 1) % 2
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=("c0", False)),
        threading.Thread(target=run, args=("c1", False)),
        threading.Thread(target=run, args=("p", True)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert got["p"] and got["c0"] == got["p"] and got["c1"] == got["p"]  # the same items
    assert len(set(got["p"])) == len(got["p"])


def test_sync_none_refuses_an_unpublished_read() -> None:
    summary = _summary(4)
    sched = QueuedTileScheduler(1, consumers=1)
    consumer = sched.initial_state(0, summary)
    with pytest.raises(RuntimeError, match="not published yet"):
        sched.advance(summary, consumer, producer=False, sync=MHASchedulerSynchronization.NONE)
    producer = sched.initial_state(0, summary)
    sched.advance(summary, producer)
    consumer2 = sched.initial_state(0, summary)
    sched.advance(summary, consumer2, producer=False)  # published now: NONE reads it
    assert consumer2.idx == producer.idx
    with pytest.raises(ValueError, match="invalid pipeline_idx"):
        sched.advance(summary, producer, 1)
    with pytest.raises(ValueError, match="needs a scheduler made with consumers"):
        QueuedTileScheduler(1).advance(summary, producer, producer=False)


def test_static_scheduler_accepts_producer_and_sync() -> None:
    summary = _summary(8)
    sched = TileScheduler(2)
    a, b = sched.initial_state(1, summary), sched.initial_state(1, summary)
    ia: Any = sched.advance(summary, a, producer=True, sync=MHASchedulerSynchronization.ALL)
    ib: Any = sched.advance(summary, b, producer=False, sync=MHASchedulerSynchronization.ALL)
    assert (a.idx, ia) == (b.idx, ib)
