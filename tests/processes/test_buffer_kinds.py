"""Every buffer kind speaks the same vocabulary and exports through the same DLPack producer.

Buffer, IpcBuffer (exported) and ImportedBuffer (imported back through the IPC service, which
runs in this process) x every supported dtype: the accessors, ``np.asarray`` (zero-copy),
``np.from_dlpack`` where numpy has the DLPack type, our own consumer for every dtype, and torch
when it is installed. SHMEMBuffer runs the same checks under MPI (tests/mpi/test_heap.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shmem import SUPPORTED_DTYPES, Buffer, DLPackDTypeError, ipc

pytestmark = pytest.mark.processes

# numpy's DLPack consumer has no bfloat16 or float8 type code (it raises, and np.asarray works)
NUMPY_DLPACK = [
    n for n in SUPPORTED_DTYPES if n not in ("bfloat16", "float8_e4m3", "float8_e5m2", "longdouble")
]


def _sample(
    dtype: np.dtype[np.generic], shape: tuple[int, ...]
) -> np.ndarray[tuple[int, ...], np.dtype[np.generic]]:
    values = np.arange(int(np.prod(shape))) % 7
    return values.astype(np.float32).astype(dtype).reshape(shape)


@pytest.fixture(params=["Buffer", "IpcBuffer", "ImportedBuffer"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _make(kind: str, dtype: np.dtype[np.generic], shape: tuple[int, ...]) -> Iterator[Buffer]:
    if kind == "Buffer":
        buf = Buffer(dtype, shape)
        buf.to_numpy()[...] = _sample(dtype, shape)
        yield buf
        return
    with ipc.allocate(shape, dtype) as exported:
        exported.array[...] = _sample(dtype, shape)
        if kind == "IpcBuffer":
            yield exported
            return
        with ipc.import_(ipc.export(exported)) as imported:
            yield imported


@pytest.mark.parametrize("name", list(SUPPORTED_DTYPES))
def test_one_vocabulary_and_one_producer(kind: str, name: str) -> None:
    dtype = SUPPORTED_DTYPES[name]
    shape = (3, 4)
    for buf in _make(kind, dtype, shape):
        assert isinstance(buf, Buffer)
        assert (buf.shape, buf.dtype, buf.ndim, buf.rank) == (shape, dtype, 2, 2)
        assert (buf.count, buf.num_elements, len(buf)) == (12, 12, 3)
        assert buf.nbytes == 12 * dtype.itemsize
        host = buf.to_numpy()
        want = _sample(dtype, shape)
        assert host.tobytes() == want.tobytes()
        arr = np.asarray(buf)  # zero-copy, every dtype (bfloat16 and float8 included)
        assert arr.dtype == dtype and arr.ctypes.data == host.ctypes.data
        if name == "longdouble":  # DLPack has no long double: refused clearly
            with pytest.raises(DLPackDTypeError, match="unsupported dtype"):
                Buffer.from_dlpack(buf)
            continue
        back = Buffer.from_dlpack(buf)  # our consumer of our producer: every dtype
        assert back.dtype == dtype and back.to_numpy().tobytes() == want.tobytes()
        assert back.to_numpy().ctypes.data == host.ctypes.data
        if name in NUMPY_DLPACK:
            got = np.from_dlpack(buf)
            assert got.dtype == dtype and got.ctypes.data == host.ctypes.data
        else:
            with pytest.raises((BufferError, RuntimeError), match="Unsupported dtype"):
                np.from_dlpack(buf)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64", "bool"])
def test_torch_takes_every_kind(kind: str, name: str) -> None:
    torch = pytest.importorskip("torch")
    dtype = SUPPORTED_DTYPES[name]
    for buf in _make(kind, dtype, (5,)):
        t = torch.from_dlpack(buf)
        assert t.shape == (5,) and t.data_ptr() == buf.to_numpy().ctypes.data
        if name == "bfloat16":
            assert t.dtype == torch.bfloat16
            assert t.float().numpy().tobytes() == buf.to_numpy().astype(np.float32).tobytes()


def test_ipc_buffers_keep_their_old_names() -> None:
    with ipc.allocate((4,), "float32") as b:
        assert b.buffer is b  # it is a Buffer now; .buffer stays for old callers
        assert np.shares_memory(b.array, b.to_numpy())
        assert b.kind == "host" and b.closed is False
        assert repr(b).startswith("IpcBuffer(shape=(4,)")
    assert b.closed
