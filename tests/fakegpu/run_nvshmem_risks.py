"""Three risks of the nvshmem backend (issue 42), one per run, at one rank on the fake driver
(tests/fakegpu/README.md), through the real nvshmem4py over the NVSHMEM stand-in, which
refuses what NVSHMEM refuses.

- ``big-heap``: a heap over NVSHMEM's default symmetric size (1 GiB): the backend sets
  ``NVSHMEM_SYMMETRIC_SIZE`` from it, and data lands past the first GiB.
- ``other-gpu``: another GPU current in this thread when the World calls NVSHMEM (a barrier,
  the teardown): the backend makes its own GPU current first.
- ``teardown``: the local teardown after an error (``with shmem.init(): raise``) frees the
  slab and finalizes NVSHMEM at one PE; nvshmem4py never reports it "freed implicitly".

Prints ``RISK <mode> ok`` last; any failure is a traceback and a non-zero exit.
"""

from __future__ import annotations

import gc
import os
import sys

import numpy as np

import shmem
import shmem.backends as _backends
import shmem.device.cuda.device as _c


def big_heap() -> None:
    w = shmem.init(backend="nvshmem", heap_nbytes="1280MiB", signal_timeout_s=5.0)
    assert os.environ["NVSHMEM_SYMMETRIC_SIZE"] == str((1280 + 64) << 20), os.environ
    assert w.heap.symmetric_nbytes == (1280 + 64) << 20  # type: ignore[attr-defined]
    big = w.empty(1200 << 20, "uint8")
    tail = w.zeros(16, "float32")
    assert tail.offset > 1 << 30, tail.offset
    tail.put(0, np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(tail.get(0), np.arange(16, dtype=np.float32))
    big.close()
    tail.close()
    w.finalize()


def other_gpu() -> None:
    from cuda.core import Device

    w = shmem.init(backend="nvshmem", heap_nbytes="16MiB", signal_timeout_s=5.0)
    mine = w.heap.device.id  # type: ignore[attr-defined]
    other = Device(1 - mine)
    other.set_current()  # the user's own work on the other GPU
    w.barrier()
    buf = w.zeros(8, "int64")
    buf.put(0, np.arange(8))
    other.set_current()
    np.testing.assert_array_equal(buf.get(0), np.arange(8))
    buf.close()
    other.set_current()
    w.finalize()


def teardown() -> None:
    import nvshmem.core as nv

    from tests.fakegpu.fakedriver import nvshmem_calls

    try:
        with shmem.init(backend="nvshmem", heap_nbytes="16MiB", signal_timeout_s=5.0) as w:
            w.zeros(8, "int64")
            raise KeyError("the user's own error")
    except KeyError:
        pass
    gc.collect()
    calls = nvshmem_calls()
    assert calls[-2:] == ["nvshmem_free", "nvshmemx_hostlib_finalize"], calls
    assert nv.init_status() == nv.InitStatus.STATUS_NOT_INITIALIZED


def main() -> None:
    _c._driver_present = lambda: True  # the fake libcuda stands in for a driver
    _c.device_count.cache_clear()
    _backends._nvshmem_status = lambda: None  # no /dev/nvidia*: nvshmem4py runs on the fake
    mode = sys.argv[1]
    {"big-heap": big_heap, "other-gpu": other_gpu, "teardown": teardown}[mode]()
    gc.collect()
    print(f"RISK {mode} ok", flush=True)


if __name__ == "__main__":
    main()
