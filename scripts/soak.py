"""A seeded random soak: heap, RMA, atomics, signals and every collective, each checked against a
bitwise reference, then a leak check (heap, file descriptors, threads, /dev/shm, RSS).

    python -m launch -n 4 scripts/soak.py --seconds 300 --seed 7
    SHMEM_HEAP_NODE_SPLIT=rank python -m launch -n 3 scripts/soak.py --ops 5000

Every rank draws the same operation sequence from ``--seed`` (collective calls must match);
data comes from per-rank seeds. The collectives (all_reduce, reduce_scatter, all_gather,
broadcast, all_to_all, collect, barrier) take sizes drawn log-uniformly from 0 to
``--max-count`` elements (so every plan cache fills and evicts), a random dtype and op,
and on each rank its own kind of input (numpy, strided numpy or a SHMEMBuffer) and output
(a new array, a numpy or symmetric ``out``, or in place). Reductions reduce small integers,
exactly representable in every dtype and accumulation order, so the reference is exact.
Prints ``soak ok: N operations ...`` on rank 0, or raises with the operation number.
``tests/mpi/test_soak.py`` runs the short form in CI; ``docs/reliability.md`` the long one.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import procmem  # (scripts/: the launcher runs this file, so its folder is on sys.path)

import collectives
import shmem
from collectives.schedule import shard_bounds

KINDS = ("alloc", "free", "put_get", "iput", "nbi", "atomic", "signal", "collective")
COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
    "collect",
    "barrier",
)
REDUCED: tuple[str, ...] = ("float32", "float64", "float16", "bfloat16", "int8", "int32")
REDUCED += ("int64", "uint8", "uint32", "complex64")
MOVED = (*REDUCED, "bool", "float8_e4m3", "uint64", "complex128", "int16")
FLOAT_OPS = ("sum", "min", "max", "avg")
INT_OPS = ("sum", "prod", "min", "max", "band", "bor", "bxor")
INPUTS = ("numpy", "strided", "symmetric")
OUTPUTS = ("new", "numpy", "symmetric", "in_place")
MAX_COUNT = 1_500_000


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
    """The /dev/shm files this process maps or holds open (another job's, on a shared
    machine, are not this one's leak)."""
    names: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.partition("/")[2]
            if path.startswith("dev/shm/"):
                names.add(path.removeprefix("dev/shm/").removesuffix(" (deleted)"))
    with contextlib.suppress(OSError):
        for fd in Path("/proc/self/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    names.add(target.removeprefix("/dev/shm/").removesuffix(" (deleted)"))
    return names


def _count(rng: np.random.Generator, max_count: int) -> int:
    """A count from 0 to ``max_count``, log-uniform (most calls small, a few large)."""
    return int(math.exp(rng.uniform(0.0, math.log(max_count + 1)))) - 1


def _values(mine: np.random.Generator, n: int, dtype: np.dtype[Any], small: bool) -> Any:
    """``n`` values of ``dtype``: integers in a range every dtype holds exactly (a
    reduction of up to 8 ranks of them is exact in any order: ``small``)."""
    lo, hi = (0, 4) if small else (0, 100)
    if not small and dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -100
    elif small and dtype.kind in "ifc":
        lo = -4 if dtype.kind != "u" else 0
    return mine.integers(lo, hi + 1, n).astype(dtype)


def _reference(
    kind: str, inputs: list[Any], op: str, acc: np.dtype[Any], root: int, me: int
) -> Any:
    """The expected result of ``kind`` on every rank's input (rank order)."""
    p, dtype = len(inputs), inputs[0].dtype
    if kind in ("all_reduce", "reduce_scatter"):
        ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum}
        ufunc.update({"max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or})
        ufunc["bxor"] = np.bitwise_xor
        total = inputs[0].astype(acc)
        for x in inputs[1:]:
            total = ufunc[op](total, x.astype(acc))
        if op == "avg":
            total = total / acc.type(p)
        total = total.astype(dtype)
        if kind == "reduce_scatter":
            a, b = shard_bounds(total.size, p)[me]
            return total[a:b]
        return total
    if kind == "all_gather":
        return np.concatenate(inputs)
    if kind == "collect":
        return np.concatenate(inputs)
    if kind == "broadcast":
        return inputs[root]
    c = inputs[0].size // p  # all_to_all: chunk `me` of every rank, in rank order
    return np.concatenate([x[me * c : (me + 1) * c] for x in inputs])


def _collective(
    world: shmem.World,
    comm: collectives.Communicator,
    rng: np.random.Generator,
    mine: np.random.Generator,
    max_count: int,
    recent: dict[str, list[tuple[str, str, list[int], int]]],
    where: str,
    names: tuple[str, ...] = COLLECTIVES,
) -> str:
    """One random collective, checked bitwise on every rank; its name (for the counts).
    Half the calls repeat one of the kind's last 8 shapes (``recent``: dtype, op, counts,
    root), as programs do: a plan replays, or is made again after its eviction."""
    p, me = world.world_size, world.rank
    kind = names[int(rng.integers(len(names)))]
    if kind == "barrier":
        comm.barrier()
        return kind
    reducing = kind in ("all_reduce", "reduce_scatter")
    shapes = recent.setdefault(kind, [])
    if shapes and rng.random() < 0.5:  # a shape seen lately: its plan replays, or was evicted
        name, op, counts, root = shapes[int(rng.integers(len(shapes)))]
    else:
        name = str(rng.choice(REDUCED if reducing else MOVED))
        op = "sum"
        if reducing:
            kind_of = np.dtype(shmem.SUPPORTED_DTYPES[name]).kind
            ops = ("sum",) if kind_of == "c" else INT_OPS if kind_of in "iu" else FLOAT_OPS
            op = str(rng.choice(ops))
        counts = [_count(rng, max_count) for _ in range(p)]  # collect: each rank its own
        root = int(rng.integers(p))
        shapes.append((name, op, counts, root))
        del shapes[:-8]
    dtype = np.dtype(shmem.SUPPORTED_DTYPES[name])
    n = counts[0] if kind != "collect" else counts[me]
    if kind == "all_to_all":
        n -= n % p
    # each rank its own kind of input and output (drawn from the shared schedule, so the
    # symmetric buffers every rank allocates, collectively, are the same)
    forms = [(str(rng.choice(INPUTS)), str(rng.choice(OUTPUTS))) for _ in range(p)]
    form_in, form_out = forms[me]
    out_n = {"all_gather": n * p, "collect": sum(counts)}.get(kind, n)
    if kind == "reduce_scatter":
        a, b = shard_bounds(n, p)[me]
        out_n = b - a
    if form_out == "in_place" and out_n != n:
        form_out = "symmetric"
    if form_in == "strided" and (form_out == "in_place" or kind == "broadcast"):
        form_in = "numpy"  # (out, a broadcast's x by default, must be contiguous)
    x = _values(mine, n, dtype, reducing)  # kept as it is: the reference's input
    max_in = max(counts) if kind == "collect" else n
    with (
        world.zeros(max(max_in, 1), dtype) as sym_in,
        world.zeros(max(max_in * p, 1), dtype) as sym_out,
    ):
        arg: Any = x.copy()
        if form_in == "strided":
            arg = np.zeros(2 * n, dtype)[::2]
            arg[...] = x
        elif form_in == "symmetric":
            view = sym_in.local().reshape(-1)[:n]
            view[...] = x
            arg = sym_in if sym_in.count == n else view  # (a smaller count: a view of it)
        out: Any = None
        if form_out == "numpy":
            out = np.empty(out_n, dtype)
        elif form_out == "symmetric":
            out = sym_out if sym_out.count == out_n else sym_out.local().reshape(-1)[:out_n]
        elif form_out == "in_place":
            out = arg
        extra: tuple[Any, ...] = (op,) if reducing else (root,) if kind == "broadcast" else ()
        got = getattr(comm, kind)(arg, *extra, out=out)
        if out is not None and got is not out:
            raise AssertionError(f"{where}: {kind} did not return its out")
        result = np.array(got.local() if isinstance(got, shmem.SHMEMBuffer) else got).reshape(-1)
    inputs = _allgather(world, x)
    acc = comm.accumulate_dtype(dtype) if reducing else dtype
    want = _reference(kind, inputs, op, acc, root, me)
    if result.dtype != want.dtype or result.tobytes() != want.tobytes():
        raise AssertionError(
            f"{where}: rank {me}'s {kind}({n} {dtype}, op={op}, root={root}, {form_in} in, "
            f"{form_out} out) differs from the reference"
        )
    return kind


def soak(
    world: shmem.World,
    ops: int,
    seed: int,
    *,
    seconds: float | None = None,
    max_count: int = MAX_COUNT,
    plan_cache: int | None = None,
    kinds: tuple[str, ...] = KINDS,
    names: tuple[str, ...] = COLLECTIVES,
) -> dict[str, int]:
    """Run ``ops`` random operations (or, with ``seconds``, as many as fit: rank 0's clock
    decides, agreed every 10 operations); return counters. Collective: every rank calls it.
    ``plan_cache``: the Communicator's plan cache holds this many shapes (default 64), so a
    short run evicts too. ``kinds`` and ``names``: the operations and collectives drawn
    (allocations and frees happen as the others need them), to find which one leaks."""
    rng = np.random.default_rng(seed)  # the same on every rank: the schedule
    mine = np.random.default_rng(seed * 1000 + world.rank + 1)  # this rank's data
    p, me = world.world_size, world.rank
    right, left = (me + 1) % p, (me - 1) % p
    heap0 = world.heap_stats()
    comm = collectives.Communicator(world)
    if plan_cache is not None and comm.host_channel is not None:
        comm.host_channel.max_plans = plan_cache
    live: list[shmem.SHMEMBuffer] = []
    counts = dict.fromkeys(KINDS + COLLECTIVES, 0)
    recent: dict[str, list[tuple[str, str, list[int], int]]] = {}
    sig = world.zeros(2, "uint64")
    start = time.monotonic()
    for i in range(ops if seconds is None else 1 << 62):
        over = seconds is not None and i % 10 == 0 and time.monotonic() - start > seconds
        if seconds is not None and i % 10 == 0 and _allgather(world, over)[0]:
            break
        kind = kinds[int(rng.integers(len(kinds)))]
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
            _rma(world, live[int(rng.integers(len(live)))], kind, mine, right, left, where)
        elif kind == "atomic":
            ints = [b for b in live if b.dtype in (np.dtype("int64"), np.dtype("uint32"))]
            if ints:
                _atomic(world, ints[0], int(rng.integers(ints[0].count)), where)
        elif kind == "signal":
            target = counts["signal"]  # the same on every rank: the schedule's count
            sig.signal(right, target, "set")
            if sig.signal_wait_until("ge", target) != target:
                raise AssertionError(f"{where}: the signal overshot")
            world.barrier()
        else:
            counts[_collective(world, comm, rng, mine, max_count, recent, where, names)] += 1
    for buf in live:
        buf.close()
    sig.close()
    comm.close()
    if world.heap_stats() != heap0:
        raise AssertionError(f"soak: the heap did not return to its baseline ({heap0})")
    return counts


def _rma(
    world: shmem.World,
    buf: shmem.SHMEMBuffer,
    kind: str,
    mine: np.random.Generator,
    right: int,
    left: int,
    where: str,
) -> None:
    """A put to the right-hand neighbour (whole, strided in two halves, or non-blocking),
    checked on the receiving side against what its left-hand neighbour sent."""
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
        raise AssertionError(f"{where}: rank {world.rank} holds the wrong data from rank {left}")
    del seen
    world.barrier()


def _atomic(world: shmem.World, buf: shmem.SHMEMBuffer, index: int, where: str) -> None:
    """Every rank adds 1 to rank 0's element ``index``: all of them land."""
    p = world.world_size
    world.barrier()
    before = buf.g(0, index)
    world.barrier()
    buf.atomic_add(0, index, 1)
    world.barrier()
    if buf.g(0, index) != (before + p) % (1 << (8 * buf.dtype.itemsize)):
        raise AssertionError(f"{where}: {p} atomic adds did not all land")
    world.barrier()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=None, help="run this long instead of --ops")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-count", type=int, default=MAX_COUNT, help="largest collective count")
    ap.add_argument("--rss-growth-mib", type=float, default=64.0)
    ap.add_argument("--kinds", default=",".join(KINDS), help="operations drawn (comma-separated)")
    ap.add_argument(
        "--collectives", default=",".join(COLLECTIVES), help="collectives drawn (comma-separated)"
    )
    args = ap.parse_args()
    kinds, names = tuple(args.kinds.split(",")), tuple(args.collectives.split(","))
    for given, known in ((kinds, KINDS), (names, COLLECTIVES)):
        if unknown := sorted(set(given) - set(known)):
            ap.error(f"unknown operations {unknown} (expected some of {', '.join(known)})")
    procmem.steady_malloc()
    with shmem.init(heap_nbytes="256MiB") as world:
        # warm up: caches, plans, the IPC-free paths
        soak(world, 50, args.seed + 1, max_count=args.max_count, kinds=kinds, names=names)
        # a first third, then the measures, then the rest: caches fill in the first part,
        # so memory still growing in the rest is a leak (sizes are random: so is a peak)
        t0 = time.monotonic()
        third = None if args.seconds is None else args.seconds / 3
        counts = soak(
            world, args.ops // 3, args.seed, seconds=third, max_count=args.max_count,
            kinds=kinds, names=names,
        )  # fmt: skip
        fds, threads, shm, rss = (
            _fds(),
            threading.active_count(),
            _shm_files(),
            procmem.private_kib(world.heap),
        )
        rest = None if args.seconds is None else args.seconds - args.seconds / 3
        more = soak(
            world, args.ops - args.ops // 3, args.seed + 2, seconds=rest,
            max_count=args.max_count, kinds=kinds, names=names,
        )  # fmt: skip
        counts = {k: counts[k] + more[k] for k in counts}
        took = time.monotonic() - t0
        grew = (procmem.private_kib(world.heap) - rss) / 1024
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
            done = sum(counts[k] for k in KINDS)
            print(
                f"soak ok: {done} operations in {took:.0f} s on {world.world_size} ranks "
                f"({world.num_nodes} node(s)), seed {args.seed}: {counts}; RSS +{grew:.1f} MiB"
            )


if __name__ == "__main__":
    main()
