"""The nvshmem backend with peers on other nodes, on the fake driver and the NVSHMEM stand-in
(tests/fakegpu/README.md; issue 42, risks 1 and 2). Run under the launcher at any size with
``FAKE_NVSHMEM_NODE_SPLIT`` (the stand-in's nodes: ``rank``, or K consecutive PEs) and
``SHMEM_HEAP_NODE_SPLIT`` (the World's) set alike; the stand-in gives no pointer to a PE on
another node, so data and signals to it go through NVSHMEM as over a network.

- which peers are mapped: exactly those of this rank's node;
- risk 1: data to and from every peer from host memory, from a device Buffer outside the heap
  and from the symmetric heap, small and larger than the 4 MiB stage (the stand-in refuses a
  network put or get whose local side NVSHMEM does not know, as a network transport does);
- risk 2: every rank adds to every rank's signal word at once (itself included), and each
  sees every addition (the stand-in's network atomics lose a GPU atomic that falls between
  their read and their write, as a NIC's can);
- the barrier across nodes; an atomic on a rank of another node refused with its reason.

Rank 0 prints ``NODES ok on ranks [...]`` last, once every rank is done; any failure is a
traceback and a non-zero exit.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

import shmem
import shmem.backends as _backends
import shmem.device.cuda.device as _c
from shmem.errors import NvshmemError

ROUNDS = 40  # additions per rank and target word (risk 2)


def node_of(rank: int, split: str) -> int:
    return rank if split == "rank" else rank // int(split)


def pattern(src: int, dst: int, count: int) -> np.ndarray:
    return np.arange(count, dtype=np.int64) + (src * 64 + dst) * 10_000_000


def exchange(w: shmem.World, count: int) -> None:
    """Each rank writes its segment of every peer's buffer from three kinds of source, and
    reads every peer's segment back into three kinds of destination."""
    heap: Any = w.heap
    me, n = w.rank, w.world_size
    buf = w.zeros(count * n, "int64")
    seg = count * 8
    sym = w.zeros(count, "int64")  # a source and destination on the symmetric heap
    dev = shmem.Buffer("int64", count, device=heap.device)  # device memory NVSHMEM never saw
    for kind in ("numpy", "device", "heap"):
        for p in range(n):
            data = pattern(me, p, count) + len(kind)
            if kind == "numpy":
                buf.put(p, data, offset=me * seg)
            elif kind == "device":
                dev.inplace_copy_from(shmem.Buffer.from_numpy(data))
                buf.put(p, dev, offset=me * seg)
            else:
                sym.put(me, data)
                buf.put(p, sym.local(), offset=me * seg)
        w.barrier()
        mine = buf.get(me)
        for s in range(n):
            got = mine[s * count : (s + 1) * count]
            want = pattern(s, me, count) + len(kind)
            assert np.array_equal(got, want), (kind, count, s, me, got[:4], want[:4])
        for p in range(n):  # read back what this rank wrote there
            want = pattern(me, p, count) + len(kind)
            if kind == "numpy":
                got = buf.get(p)[me * count : (me + 1) * count]
            elif kind == "device":
                whole = shmem.Buffer("int64", count * n, device=heap.device)
                got = buf.get(p, whole).to_numpy()[me * count : (me + 1) * count]
            else:
                part = w.zeros(count * n, "int64")
                got = buf.get(p, part.local()).to_numpy()[me * count : (me + 1) * count]
                w.barrier()
                part.close()
            assert np.array_equal(got, want), ("get", kind, count, p, me, got[:4], want[:4])
        w.barrier()
    sym.close()
    buf.close()


def signals(w: shmem.World) -> None:
    """Every rank adds 1 to slot 5 of every rank ROUNDS times, interleaved; each waits for all."""
    me, n = w.rank, w.world_size
    for i in range(ROUNDS):
        for k in range(n):
            w.signal((me + k + i) % n, 5, 1, "add")
    seen = w.wait_until(5, "eq", ROUNDS * n, timeout=30.0)
    assert seen == ROUNDS * n, seen
    w.barrier()


def main() -> None:
    _c._driver_present = lambda: True  # the fake libcuda stands in for a driver
    _c.device_count.cache_clear()
    _backends._nvshmem_status = lambda: None  # no /dev/nvidia*: nvshmem4py runs on the fake
    split = os.environ["FAKE_NVSHMEM_NODE_SPLIT"]
    assert os.environ.get("SHMEM_HEAP_NODE_SPLIT") == split, "set both splits alike"
    w = shmem.init(backend="nvshmem", heap_nbytes="96MiB", signal_timeout_s=30.0)
    heap = w.heap
    me, n = w.rank, w.world_size
    same = {r for r in range(n) if node_of(r, split) == node_of(me, split)}
    assert {r for r in range(n) if heap.is_local(r)} == same, (me, same)
    assert heap.remote_peers == (len(same) < n)  # type: ignore[attr-defined]
    assert w.num_nodes == len({node_of(r, split) for r in range(n)})
    exchange(w, 100)
    exchange(w, (5 << 20) // 8)  # 5 MiB a segment: two passes through the stage
    signals(w)
    ctr = w.zeros(1, "int64")
    for p in range(n):
        if p in same:
            ctr.atomic_fetch_add(p, 0, 1)
            continue
        try:
            ctr.atomic_fetch_add(p, 0, 1)
        except NvshmemError as exc:
            assert "not reachable by load/store" in str(exc), exc
        else:
            raise AssertionError(f"an atomic on rank {p} of another node was not refused")
    w.barrier()
    assert int(ctr.get(me)[0]) == len(same), (ctr.get(me), same)
    ctr.close()
    from mpi4py import MPI

    done = MPI.COMM_WORLD.allgather(me)  # every rank got here
    w.finalize()
    if me == 0:  # (the launcher shows rank 0's output)
        print(f"NODES ok on ranks {done} of {n} (split {split})", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
