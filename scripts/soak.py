"""A seeded random soak: heap, RMA, atomics, signals and collectives, each checked against a
bitwise reference, then a leak check (heap, file descriptors, threads, /dev/shm, RSS).

    python -m launch -n 4 scripts/soak.py --ops 20000 --seed 7
    SHMEM_HEAP_NODE_SPLIT=rank python -m launch -n 3 scripts/soak.py --ops 5000

Every rank draws the same operation sequence from ``--seed`` (collective calls must match);
data comes from per-rank seeds. Prints ``soak ok: N operations ...`` on rank 0, or raises with
the operation number. ``tests/mpi/test_soak.py`` runs the short form in CI.
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
from pathlib import Path
from typing import Any

import numpy as np

import collectives
import shmem

KINDS = ("alloc", "free", "put_get", "iput", "nbi", "atomic", "signal", "all_reduce", "gather")


def _allgather(world: shmem.World, obj: Any) -> list[Any]:
    """``allgather`` for the references without blocking in MPI: on the RMA path a rank
    still finishing a barrier's signal needs its peers' MPI progress (they poll here)."""
    from shmem.agreement import allgather_within

    return allgather_within(
        world.comm, obj, world.config.signal.timeout_s, "soak", world.heap.progress
    )


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _shm_files() -> set[str]:
    try:
        return {p.name for p in Path("/dev/shm").iterdir()}
    except OSError:
        return set()


def _rss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def soak(world: shmem.World, ops: int, seed: int) -> dict[str, Any]:
    """Run ``ops`` random operations; return counters. Collective: every rank calls it."""
    rng = np.random.default_rng(seed)  # the same on every rank: the schedule
    mine = np.random.default_rng(seed * 1000 + world.rank + 1)  # this rank's data
    p, me = world.world_size, world.rank
    right, left = (me + 1) % p, (me - 1) % p
    heap0 = world.heap_stats()
    comm = collectives.Communicator(world)
    live: list[shmem.SHMEMBuffer] = []
    counts = dict.fromkeys(KINDS, 0)
    sig = world.zeros(2, "uint64")
    for i in range(ops):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        if kind in ("free", "put_get", "iput", "nbi", "atomic") and not live:
            kind = "alloc"
        if kind == "alloc" and len(live) >= 16:
            kind = "free"
        counts[kind] += 1
        where = f"soak op {i} ({kind})"
        if kind == "alloc":
            n = int(rng.choice([1, 7, 64, 1000, 1 << 14]))
            dtype = str(rng.choice(["float32", "int64", "uint32", "bfloat16", "complex64"]))
            live.append(world.zeros(n, dtype))
        elif kind == "free":
            live.pop(int(rng.integers(len(live)))).close()
        elif kind in ("put_get", "iput", "nbi"):
            buf = live[int(rng.integers(len(live)))]
            data = mine.integers(0, 100, buf.count).astype(buf.dtype)
            if kind == "put_get":
                buf.put(right, data)
            elif kind == "iput":
                data[1::2] = 0
                buf.iput(right, data[::2], stride=2)  # the even elements
                buf.iput(right, data[1::2], stride=2, index=1)  # the odd ones (zeros)
            else:
                buf.put_nbi(right, data)
                world.quiet()
            world.barrier()
            expect = _allgather(world, data)[left]
            seen = buf.local().reshape(-1)  # zero-copy; dropped below, so close() frees
            if seen.tobytes() != np.asarray(expect).tobytes():
                raise AssertionError(f"{where}: rank {me} holds the wrong data from rank {left}")
            del seen
            world.barrier()
        elif kind == "atomic":
            ints = [b for b in live if b.dtype in (np.dtype("int64"), np.dtype("uint32"))]
            if not ints:
                continue
            buf = ints[0]
            index = int(rng.integers(buf.count))
            world.barrier()
            before = buf.g(0, index)
            world.barrier()
            buf.atomic_add(0, index, 1)
            world.barrier()
            if buf.g(0, index) != (before + p) % (1 << (8 * buf.dtype.itemsize)):
                raise AssertionError(f"{where}: {p} atomic adds did not all land")
            world.barrier()
        elif kind == "signal":
            target = counts["signal"]  # the same on every rank: the schedule's count
            sig.signal(right, target, "set")
            if sig.signal_wait_until("ge", target) != target:
                raise AssertionError(f"{where}: the signal overshot")
            world.barrier()
        elif kind == "all_reduce":
            n = int(rng.choice([1, 3, 1000, 70000]))
            x = mine.integers(-50, 50, n).astype(np.int64)
            got = comm.all_reduce(x)
            want = np.sum(np.stack(_allgather(world, x)), axis=0)
            if got.tobytes() != want.tobytes():
                raise AssertionError(f"{where}: the all-reduce differs from the reference")
        else:
            n = int(rng.choice([1, 5, 333]))
            x = mine.integers(0, 1 << 30, n).astype(np.int32)
            got = comm.all_gather(x)
            if got.tobytes() != np.concatenate(_allgather(world, x)).tobytes():
                raise AssertionError(f"{where}: the all-gather differs from the reference")
    for buf in live:
        buf.close()
    sig.close()
    comm.close()
    if world.heap_stats() != heap0:
        raise AssertionError(f"soak: the heap did not return to its baseline ({heap0})")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rss-growth-mib", type=float, default=64.0)
    args = ap.parse_args()
    with shmem.init(heap_nbytes="64MiB") as world:
        soak(world, 50, args.seed + 1)  # warm up: caches, plans, the IPC-free paths
        fds, threads, shm, rss = _fds(), threading.active_count(), _shm_files(), _rss_kib()
        counts = soak(world, args.ops, args.seed)
        grew = (_rss_kib() - rss) / 1024
        leaks = []
        if _fds() > fds:
            leaks.append(f"file descriptors {fds} -> {_fds()}")
        if threading.active_count() > threads:
            leaks.append(f"threads {threads} -> {threading.active_count()}")
        if grew > args.rss_growth_mib:
            leaks.append(f"RSS grew {grew:.0f} MiB")
        new_shm = _shm_files() - shm
        if new_shm:
            leaks.append(f"/dev/shm gained {sorted(new_shm)}")
        every = _allgather(world, leaks)
        bad = [(r, x) for r, x in enumerate(every) if x]
        if bad:
            raise AssertionError(f"soak: leaks: {bad}")
        if world.rank == 0:
            print(
                f"soak ok: {args.ops} operations on {world.world_size} ranks "
                f"({world.num_nodes} node(s)), seed {args.seed}: {counts}; RSS +{grew:.1f} MiB"
            )


if __name__ == "__main__":
    main()
