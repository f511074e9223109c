"""Buffer on the host: properties, views, copies, numpy and DLPack, factories, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shmem import CPU, SUPPORTED_DTYPES, Buffer, DeviceContext
from shmem.errors import DLPackDTypeError, ShmemError, ShmemStateError

DTYPES = sorted(SUPPORTED_DTYPES)


def _values(dt: np.dtype[Any], n: int) -> np.ndarray[Any, Any]:
    return (np.arange(n) % 2 == 1) if dt == np.bool_ else (np.arange(n) % 7).astype(dt)


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype(name: str) -> None:
    dt = SUPPORTED_DTYPES[name]
    b = Buffer(name, (3, 4))
    assert (b.shape, b.dtype, b.rank, b.num_elements, b.element_size) == (
        (3, 4),
        dt,
        2,
        12,
        dt.itemsize,
    )
    assert (b.nbytes, b.device, b.stream, b.pinned, b.is_host, b.is_contiguous) == (
        12 * dt.itemsize,
        CPU(),
        None,
        False,
        True,
        True,
    )
    vals = _values(dt, 12).reshape(3, 4)
    b.inplace_copy_from(vals)
    np.testing.assert_array_equal(b.to_numpy(), vals)
    c = b.copy()
    assert c.to_numpy() is not b.to_numpy() and (c.to_numpy() == b.to_numpy()).all()
    if dt == np.longdouble:  # DLPack has no long double: refused clearly
        with pytest.raises(DLPackDTypeError, match="unsupported dtype"):
            Buffer.from_dlpack(b)
        return
    # DLPack round trip through our own producer and consumer, zero-copy, every dtype
    d = Buffer.from_dlpack(b)
    assert d.dtype == dt and d.shape == (3, 4)
    assert d.to_numpy().ctypes.data == b.to_numpy().ctypes.data
    z = Buffer.zeros((2, 2), name)
    assert not z.to_numpy().any()
    s = Buffer.scalar(1, name)
    assert s.rank == 0 and s.item() == 1


def test_numpy_and_dlpack_interop() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = Buffer.from_numpy(arr)
    assert b.to_numpy() is arr  # zero-copy
    back = np.from_dlpack(b)
    assert back.ctypes.data == arr.ctypes.data and back.shape == (3, 4)
    from_np = Buffer.from_dlpack(arr)
    assert from_np.to_numpy().ctypes.data == arr.ctypes.data
    strided = Buffer.from_numpy(arr[:, ::2])
    assert not strided.is_contiguous
    np.testing.assert_array_equal(np.from_dlpack(strided), arr[:, ::2])
    np.testing.assert_array_equal(np.asarray(b), arr)
    assert b.__dlpack_device__() == (1, 0)


def test_slicing_gives_strided_views() -> None:
    b = Buffer.from_numpy(np.arange(24, dtype=np.int32).reshape(4, 6))
    v = b[1:3, ::2]
    assert (v.shape, v.strides, v.is_contiguous) == ((2, 3), (24, 8), False)
    np.testing.assert_array_equal(v.to_numpy(), [[6, 8, 10], [12, 14, 16]])
    v.to_numpy()[0, 0] = -1  # a view: writes reach the parent
    assert b.to_numpy()[1, 0] == -1
    assert b[2, 3].rank == 0 and b[2, 3].item() == 15
    assert b[-1].shape == (6,) and b[None, 0].shape == (1, 6) and b[..., 1].shape == (4,)
    b[0, 0] = 99
    assert b.to_numpy()[0, 0] == 99
    with pytest.raises(ValueError, match="can only set a single element"):
        b[0] = 1
    with pytest.raises(ValueError, match="can only set a single element"):
        b[0:2, 1] = 1
    with pytest.raises(IndexError, match="out of range for axis 1"):
        b[0, 6]
    with pytest.raises(IndexError, match="cannot use lists"):
        b[[0, 1]]
    c = v.contiguous()
    assert c.is_contiguous and c is not v
    np.testing.assert_array_equal(c.to_numpy(), v.to_numpy())
    assert b.contiguous() is b


def test_view_reinterprets_bytes() -> None:
    b = Buffer.from_numpy(np.arange(8, dtype=np.uint8))
    assert b.view("uint16").shape == (4,)
    assert b.view("int32", (2,)).shape == (2,)
    assert b.view("bfloat16").dtype == SUPPORTED_DTYPES["bfloat16"]
    with pytest.raises(ValueError, match="size mismatch"):
        b.view("int32", (3,))
    with pytest.raises(ValueError, match="cannot deduce a shape"):
        Buffer.from_numpy(np.zeros(3, np.uint8)).view("int16")
    with pytest.raises(ValueError, match="not contiguous"):
        Buffer.from_numpy(np.zeros((4, 4), np.uint8))[:, 1].view("uint8")


def test_copies_and_to() -> None:
    src = Buffer.from_numpy(np.arange(6, dtype=np.float64).reshape(2, 3))
    assert src.to(CPU()) is src and src.to("cpu") is src
    assert src.to([CPU(), "cpu"]) == [src, src]
    with DeviceContext() as ctx:
        assert src.to(ctx) is src
        c = src.copy(stream=ctx)
        ctx.synchronize()
        np.testing.assert_array_equal(c.to_numpy(), src.to_numpy())
    dst = Buffer("float64", (2, 3))
    dst.inplace_copy_from(src)
    np.testing.assert_array_equal(dst.to_numpy(), src.to_numpy())
    dst[:, 1:].inplace_copy_from(np.zeros((2, 2)))  # into a strided view
    np.testing.assert_array_equal(dst.to_numpy(), [[0, 0, 0], [3, 0, 0]])
    with pytest.raises(ValueError, match="shape mismatch"):
        dst.inplace_copy_from(np.zeros((3, 2)))
    with pytest.raises(TypeError, match="dtype mismatch"):
        dst.inplace_copy_from(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="must be a Buffer or a numpy array"):
        dst.inplace_copy_from([1, 2])


def test_mmap(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    np.arange(10, dtype=np.int16).tofile(path)
    b = Buffer.mmap(path, "int16", (2, 4), mode="r+", offset=4)
    np.testing.assert_array_equal(b.to_numpy(), np.arange(2, 10).reshape(2, 4))
    b[0, 0] = 42
    b.to_numpy().flush()  # type: ignore[attr-defined]
    assert np.fromfile(path, np.int16)[2] == 42
    with pytest.raises(ValueError, match="invalid mode"):
        Buffer.mmap(path, "int16", 2, mode="x")
    with pytest.raises(ValueError, match="cannot map"):
        Buffer.mmap(tmp_path / "missing.bin", "int16", 2, mode="r")


def test_construction_errors_and_close() -> None:
    with pytest.raises(TypeError, match="unsupported dtype"):
        Buffer("clongdouble", 3)
    with pytest.raises(ValueError, match="invalid shape"):
        Buffer("float32", (2, -1))
    with pytest.raises(ShmemError, match=r"Accelerator\(0\)|pinned applies to host buffers"):
        Buffer("float32", 2, device="cuda:0", pinned=True)  # no GPU here, or not pinnable
    with pytest.raises(ValueError, match="only rank-0 buffers have an item"):
        Buffer("float32", 2).item()
    with pytest.raises(TypeError, match="len"):
        len(Buffer("float32", ()))
    assert len(Buffer("float32", (5, 2))) == 5
    b = Buffer("int8", 4)
    b.close()
    with pytest.raises(ShmemStateError, match="closed"):
        b.to_numpy()
    assert "closed" in repr(b)
    pinned = Buffer("float32", 4, pinned=True)  # no CUDA driver here: ordinary memory
    assert pinned.is_host
