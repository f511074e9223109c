"""Devices, DeviceContext and Buffer on a CUDA device (skipped without one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shmem
from shmem import Accelerator, Buffer, Device, DeviceContext

pytestmark = [pytest.mark.gpu, pytest.mark.smoke]  # all quick: the GPU run's tier 1
KERNELS = Path(__file__).resolve().parent / "kernels"


@pytest.fixture
def gpu() -> Any:
    return Accelerator(0)


@pytest.fixture
def ctx(gpu: Device) -> Any:
    with DeviceContext(gpu) as c:
        yield c


def test_device_properties(gpu: Device) -> None:
    assert Device.count("cuda") >= 1
    assert gpu.api == "cuda" and gpu.id == 0 and gpu.name
    mem = gpu.memory_info
    assert 0 < mem.free <= mem.total
    attrs = gpu.attributes
    assert attrs.multiprocessor_count and attrs.multiprocessor_count > 0
    assert attrs.compute_capability and attrs.compute_capability >= (7, 0)
    assert gpu.is_compatible
    assert gpu.can_access(gpu) and not gpu.can_access(shmem.CPU())
    gpu.enable_peer_access(gpu)


@pytest.mark.parametrize("name", sorted(shmem.SUPPORTED_DTYPES))
def test_roundtrip_every_dtype(ctx: DeviceContext, name: str) -> None:
    dt = shmem.SUPPORTED_DTYPES[name]
    src = (np.arange(1000) % 2 == 1) if name == "bool" else (np.arange(1000) % 7).astype(dt)
    dev = ctx.enqueue_create_buffer(name, 1000)
    dev2 = ctx.enqueue_create_buffer(name, 1000)
    host = ctx.enqueue_create_host_buffer(name, 1000)
    assert host.pinned and not dev.is_host
    ctx.enqueue_copy(dev, src)
    ctx.enqueue_copy(dev2, dev)
    ctx.enqueue_copy(host, dev2)
    ctx.synchronize()
    np.testing.assert_array_equal(host.to_numpy().astype(np.float32), src.astype(np.float32))
    ctx.memset_sync(dev, 1)
    assert (dev.to_numpy().astype(np.float32) == 1).all()


def test_strided_views_on_device(ctx: DeviceContext) -> None:
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    dev = Buffer.from_numpy(a).copy(stream=ctx)
    ctx.synchronize()
    view = dev[1:5, ::3]
    np.testing.assert_array_equal(view.to_numpy(), a[1:5, ::3])
    np.testing.assert_array_equal(view.contiguous().to_numpy(), a[1:5, ::3])
    view.inplace_copy_from(np.zeros((4, 3), np.float32))
    ctx.synchronize()
    expect = a.copy()
    expect[1:5, ::3] = 0
    np.testing.assert_array_equal(dev.to_numpy(), expect)
    dev[0, 0] = 5.0
    assert dev[0, 0].item() == 5.0


def test_compile_and_launch(ctx: DeviceContext) -> None:
    src = (KERNELS / "saxpy.cu").read_text()
    fn = ctx.compile_function(src, "saxpy")
    n = 10_000
    x = Buffer.from_numpy(np.arange(n, dtype=np.float32)).to(ctx)
    y = Buffer.from_numpy(np.ones(n, dtype=np.float32)).to(ctx)
    ctx.enqueue_function(
        fn, np.float32(2.0), x, y, np.uint64(n), grid_dim=(n + 255) // 256, block_dim=256
    )
    ctx.synchronize()
    np.testing.assert_allclose(y.to_numpy(), 2 * np.arange(n) + 1)
    ids = ctx.enqueue_create_buffer("int32", 24)
    fn2 = ctx.compile_function(src, "block_ids")
    ctx.enqueue_function(fn2, ids, grid_dim=(4, 3, 2), block_dim=32, shared_mem_bytes=4)
    ctx.synchronize()
    np.testing.assert_array_equal(ids.to_numpy(), np.arange(24))
    with pytest.raises(TypeError, match="numpy scalars"):
        ctx.enqueue_function(fn, 2.0, x, y, n, grid_dim=1)
    ns = ctx.execution_time(
        lambda c: c.enqueue_function(
            fn, np.float32(1), x, y, np.uint64(n), grid_dim=40, block_dim=256
        ),
        10,
    )
    assert ns > 0


def test_events_wait_for_and_map(ctx: DeviceContext, gpu: Device) -> None:
    buf = ctx.create_buffer_sync("float32", 16)
    with ctx.map_to_host(buf) as arr:
        arr[...] = np.arange(16)
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(16))
    with DeviceContext(gpu) as other:
        b2 = other.enqueue_create_buffer("float32", 16)
        other.enqueue_copy(b2, buf)
        ctx.enqueue_wait_for(other)
        out = ctx.enqueue_create_host_buffer("float32", 16)
        ctx.enqueue_copy(out, b2)
        ctx.synchronize()
        np.testing.assert_array_equal(out.to_numpy(), np.arange(16))
    start, end = ctx.record_event(), ctx.record_event()
    end.synchronize()
    assert end - start >= 0.0
    v = ctx.get_driver_version()
    assert v.major >= 12


def test_dlpack_with_cupy_and_torch(ctx: DeviceContext) -> None:
    dev = Buffer.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4)).to(ctx)
    ctx.synchronize()
    cupy = pytest.importorskip("cupy")
    c = cupy.from_dlpack(dev)
    assert c.shape == (3, 4) and float(c.sum()) == 66.0
    back = Buffer.from_dlpack(c)
    assert back.device == dev.device and back._ptr == dev._ptr
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(dev)
    assert t.is_cuda and float(t.sum()) == 66.0
    bf = Buffer.from_dlpack(torch.ones(4, dtype=torch.bfloat16, device="cuda"))
    assert bf.dtype == shmem.SUPPORTED_DTYPES["bfloat16"]
    assert (bf.to_numpy().astype(np.float32) == 1).all()
