"""What the NVSHMEM stand-in refuses, as NVSHMEM does (tests/fakegpu/README.md): one mode a
run, under the launcher on the fake driver. Each mode prints ``REACHED <mode>`` and then makes
one call that NVSHMEM (the stand-in: a ``fake nvshmem: REFUSED <function>`` line and exit
status 255, as NVSHMEM's fatal errors) or nvshmem4py itself (an exception, then ``REFUSED by
nvshmem4py`` and exit 0) refuses. A mode whose call is not refused prints ``NOT REFUSED`` and
exits 1.

- ``foreign-source`` (2 ranks, every rank its own node): a put to a PE of another node from
  device memory NVSHMEM did not allocate nor register;
- ``not-symmetric`` (1 rank): a put whose destination is not on the symmetric heap;
- ``not-allocated`` (1 rank): a free of a heap address nvshmem_malloc did not give;
- ``after-finalize`` (1 rank): a barrier on a stream after NVSHMEM is finalized;
- ``other-device`` (1 rank, 2 GPUs): a barrier made while another GPU is current;
- ``stream-none`` (1 rank): a put without a stream (nvshmem4py's own refusal);
- ``registered-source`` (2 ranks, every rank its own node): the put of ``foreign-source``
  from the same memory once registered (``register_external_buffer``), which NVSHMEM accepts:
  prints ``ACCEPTED``, and the data arrives.
"""

from __future__ import annotations

import sys
from typing import Any

import shmem
import shmem.backends as _backends
import shmem.device.cuda.device as _c


def main() -> int:
    _c._driver_present = lambda: True  # the fake libcuda stands in for a driver
    _c.device_count.cache_clear()
    _backends._nvshmem_status = lambda: None  # no /dev/nvidia*: nvshmem4py runs on the fake
    import nvshmem.core as nv
    from cuda.core import Device
    from nvshmem import bindings

    mode = sys.argv[1]
    w = shmem.init(backend="nvshmem", heap_nbytes="16MiB", signal_timeout_s=10.0)
    heap: Any = w.heap
    slab = heap._cc_buffer(heap.base, 4096)
    plain = heap.gpu.current().allocate(4096, stream=heap.stream)  # memory NVSHMEM never saw
    w.barrier()
    print(f"REACHED {mode}", flush=True)
    try:
        if mode == "foreign-source":
            nv.put(slab, plain, remote_pe=(w.rank + 1) % w.world_size, stream=heap.stream)
        elif mode == "not-symmetric":
            nv.put(plain, slab, remote_pe=0, stream=heap.stream)
        elif mode == "not-allocated":
            bindings.free(heap.base + 512)
        elif mode == "after-finalize":
            stream = heap.gpu.current().create_stream()  # (the World closes its own)
            w.finalize()
            nv.barrier_all(stream)
        elif mode == "other-device":
            Device(1 - heap.device.id).set_current()
            nv.barrier_all(heap.stream)
        elif mode == "stream-none":
            nv.put(slab, plain, remote_pe=0, stream=None)
        elif mode == "registered-source":
            return _registered(w, heap, plain)
        else:
            raise SystemExit(f"run_nvshmem_refusals.py: unknown mode {mode!r}")
        heap.stream.sync()
    except (NotImplementedError, nv.NvshmemInvalid, nv.NvshmemError) as exc:
        print(f"REFUSED by nvshmem4py: {type(exc).__name__}: {exc}", flush=True)
        w.finalize()
        return 0
    print("NOT REFUSED", flush=True)
    return 1


def _registered(w: shmem.World, heap: Any, plain: Any) -> int:
    import numpy as np
    import nvshmem.core as nv

    peer = (w.rank + 1) % w.world_size
    data = np.arange(512, dtype=np.int64) + 1000 * w.rank
    heap.memcpy(int(plain.handle), int(data.ctypes.data), 4096)
    known = nv.register_external_buffer(plain)  # collective
    dst = heap._cc_buffer(heap.base + 4096, 4096)
    nv.put(dst, known, remote_pe=peer, stream=heap.stream)
    nv.quiet(stream=heap.stream)
    heap.stream.sync()
    w.barrier()
    got = np.zeros(512, np.int64)
    heap.memcpy(int(got.ctypes.data), heap.base + 4096, 4096)
    heap.stream.sync()
    src = (w.rank - 1) % w.world_size
    assert np.array_equal(got, np.arange(512) + 1000 * src), got[:4]
    nv.unregister_external_buffer(known)  # collective
    print(f"ACCEPTED registered-source on rank {w.rank}", flush=True)
    w.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
