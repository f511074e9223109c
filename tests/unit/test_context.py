"""Devices and DeviceContext on the host: every method, ordering, errors."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import shmem
from shmem import CPU, AsyncExecutionError, Buffer, Device, DeviceContext
from shmem.device.context import Block, Dim3, Event
from shmem.errors import DeviceUnavailableError, ShmemError, ShmemStateError


@pytest.fixture
def ctx() -> Any:
    with DeviceContext() as c:
        yield c


def test_cpu_device() -> None:
    cpu = CPU()
    assert cpu is shmem.CPU(0) and cpu == CPU() and hash(cpu) == hash(CPU())
    assert (cpu.api, cpu.id, cpu.label, cpu.is_host) == ("cpu", 0, "cpu:0", True)
    assert isinstance(cpu.name, str) and cpu.name
    mem = cpu.memory_info
    assert 0 < mem.free <= mem.total
    assert cpu.attributes.cores and cpu.attributes.cores >= 1
    assert cpu.attributes.compute_capability is None
    assert cpu.is_compatible
    assert cpu.can_access(CPU())
    cpu.enable_peer_access(CPU())  # a no-op
    assert Device.count("cpu") == 1
    with pytest.raises(ValueError, match="invalid id"):
        CPU(1)
    with pytest.raises(ValueError, match="unknown api"):
        Device.count("rocm")


def test_accelerator_without_gpu() -> None:
    if Device.count("cuda") > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceUnavailableError, match=r"Accelerator\(0\)"):
        shmem.Accelerator(0)
    with pytest.raises(ValueError, match="invalid id"):
        shmem.Accelerator(-1)
    with pytest.raises(ValueError, match="invalid device"):
        DeviceContext("tpu:0")


def test_buffers_and_copies(ctx: DeviceContext) -> None:
    a = ctx.enqueue_create_buffer("float32", 100)
    b = ctx.create_buffer_sync("float32", 100)
    h = ctx.enqueue_create_host_buffer("float32", 100)
    assert (a.device, a.shape, a.stream, h.is_host, h.pinned) == (CPU(), (100,), ctx, True, False)
    ctx.enqueue_copy(a, np.arange(100, dtype=np.float32))  # host -> "device"
    ctx.enqueue_copy(b, a)  # device -> device
    ctx.enqueue_copy(h, b)  # device -> host
    ctx.synchronize()
    np.testing.assert_array_equal(h.to_numpy(), np.arange(100))
    out = np.zeros(100, np.float32)
    ctx.enqueue_copy_sync(out, h)
    np.testing.assert_array_equal(out, np.arange(100))
    ctx.enqueue_memset(a, 7)
    ctx.synchronize()
    assert (a.to_numpy() == 7).all()
    ctx.memset_sync(a, 2.5)
    assert (a.to_numpy() == 2.5).all()
    m = ctx.malloc_host("int32", 4)
    ctx.free_host(m)
    assert m.closed


@pytest.mark.parametrize(
    ("dst", "src", "match"),
    [
        (np.zeros(4, np.float32), np.zeros(5, np.float32), "size mismatch"),
        (np.zeros(4, np.float32), np.zeros(4, np.int32), "dtype mismatch"),
        (np.zeros((4, 4), np.float32)[:, 1], np.zeros(4, np.float32), "dst is not contiguous"),
        ("nope", np.zeros(4, np.float32), "must be a Buffer or a numpy array"),
    ],
)
def test_copy_errors(ctx: DeviceContext, dst: Any, src: Any, match: str) -> None:
    with pytest.raises(ShmemError, match=match):
        ctx.enqueue_copy(dst, src)


def test_stream_order_slow_kernel_then_copy(ctx: DeviceContext) -> None:
    buf = ctx.enqueue_create_buffer("int64", 8)
    out = np.zeros(8, np.int64)

    def slow(block: Block, x: np.ndarray[Any, Any]) -> None:
        time.sleep(0.2)
        x[...] = np.arange(8) * 3

    start = time.perf_counter()
    ctx.enqueue_function(slow, buf, grid_dim=1)
    ctx.enqueue_copy(out, buf)
    assert time.perf_counter() - start < 0.1, "enqueue returns at once"
    ctx.synchronize()
    np.testing.assert_array_equal(out, np.arange(8) * 3)


def test_grid_runs_every_block_once(ctx: DeviceContext) -> None:
    seen = np.zeros((2, 3, 4), np.int64)
    lock = threading.Lock()

    def kernel(block: Block, out: np.ndarray[Any, Any], scale: int) -> None:
        assert block.grid_dim == Dim3(4, 3, 2) and block.block_dim == Dim3(32)
        assert block.shared.nbytes == 64 and not block.shared.any()
        i = block.block_idx
        with lock:
            out[i.z, i.y, i.x] += scale * (block.linear_idx + 1)

    fn = ctx.compile_function(kernel)
    ctx.enqueue_function(
        fn, Buffer.from_numpy(seen), 10, grid_dim=(4, 3, 2), block_dim=32, shared_mem_bytes=64
    )
    ctx.synchronize()
    np.testing.assert_array_equal(seen.reshape(-1), 10 * (np.arange(24) + 1))


def test_kernel_error_surfaces_at_synchronize(ctx: DeviceContext) -> None:
    def bad(block: Block) -> None:
        if block.block_idx.x == 3:
            raise ZeroDivisionError("block 3 divided by zero")

    after = np.zeros(1, np.int32)
    ctx.enqueue_function(bad, grid_dim=8)
    ctx.enqueue_memset(Buffer.from_numpy(after), 1)  # skipped: the stream has failed
    with pytest.raises(AsyncExecutionError, match="block 3 divided by zero") as info:
        ctx.synchronize()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "in bad" in str(info.value)  # the original traceback
    assert after[0] == 0
    ctx.synchronize()  # the error was reported once; the stream is usable again
    ctx.memset_sync(Buffer.from_numpy(after), 2)
    assert after[0] == 2


def test_compile_from_source(ctx: DeviceContext) -> None:
    src = "def axpy(block, a, x, y):\n    y[...] = a * x + y\n"
    fn = ctx.compile_function(src, "axpy")
    assert fn.name == "axpy" and fn.device == CPU()
    x, y = np.arange(4.0), np.ones(4)
    ctx.enqueue_function(fn, 2.0, x, y, grid_dim=1)
    ctx.synchronize()
    np.testing.assert_array_equal(y, 2 * np.arange(4.0) + 1)
    with pytest.raises(ValueError, match="defines no callable 'nope'"):
        ctx.compile_function(src, "nope")
    with pytest.raises(ValueError, match="expected a callable"):
        ctx.compile_function(42)
    with pytest.raises(ValueError, match="invalid grid_dim"):
        ctx.enqueue_function(fn, grid_dim=0)
    with pytest.raises(ValueError, match="invalid block_dim"):
        ctx.enqueue_function(fn, grid_dim=1, block_dim=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="invalid shared_mem_bytes"):
        ctx.enqueue_function(fn, grid_dim=1, shared_mem_bytes=-1)


def test_events_timing_and_wait_for(ctx: DeviceContext) -> None:
    start = ctx.record_event()
    ctx.enqueue_function(lambda b: time.sleep(0.05), grid_dim=1)
    end = ctx.record_event()
    end.synchronize()
    assert start.is_done and end.is_done
    assert (end - start) >= 45.0  # milliseconds
    ns = ctx.execution_time(lambda c: c.enqueue_function(lambda b: time.sleep(0.01), grid_dim=1), 3)
    assert ns >= 29_000_000
    with DeviceContext() as other:
        flag = np.zeros(1, np.int64)

        def slow_fill(block: Block) -> None:
            time.sleep(0.1)
            flag.fill(5)

        other.enqueue_function(slow_fill, grid_dim=1)
        ctx.enqueue_wait_for(other)
        out = np.zeros(1, np.int64)
        ctx.enqueue_copy(out, flag)
        ctx.synchronize()
        assert out[0] == 5, "the copy waited for the other stream"
    ev = Event()
    with pytest.raises(TimeoutError):
        ev.synchronize(timeout=0.01)
    with pytest.raises(ValueError, match="invalid num_iters"):
        ctx.execution_time(lambda c: None, 0)


def test_map_to_host_and_driver_version(ctx: DeviceContext) -> None:
    buf = ctx.create_buffer_sync("int16", 5)
    with ctx.map_to_host(buf) as arr:
        arr[...] = [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(buf.to_numpy(), [1, 2, 3, 4, 5])
    v = ctx.get_driver_version()
    assert v.major >= 0 and v.minor >= 0
    assert ctx.api == "cpu" and ctx.stream is not None


def test_closed_context() -> None:
    c = DeviceContext(CPU())
    c.close()
    c.close()  # idempotent
    with pytest.raises(ShmemStateError, match="closed"):
        c.enqueue_create_buffer("float32", 1)
    failing = DeviceContext()
    failing.enqueue_function(lambda b: 1 / 0, grid_dim=1)
    with pytest.raises(AsyncExecutionError):
        failing.close()  # errors still surface when closing
