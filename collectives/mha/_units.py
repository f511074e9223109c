"""The cross-rank scheduler that runs sequence-parallel attention's work units (the units
and their plan are in ``_plan.py``).

The driver (:func:`drive`) runs on the rank's main thread, which does every MPI and heap
operation; compute goes to worker threads. It takes units from its own queue, then (dynamic)
from the other ranks' queues, each through a fetch-and-add on that queue's counter in
symmetric memory, so every unit is taken exactly once. The next unit is taken and its inputs
are fetched (peer views, or one-sided gets into a small cache) while the current one computes.
A result is written into a slot on its home rank (directly by the computing thread when the
home is load/store reachable) and announced by a per-slot flag; a home folds its slots into
its outputs in a fixed order as they arrive (while it waits for its own compute), so the
result does not depend on which rank computed what.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

import numpy as np

from shmem.errors import PeerFailedError, SignalTimeoutError
from shmem.signals import poll_until

from ._plan import Chunk, Unit, UnitPlan, pieces, runs

__all__ = [
    "COUNTERS",
    "Chunk",
    "OrderedFolds",
    "PeerFailedError",
    "RowReader",
    "SequenceParallelStats",
    "Unit",
    "UnitPlan",
    "Words",
    "beat",
    "check_peers",
    "drive",
    "finish",
    "guarded",
    "pieces",
    "publish",
    "ready",
    "runs",
    "wait_for",
]

# every rank's int64 counters: its queue; ranks done; the first failed rank + 1; ranks whose
# inputs are written; (rank 0 only) units completed anywhere, a heartbeat for the deadlines
TAKE, DONE, ABORT, READY, BEAT = 0, 1, 2, 3, 4
COUNTERS = 5


@dataclass
class SequenceParallelStats:
    """What one rank did in one call (filled in by ``sequence_parallel_attention`` and its
    backward when passed as ``stats=``).

    ``busy_s`` is the time in tile compute (summed over worker threads, divided by their
    number), ``idle_s`` the rest of the call's wall time (waiting, moving data, merging).
    ``units_taken`` counts units this rank computed from other ranks' queues, and
    ``units_given`` units of its own queue that other ranks computed. ``busy_per_rank`` is
    every rank's ``busy_s``, so :attr:`imbalance` is the same on every rank.

    Parameters
    ----------
    schedule : str, default ""
        The schedule that ran: ``"dynamic"``, ``"ring"`` or ``"zigzag"``.
    wall_s : float, default 0.0
        The call's wall time in seconds.
    busy_s : float, default 0.0
        Seconds of tile compute (summed over worker threads, divided by their number).
    idle_s : float, default 0.0
        The rest of ``wall_s``: waiting, moving data, merging.
    units : int, default 0
        Work units in this rank's own queue (``ring``, ``zigzag``: the units it computed).
    units_computed : int, default 0
        Units this rank computed, its own and other ranks' together.
    units_taken : int, default 0
        Units this rank computed from other ranks' queues.
    units_given : int, default 0
        Units of this rank's queue that other ranks computed.
    threads : int, default 0
        Worker threads that computed tiles on this rank.
    busy_per_rank : tuple of float, default ()
        Every rank's ``busy_s``, indexed by rank.
    """

    schedule: str = ""
    wall_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    units: int = 0
    units_computed: int = 0
    units_taken: int = 0
    units_given: int = 0
    threads: int = 0
    busy_per_rank: tuple[float, ...] = ()

    @property
    def imbalance(self) -> float:
        """max / mean of every rank's busy time (1.0: perfectly balanced)."""
        if not self.busy_per_rank or sum(self.busy_per_rank) == 0:
            return 1.0
        mean = sum(self.busy_per_rank) / len(self.busy_per_rank)
        return max(self.busy_per_rank) / mean


class RowReader:
    """Rows of symmetric buffers on any rank: zero-copy peer views where reachable, else
    one-sided gets into a small LRU cache (so a rank never holds more than ``capacity``
    fetched chunks). ``alloc(shape, dtype)`` makes the arrays gets land in (default numpy;
    GPU Buffers on the nvshmem backend)."""

    def __init__(self, capacity: int = 6, alloc: Callable[..., Any] | None = None) -> None:
        self._views: dict[tuple[int, int], Any] = {}
        self._cache: OrderedDict[tuple[int, int, int, int], Any] = OrderedDict()
        self._capacity = capacity
        self._alloc = alloc or np.empty

    def rows(self, buf: Any, rank: int, lo: int, hi: int) -> Any:
        key = (id(buf), rank)
        if key not in self._views:
            self._views[key] = buf.peer(rank)
        view = self._views[key]
        if view is not None:
            return view[lo:hi]
        ckey = (id(buf), rank, lo, hi)
        hit = self._cache.get(ckey)
        if hit is not None:
            self._cache.move_to_end(ckey)
            return hit
        dst = self._alloc((hi - lo, *buf.shape[1:]), buf.dtype)
        row_bytes = dst[:1].nbytes if hi > lo else 0
        if hi > lo:
            buf.get(rank, dst, offset=lo * row_bytes)
        self._cache[ckey] = dst
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return dst


class Words:
    """This rank's words of a symmetric int64 buffer (counters, flags): loads where the
    buffer is host memory, atomic fetches where it is GPU memory (the nvshmem backend, whose
    words the host cannot load)."""

    def __init__(self, buf: Any, me: int) -> None:
        local = buf.local()
        self._host = local if isinstance(local, np.ndarray) else None
        self._buf, self._me = buf, me

    def __getitem__(self, i: int) -> int:
        if self._host is not None:
            return int(self._host[i])
        return int(self._buf.atomic_fetch_add(self._me, i, 0))


class OrderedFolds:
    """A home rank's result slots, folded into its outputs in a fixed order as they arrive.

    ``groups`` are lists of ``(slot index, fold)``; within a group, slots fold strictly in
    list order (so the result does not depend on arrival order), groups independently. The
    main thread folds while the workers compute, so little is left when the last unit ends.
    """

    def __init__(
        self, world: Any, flags: Any, groups: list[list[tuple[int, Callable[[], None]]]]
    ) -> None:
        self._fence = world.heap.fence
        self._flags = Words(flags, world.rank)
        self._groups = [deque(g) for g in groups if g]
        self.remaining = sum(len(g) for g in self._groups)

    def step(self) -> bool:
        """Fold one arrived slot that is next in its group; False when none is ready."""
        for group in self._groups:
            slot, fold = group[0]
            if self._flags[slot]:
                self._fence()  # acquire: the slot's data was written before its flag
                fold()
                group.popleft()
                self.remaining -= 1
                if not group:
                    self._groups.remove(group)
                return True
        return False

    def drain(self) -> bool:
        """Fold everything ready; True when every slot has been folded."""
        while self.step():
            pass
        return self.remaining == 0


def publish(world: Any, flags: Any, home: int, slot: int) -> None:
    """Raise ``home``'s flag for ``slot``, after (release) the slot's data."""
    world.heap.fence()
    flags.put(home, _ONE, offset=slot * _ONE.itemsize)


_ONE = np.ones(1, np.int64)


@contextlib.contextmanager
def guarded(world: Any, counters: Any) -> Iterator[None]:
    """On an error here (not a peer's), tell every rank: they stop at their next unit or
    wait with :class:`PeerFailedError` instead of waiting out a deadline."""
    try:
        yield
    except PeerFailedError:
        raise
    except BaseException:
        _abort(world, counters)
        raise


def _abort(world: Any, counters: Any) -> None:
    for r in range(world.world_size):  # the first failure wins: it is the one to name
        with contextlib.suppress(Exception):  # best effort: an unreachable peer times out
            counters.atomic_compare_swap(r, ABORT, 0, world.rank + 1)


def check_peers(counters: Any, me: int, what: str) -> None:
    failed = Words(counters, me)[ABORT]
    if failed:
        raise PeerFailedError(
            f"{what}: rank {me} stopped: rank {failed - 1} failed (its error is raised there)",
            failed_rank=failed - 1,
        )


def beat(counters: Any) -> None:
    """A unit was completed somewhere: keeps the peers' deadlines from running out."""
    counters.atomic_fetch_add(0, BEAT, 1)


def wait_for(
    world: Any, counters: Any, done: Callable[[], bool], what: str, describe: Callable[[], str]
) -> None:
    """Wait until ``done()``, stopping when a peer fails, with a deadline of
    ``[signal] timeout_s`` that restarts whenever a unit is completed anywhere (so long work
    elsewhere is not taken for a stuck peer)."""
    me, heap = world.rank, world.heap
    timeout = world.config.signal.timeout_s
    mine = Words(counters, me)
    seen = counters.atomic_fetch_add(0, BEAT, 0)
    deadline = time.monotonic() + timeout
    while True:
        check_peers(counters, me, what)
        if done():
            heap.fence()  # acquire
            return
        now = time.monotonic()
        if poll_until(
            lambda: bool(mine[ABORT]) or done(), min(deadline, now + 0.05), heap.progress
        ):
            continue
        beats = counters.atomic_fetch_add(0, BEAT, 0)
        if beats != seen:
            seen, deadline = beats, time.monotonic() + timeout
        elif time.monotonic() >= deadline:
            raise SignalTimeoutError(
                f"{what}: rank {me} timed out after {timeout:g} s without progress anywhere "
                f"({describe()}; a peer is stuck)",
                operation=what,
                slot=-1,
                expected="progress",
                last_value=-1,
            )


def ready(world: Any, counters: Any, what: str) -> None:
    """Every rank has written its inputs (a barrier that a failing peer ends early)."""
    world.heap.fence()  # release: the inputs before the count
    for r in range(world.world_size):
        counters.atomic_fetch_add(r, READY, 1)
    mine = Words(counters, world.rank)
    wait_for(
        world,
        counters,
        lambda: int(mine[READY]) >= world.world_size,
        what,
        lambda: f"{int(mine[READY])} of {world.world_size} ranks have written their inputs",
    )


def finish(world: Any, counters: Any, what: str) -> None:
    """Every rank is done reading peers' inputs and writing their slots (a barrier that a
    failing peer ends early): after it the call's buffers may be freed."""
    for r in range(world.world_size):
        counters.atomic_fetch_add(r, DONE, 1)
    mine = Words(counters, world.rank)
    wait_for(
        world,
        counters,
        lambda: int(mine[DONE]) >= world.world_size,
        what,
        lambda: f"{int(mine[DONE])} of {world.world_size} ranks done",
    )


def drive(
    world: Any,
    plan: UnitPlan,
    counters: Any,
    *,
    dynamic: bool,
    fetch: Callable[[Unit], Any],
    compute: Callable[[Unit, Any], Any],
    deliver: Callable[[Unit, Any], None],
    folds: OrderedFolds,
    threads: int,
    slowdown: float,
    stats: SequenceParallelStats,
    what: str,
) -> None:
    """Run every unit exactly once across the ranks (collective in effect), folding this
    rank's arrived slots meanwhile, then wait until all of them are folded and every rank is
    done. ``deliver`` must end with :func:`publish` for every slot it wrote. Call it inside
    :func:`guarded`, so a failure here stops the peers."""
    me, size = world.rank, world.world_size
    heap = world.heap
    queues = plan.queues

    victims = [me] + ([(me + i) % size for i in range(1, size)] if dynamic else [])
    state = {"victim": 0, "local": 0}

    def take() -> tuple[int, Unit] | None:
        check_peers(counters, me, what)
        while state["victim"] < len(victims):
            v = victims[state["victim"]]
            if dynamic:
                i = counters.atomic_fetch_add(v, TAKE, 1)
            else:
                i = state["local"]
                state["local"] += 1
            if i < len(queues[v]):
                return v, queues[v][i]
            state["victim"] += 1
        return None

    def timed(unit: Unit, data: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        result = compute(unit, data)
        spent = time.perf_counter() - t0
        if slowdown > 1.0:  # a straggler on purpose (tests and benchmarks)
            time.sleep(spent * (slowdown - 1.0))
            spent = time.perf_counter() - t0
        return result, spent

    remote = world.num_nodes > 1

    def result_of(fut: Future[tuple[Any, float]]) -> tuple[Any, float]:
        while remote and not fut.done():  # peers' atomics and gets on my memory need my
            heap.progress()  # progress: poll (a blocking wait would stall them)
            if not folds.step():
                wait_futures([fut], timeout=0.0005)
        return fut.result()

    busy = 0.0
    inflight: deque[tuple[int, Unit, Future[tuple[Any, float]]]] = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="sp-unit") as pool:
        nxt = take()
        data = fetch(nxt[1]) if nxt is not None else None
        while nxt is not None or inflight:
            while nxt is not None and len(inflight) < threads:
                inflight.append((nxt[0], nxt[1], pool.submit(timed, nxt[1], data)))
                nxt = take()  # take and fetch the next unit while this one computes
                data = fetch(nxt[1]) if nxt is not None else None
            folds.drain()  # and fold the results that have arrived here
            victim, unit, fut = inflight.popleft()
            result, spent = result_of(fut)
            busy += spent
            deliver(unit, result)
            beat(counters)
            stats.units_computed += 1
            stats.units_taken += victim != me
    wait_for(
        world,
        counters,
        folds.drain,
        what,
        lambda: f"{folds.remaining} unit results still to arrive here",
    )
    finish(world, counters, what)
    own = len(queues[me])
    computed_own = stats.units_computed - stats.units_taken
    stats.units += own
    stats.units_given += own - computed_own
    stats.threads = threads
    stats.busy_s += busy / threads
