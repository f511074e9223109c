"""Sequence-parallel attention over symmetric memory: forward and backward, three schedules.

Each rank holds a shard of one sequence (its query, key and value rows) and computes attention
for its own queries over the whole sequence. The rows a rank holds are a list of *segments*
of the global sequence: one contiguous segment for ``ring`` and ``dynamic``, two for
``zigzag`` (the standard 2P-chunk causal balancing: rank ``r`` holds chunks ``r`` and
``2P - 1 - r``). K/V (and, for ``dynamic`` and the backward pass, Q and the gradients' inputs)
live in symmetric buffers; ranks read peers' rows through zero-copy peer views where they are
load/store reachable, else through one-sided gets, fetched while the previous block computes.
No rank ever holds the whole sequence.

* ``ring`` / ``zigzag`` forward: at step ``s`` a rank uses the K/V rows of rank
  ``(r - s) mod P`` (double-buffered gets when remote) and folds the partial result into its
  running one by log-sum-exp: ``lse = logaddexp(lse_a, lse_b)``,
  ``O = O_a e^(lse_a - lse) + O_b e^(lse_b - lse)``.
* ``dynamic``: work units of (a query chunk on its home rank, a KV head with its query heads,
  a KV chunk), in per-rank queues ordered longest first with their counters in symmetric
  memory (see ``_units.py``). Each rank drains its own queue, then takes units from the other
  ranks' queues by atomic fetch-and-add. Every unit's partial ``(O, LSE)`` goes to a slot on
  its home rank, which merges the slots in a fixed order: the result is bitwise identical
  whichever rank computed a unit.
* Backward (every schedule): the same units, each producing ``dQ`` for its query chunk and
  ``dK``/``dV`` for its KV chunk (FlashAttention-2 backward, ``P`` recomputed from the
  forward's LSE), written to slots on the two home ranks and summed there in a fixed order.
  ``ring`` and ``zigzag`` run one unit per (rank pair, KV head) in ring order, without
  taking work from other ranks.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from shmem import CPU
from shmem.dtypes import as_dtype, dtype_name
from shmem.errors import CollectiveMismatchError, SequenceParallelError

from ..communicator import Communicator
from ..schedule import shard_bounds
from ._units import (
    COUNTERS,
    OrderedFolds,
    RowReader,
    SequenceParallelStats,
    Unit,
    UnitPlan,
    beat,
    check_peers,
    drive,
    finish,
    guarded,
    pieces,
    publish,
    ready,
    runs,
)
from .attention import INPUT_DTYPES, normalise_window
from .kernel import attention_tile, attention_tile_backward
from .scheduler import MaskSpec

__all__ = [
    "SequenceParallelStats",
    "sequence_parallel_attention",
    "sequence_parallel_attention_backward",
    "zigzag_shard",
    "zigzag_unshard",
]

SCHEDULES = ("dynamic", "ring", "zigzag")
CHUNKS_PER_RANK = 4  # dynamic: default query/KV chunks per rank (unit_rows=None)
_F32 = np.dtype(np.float32)


def zigzag_shard(x: np.ndarray[Any, Any], rank: int, world_size: int) -> np.ndarray[Any, Any]:
    """This rank's rows of ``x`` (sequence on axis 0) under zigzag sharding: chunks ``rank``
    and ``2P - 1 - rank`` of ``2P`` near-equal chunks, concatenated."""
    bounds = shard_bounds(x.shape[0], 2 * world_size)
    a0, a1 = bounds[rank]
    b0, b1 = bounds[2 * world_size - 1 - rank]
    return np.concatenate([x[a0:a1], x[b0:b1]], axis=0)


def zigzag_unshard(parts: list[np.ndarray[Any, Any]], total: int) -> np.ndarray[Any, Any]:
    """Reassemble the full sequence from every rank's zigzag shard (in rank order)."""
    p = len(parts)
    bounds = shard_bounds(total, 2 * p)
    out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
    for r, part in enumerate(parts):
        a0, a1 = bounds[r]
        b0, b1 = bounds[2 * p - 1 - r]
        out[a0:a1] = part[: a1 - a0]
        out[b0:b1] = part[a1 - a0 :]
    return out


# -- arguments (collective: every rank agrees before any symmetric allocation) -----------------


@dataclass(frozen=True)
class _Setup:
    world: Any
    counts: list[int]
    positions: list[np.ndarray[Any, Any]]
    mask: MaskSpec
    docs: np.ndarray[Any, Any] | None
    scale: float
    heads: int
    kv_heads: int
    dim: int
    threads: int
    chunk_rows: int | None
    order: str

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def rows(self) -> int:
        return int(self.counts[self.world.rank])

    @property
    def rows_max(self) -> int:
        return max(*self.counts, 1)


def _check_int(where: str, name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SequenceParallelError(
            f"{where}: invalid {name} (got {value!r}; expected an int >= 1"
            + (" or None)" if optional else ")")
        )


def _setup(
    comm: Communicator,
    where: str,
    arrays: dict[str, Any],
    *,
    schedule: str,
    causal: bool,
    window: Any,
    valid_length: Any,
    scale: float | None,
    block_m: int,
    block_n: int,
    unit_rows: int | None,
    threads: int | None,
    stats: SequenceParallelStats | None,
) -> _Setup:
    """Validate locally, then agree across ranks (one all-gather, which also exchanges the
    shard lengths): an argument error on any rank raises on every rank, so none is left
    waiting in the collective."""
    world = comm.world
    error: Exception | None = None
    record: tuple[Any, ...] = ()
    rows = 0
    left = right = None
    try:
        if schedule not in SCHEDULES:
            raise SequenceParallelError(
                f"{where}: unknown schedule (got {schedule!r}; expected one of {list(SCHEDULES)})"
            )
        for name, a in arrays.items():
            want = 2 if name == "lse" else 3
            if not isinstance(a, np.ndarray) or a.ndim != want:
                raise SequenceParallelError(
                    f"{where}: {name} must be a numpy array of "
                    + ("[rows, heads]" if want == 2 else "[rows, heads, head_dim]")
                    + f" (got {type(a).__name__}"
                    + (f" of shape {a.shape})" if isinstance(a, np.ndarray) else ")")
                )
            if name == "lse" and a.dtype.kind != "f":
                raise SequenceParallelError(
                    f"{where}: lse must be floating point (got {a.dtype}; pass the forward's "
                    "return_lse=True result)"
                )
            if name != "lse" and dtype_name(as_dtype(a.dtype, where)) not in INPUT_DTYPES:
                raise SequenceParallelError(
                    f"{where}: unsupported dtype for {name} (got {a.dtype}; expected one of "
                    f"{list(INPUT_DTYPES)})"
                )
        q, k, v = arrays["q"], arrays["k"], arrays["v"]
        if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
            raise SequenceParallelError(
                f"{where}: shapes do not match (got q {q.shape}, k {k.shape}, v {v.shape}; "
                "expected k and v [rows, kv_heads, head_dim] with q's rows and head_dim)"
            )
        for name in ("out", "dout"):
            if name in arrays and arrays[name].shape != q.shape:
                raise SequenceParallelError(
                    f"{where}: {name} has the wrong shape (got {arrays[name].shape}; expected "
                    f"q's {q.shape})"
                )
        if "lse" in arrays and arrays["lse"].shape != q.shape[:2]:
            raise SequenceParallelError(
                f"{where}: lse has the wrong shape (got {arrays['lse'].shape}; expected "
                f"{q.shape[:2]}, as returned by the forward with return_lse=True)"
            )
        if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
            raise SequenceParallelError(
                f"{where}: num_kv_heads must divide num_heads (got {q.shape[1]} and {k.shape[1]})"
            )
        for name, value in (("block_m", block_m), ("block_n", block_n)):
            _check_int(where, name, value)
        _check_int(where, "unit_rows", unit_rows, optional=True)
        _check_int(where, "threads", threads, optional=True)
        if stats is not None and not isinstance(stats, SequenceParallelStats):
            raise SequenceParallelError(
                f"{where}: stats must be a SequenceParallelStats (got {type(stats).__name__})"
            )
        left, right = normalise_window(window, where)
        docs_rec = None if valid_length is None else tuple(int(x) for x in valid_length)
        rows = q.shape[0]
        record = (
            schedule,
            q.shape[1],
            k.shape[1],
            q.shape[2],
            str(q.dtype),
            bool(causal),
            left,
            right,
            docs_rec,
            scale,
            block_m,
            block_n,
            unit_rows,
            stats is not None,
        )
    except Exception as exc:  # any local error: every rank must still reach the all-gather
        error = exc
    gathered = world.comm.allgather((record, rows, None if error is None else str(error)))
    if error is not None:
        raise error
    bad = [(r, e) for r, (_, _, e) in enumerate(gathered) if e is not None]
    if bad:
        raise CollectiveMismatchError(
            f"{where}: invalid arguments on other ranks: "
            + "; ".join(f"rank {r}: {e}" for r, e in bad)
        )
    if any(rec != gathered[0][0] for rec, _, _ in gathered):
        listing = "; ".join(f"rank {r}: {rec}" for r, (rec, _, _) in enumerate(gathered))
        raise CollectiveMismatchError(f"{where}: ranks disagree ({listing})")
    counts = [int(n) for _, n, _ in gathered]
    total, size = sum(counts), world.world_size
    if schedule == "zigzag":
        bounds = shard_bounds(total, 2 * size)
        segs = [[bounds[r], bounds[2 * size - 1 - r]] for r in range(size)]
        if [sum(b - a for a, b in sg) for sg in segs] != counts:
            raise SequenceParallelError(
                f"{where}: zigzag shards have the wrong lengths (got {counts}; shard the "
                "caller's tokens with zigzag_shard)"
            )
        positions = [np.concatenate([np.arange(a, b) for a, b in sg]) for sg in segs]
    else:
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        positions = [np.arange(starts[r], starts[r + 1]) for r in range(size)]
    q = arrays["q"]
    dim = q.shape[2]
    chunk_rows = None
    if schedule == "dynamic":
        chunk_rows = unit_rows or max(block_m, -(-max(counts) // CHUNKS_PER_RANK), 1)
    cores = CPU().attributes.cores or 1
    return _Setup(
        world=world,
        counts=counts,
        positions=positions,
        mask=MaskSpec(causal=bool(causal), left=left, right=right),
        docs=_docs(where, valid_length, total),
        scale=float(1.0 / math.sqrt(dim) if scale is None else scale),
        heads=q.shape[1],
        kv_heads=arrays["k"].shape[1],
        dim=dim,
        threads=threads or max(1, cores // world.local_size),
        chunk_rows=chunk_rows,
        order="lpt" if schedule == "dynamic" else "ring",
    )


def _docs(where: str, valid_length: Any, total: int) -> np.ndarray[Any, Any] | None:
    if valid_length is None:
        return None
    offs = np.asarray([int(v) for v in valid_length], dtype=np.int64)
    if (
        offs.ndim != 1
        or offs.size < 2
        or offs[0] != 0
        or offs[-1] != total
        or (np.diff(offs) < 0).any()
    ):
        raise SequenceParallelError(
            f"{where}: invalid valid_length (expected row offsets from 0 to the total length "
            f"{total}, non-decreasing; got {offs[:8].tolist()}{'...' if offs.size > 8 else ''})"
        )
    return offs


def _finish_stats(
    st: _Setup, stats: SequenceParallelStats | None, mine: SequenceParallelStats, start: float
) -> None:
    """Wall and idle time, and every rank's busy time (collective: all ranks pass stats)."""
    if stats is None:
        return
    mine.wall_s = time.perf_counter() - start
    mine.idle_s = max(mine.wall_s - mine.busy_s, 0.0)
    mine.busy_per_rank = tuple(float(b) for b in st.world.comm.allgather(mine.busy_s))
    for f in dataclasses.fields(SequenceParallelStats):
        setattr(stats, f.name, getattr(mine, f.name))


# -- forward -------------------------------------------------------------------------------------


def sequence_parallel_attention(
    comm: Communicator,
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    *,
    causal: bool = False,
    window: Any = None,
    valid_length: Any = None,
    scale: float | None = None,
    schedule: str = "dynamic",
    block_m: int = 128,
    block_n: int = 256,
    unit_rows: int | None = None,
    threads: int | None = None,
    return_lse: bool = False,
    stats: SequenceParallelStats | None = None,
    _slowdown: float = 1.0,
) -> Any:
    """Attention of this rank's queries over the whole sharded sequence (collective).

    Parameters
    ----------
    comm : collectives.Communicator
    q, k, v : ndarray
        This rank's rows ``[rows, heads, head_dim]`` (``k``/``v`` may have fewer heads:
        GQA), float32, float16 or bfloat16. ``ring`` and ``dynamic``: rank ``r`` holds the
        ``r``-th contiguous shard (any lengths, in rank order). ``zigzag``: rank ``r`` holds
        :func:`zigzag_shard` of the sequence.
    causal, window : as for :func:`collectives.mha.attention`, on global positions.
    valid_length : sequence of int, optional
        Global row offsets of the documents packed in the sequence: attention stays within a
        document (document-causal with ``causal=True``).
    scale : float, optional
        Softmax scale (default ``1 / sqrt(head_dim)``).
    schedule : {"dynamic", "ring", "zigzag"}
    block_m, block_n : int
        Query rows and keys per tile.
    unit_rows : int, optional
        ``dynamic``: query and key rows per work unit (default: a quarter of the longest
        shard, at least ``block_m``). A home rank keeps one partial ``(O, LSE)`` per unit it
        owns, so smaller units balance better and take more symmetric memory.
    threads : int, optional
        Compute threads of this rank (default: the host's cores / ranks on this node).
    return_lse : bool
        Also return the log-sum-exp ``[rows, heads]`` (float32; what the backward needs).
    stats : SequenceParallelStats, optional
        Filled in with this rank's busy and idle time and units taken (all ranks pass one
        or none).

    Returns
    -------
    O for this rank's rows (dtype of ``q``), or ``(O, LSE)``.
    """
    start = time.perf_counter()
    where = "sequence_parallel_attention"
    st = _setup(
        comm,
        where,
        {"q": q, "k": k, "v": v},
        schedule=schedule,
        causal=causal,
        window=window,
        valid_length=valid_length,
        scale=scale,
        block_m=block_m,
        block_n=block_n,
        unit_rows=unit_rows,
        threads=threads,
        stats=stats,
    )
    mine = SequenceParallelStats(schedule=schedule)
    if schedule == "dynamic":
        out, lse = _forward_units(st, q, k, v, block_m, block_n, mine, _slowdown)
    else:
        out, lse = _forward_ring(st, q, k, v, block_m, block_n, mine, _slowdown)
    _finish_stats(st, stats, mine, start)
    result = out.astype(q.dtype, copy=False)
    return (result, lse) if return_lse else result


def _symmetric(world: Any, shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, Any]:
    """Allocate symmetric buffers (collective); on failure free those already made."""
    bufs: dict[str, Any] = {}
    try:
        for name, (shape, dtype) in shapes.items():
            bufs[name] = (
                world.zeros(shape, dtype) if dtype == "int64" else world.empty(shape, dtype)
            )
    except BaseException:
        _close(bufs)
        raise
    return bufs


def _close(bufs: dict[str, Any]) -> None:
    for buf in reversed(list(bufs.values())):
        buf.close()


def _forward_ring(
    st: _Setup,
    q: Any,
    k: Any,
    v: Any,
    block_m: int,
    block_n: int,
    stats: SequenceParallelStats,
    slowdown: float,
) -> tuple[Any, Any]:
    world = st.world
    bufs = _symmetric(
        world,
        {
            "k": ((st.rows_max, st.kv_heads, st.dim), "float32"),
            "v": ((st.rows_max, st.kv_heads, st.dim), "float32"),
            "counters": ((COUNTERS,), "int64"),
        },
    )
    k_sym, v_sym, counters = bufs["k"], bufs["v"], bufs["counters"]
    try:
        with guarded(world, counters):
            out, lse = _ring_steps(
                st, q, k, v, k_sym, v_sym, counters, block_m, block_n, stats, slowdown
            )
    finally:
        _close(bufs)
    return out, lse


def _ring_steps(
    st: _Setup,
    q: Any,
    k: Any,
    v: Any,
    k_sym: Any,
    v_sym: Any,
    counters: Any,
    block_m: int,
    block_n: int,
    stats: SequenceParallelStats,
    slowdown: float,
) -> tuple[Any, Any]:
    world = st.world
    rank, size = world.rank, world.world_size
    what = "sequence_parallel_attention"
    k_sym.local()[: st.rows] = k
    v_sym.local()[: st.rows] = v
    ready(world, counters, what)
    q32 = np.ascontiguousarray(q, dtype=np.float32)
    out = np.zeros((st.rows, st.heads, st.dim), np.float32)
    lse = np.full((st.rows, st.heads), -np.inf, np.float32)
    slots = [np.empty((st.rows_max, st.kv_heads, st.dim), np.float32) for _ in range(2)]
    with (
        ThreadPoolExecutor(1) as fetcher,
        ThreadPoolExecutor(st.threads) as pool,
        threadpool_limits(limits=1, user_api="blas"),
    ):
        pending = _fetch(fetcher, k_sym, v_sym, rank, st.rows, slots[0])
        for step in range(size):
            check_peers(counters, rank, what)
            src = (rank - step) % size
            kv_k, kv_v = pending.result()
            if step + 1 < size:  # prefetch the next block while this one computes
                nxt = (rank - step - 1) % size
                pending = _fetch(fetcher, k_sym, v_sym, nxt, st.counts[nxt], slots[(step + 1) % 2])
            t0 = time.perf_counter()
            _accumulate(pool, st, q32, kv_k, kv_v, st.positions[src], block_m, block_n, out, lse)
            spent = time.perf_counter() - t0
            if slowdown > 1.0:
                time.sleep(spent * (slowdown - 1.0))
                spent = time.perf_counter() - t0
            stats.busy_s += spent
            stats.units_computed += 1
            beat(counters)
    stats.units = stats.units_computed
    stats.threads = st.threads
    finish(world, counters, what)  # every peer is done reading my K/V
    return out, lse


def _fetch(
    fetcher: ThreadPoolExecutor,
    k_sym: Any,
    v_sym: Any,
    src: int,
    rows: int,
    slot: np.ndarray[Any, Any],
) -> Future[tuple[Any, Any]]:
    """K/V rows of ``src``: a peer view when reachable, else gets into local memory."""
    kp, vp = k_sym.peer(src), v_sym.peer(src)
    if kp is not None and vp is not None:
        done: Future[tuple[Any, Any]] = Future()
        done.set_result((kp[:rows], vp[:rows]))
        return done

    def get() -> tuple[Any, Any]:
        kk = k_sym.get(src, slot[:rows])
        vv = v_sym.get(src, np.empty_like(slot[:rows]))
        return kk, vv

    return fetcher.submit(get)


def _accumulate(
    pool: ThreadPoolExecutor,
    st: _Setup,
    q: Any,
    k: Any,
    v: Any,
    kv_pos: Any,
    block_m: int,
    block_n: int,
    out: Any,
    lse: Any,
) -> None:
    """Attention of every local query row over one K/V block, merged into (out, lse)."""
    q_pos = st.positions[st.world.rank]
    if kv_pos.size == 0 or q_pos.size == 0:
        return
    kv_runs = runs(kv_pos)
    tasks = [
        (h, lo, min(lo + block_m, q_pos.size))
        for h in range(st.heads)
        for lo in range(0, q_pos.size, block_m)
    ]

    def one(task: tuple[int, int, int]) -> None:
        h, lo, hi = task
        kh = h // st.group
        for qa, qb, qg, ra, g0, s0, s1 in pieces(q_pos, lo, hi, kv_pos, kv_runs, st.mask, st.docs):
            o_part, l_part = attention_tile(
                q[qa:qb, h],
                k[:, kh],
                v[:, kh],
                q_offset=qg,
                kv_start=s0,
                kv_end=s1,
                block_n=block_n,
                scale=st.scale,
                mask=st.mask,
                k_offset=g0 - ra,
            )
            _merge(out[qa:qb, h], lse[qa:qb, h], o_part, l_part)

    list(pool.map(one, tasks))


def _merge(out: Any, lse: Any, o_part: Any, l_part: Any) -> None:
    """Fold a partial (O, LSE) into the running one, rows where the partial saw keys."""
    if np.isneginf(lse).all():  # nothing yet (the first partial): a copy, bitwise the same
        out[...] = o_part  # as the fold (weights exactly 0 and 1)
        lse[...] = l_part
        return
    new = np.logaddexp(lse, l_part)
    seen = np.isfinite(new)
    with np.errstate(invalid="ignore"):  # -inf - -inf where neither saw a key: masked out
        w_old = np.where(seen, np.exp(np.where(seen, lse - new, 0)), 0).astype(np.float32)
        w_new = np.where(seen, np.exp(np.where(seen, l_part - new, 0)), 0).astype(np.float32)
    out[...] = out * w_old[..., None] + o_part * w_new[..., None]
    lse[...] = new


def _plan(st: _Setup, block_m: int) -> UnitPlan:
    return UnitPlan(st.positions, st.chunk_rows, st.kv_heads, st.mask, st.docs, block_m, st.order)


class _Slots:
    """Where unit results go on their home ranks: a flat float32 ``part`` buffer of slots
    and one int64 flag per slot (symmetric), laid out identically on every rank."""

    def __init__(self, plan: UnitPlan, kinds: list[tuple[list[list[Unit]], Any]]) -> None:
        # kinds: (units per home, floats per unit) for each kind of slot, in layout order
        size = plan.size
        self.offset: list[dict[tuple[int, int], int]] = [{} for _ in range(size)]
        self.flag: list[dict[tuple[int, int], int]] = [{} for _ in range(size)]
        floats = [0] * size
        flags = [0] * size
        for kind, (homes, width) in enumerate(kinds):
            for r, units in enumerate(homes):
                for u in units:
                    self.offset[r][kind, u.id] = floats[r]
                    self.flag[r][kind, u.id] = flags[r]
                    floats[r] += width(u)
                    flags[r] += 1
        self.floats = max(1, *floats)
        self.flags = max(1, *flags)
        self._views: dict[int, Any] = {}

    def buffers(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {
            "part": ((self.floats,), "float32"),
            "flags": ((self.flags,), "int64"),
            "counters": ((COUNTERS,), "int64"),
        }

    def view(self, part: Any, home: int, kind: int, u: Unit, shape: tuple[int, ...]) -> Any:
        """The slot as an array in ``home``'s memory, or None when not reachable."""
        if home not in self._views:
            self._views[home] = part.peer(home)
        flat = self._views[home]
        if flat is None:
            return None
        off = self.offset[home][kind, u.id]
        return flat[off : off + math.prod(shape)].reshape(shape)

    def deliver(
        self, world: Any, bufs: dict[str, Any], home: int, kind: int, u: Unit, data: Any
    ) -> None:
        """Put ``data`` in the slot unless it was computed there, then raise its flag."""
        if self._views.get(home) is None:
            bufs["part"].put(home, data, offset=self.offset[home][kind, u.id] * 4)
        publish(world, bufs["flags"], home, self.flag[home][kind, u.id])

    def folds(
        self, world: Any, bufs: dict[str, Any], kind: int, groups: list[list[Unit]], fold: Any
    ) -> list[list[tuple[int, Any]]]:
        """``fold(u, slot)`` for each group's units, in order, keyed by their flags."""
        me, part = world.rank, bufs["part"].local()
        return [
            [
                (self.flag[me][kind, u.id], partial(fold, u, part, self.offset[me][kind, u.id]))
                for u in group
            ]
            for group in groups
        ]


def _groups(units: list[Unit], key: Any) -> list[list[Unit]]:
    """Consecutive runs of ``units`` with equal ``key`` (units are in canonical order)."""
    return [list(g) for _, g in itertools.groupby(units, key)]


def _forward_units(
    st: _Setup,
    q: Any,
    k: Any,
    v: Any,
    block_m: int,
    block_n: int,
    stats: SequenceParallelStats,
    slowdown: float,
) -> tuple[Any, Any]:
    """The dynamic forward: units run anywhere, partial (O, LSE) merged at home in unit order."""
    world, me = st.world, st.world.rank
    plan = _plan(st, block_m)
    chunks, hg, d = plan.chunks, st.group, st.dim
    # a unit's slot: [rows, heads of its group, O | LSE]
    slots = _Slots(plan, [(plan.by_q_home, lambda u: chunks[u.q].rows * hg * (d + 1))])
    bufs = _symmetric(
        world,
        {
            "q": ((st.rows_max, st.heads, d), "float32"),
            "k": ((st.rows_max, st.kv_heads, d), "float32"),
            "v": ((st.rows_max, st.kv_heads, d), "float32"),
            **slots.buffers(),
        },
    )
    try:
        with guarded(world, bufs["counters"]):  # a failure here stops the peers at once
            for name, a in (("q", q), ("k", k), ("v", v)):
                bufs[name].local()[: st.rows] = a
            ready(world, bufs["counters"], "sequence_parallel_attention")
        reader = RowReader(capacity=9)
        out = np.zeros((st.rows, st.heads, d), np.float32)
        lse = np.full((st.rows, st.heads), -np.inf, np.float32)

        def fetch(u: Unit) -> tuple[Any, ...]:
            qc, kc = chunks[u.q], chunks[u.kv]
            heads = slice(u.head * hg, (u.head + 1) * hg)
            return (
                reader.rows(bufs["q"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["k"], kc.rank, kc.lo, kc.hi)[:, u.head],
                reader.rows(bufs["v"], kc.rank, kc.lo, kc.hi)[:, u.head],
                slots.view(bufs["part"], qc.rank, 0, u, (qc.rows, hg, d + 1)),
            )

        def compute(u: Unit, data: tuple[Any, ...]) -> Any:
            qd, kd, vd, dst = data
            return _forward_unit(
                st, qd, kd, vd, chunks[u.q].pos, chunks[u.kv].pos, block_m, block_n, dst
            )

        def deliver(u: Unit, packed: Any) -> None:
            slots.deliver(world, bufs, chunks[u.q].rank, 0, u, packed)

        def fold(u: Unit, part: Any, off: int) -> None:
            qc = chunks[u.q]
            blk = part[off : off + qc.rows * hg * (d + 1)].reshape(qc.rows, hg, d + 1)
            heads = slice(u.head * hg, (u.head + 1) * hg)
            _merge(out[qc.lo : qc.hi, heads], lse[qc.lo : qc.hi, heads], blk[..., :d], blk[..., d])

        # fold order: (query chunk, KV head), then KV chunks in order
        groups = _groups(plan.by_q_home[me], lambda u: (u.q, u.head))
        folds = OrderedFolds(world, bufs["flags"], slots.folds(world, bufs, 0, groups, fold))
        with guarded(world, bufs["counters"]), threadpool_limits(limits=1, user_api="blas"):
            drive(
                world,
                plan,
                bufs["counters"],
                dynamic=True,
                fetch=fetch,
                compute=compute,
                deliver=deliver,
                folds=folds,
                threads=st.threads,
                slowdown=slowdown,
                stats=stats,
                what="sequence_parallel_attention",
            )
    finally:
        _close(bufs)
    return out, lse


def _forward_unit(
    st: _Setup,
    qd: Any,
    kd: Any,
    vd: Any,
    q_pos: Any,
    kv_pos: Any,
    block_m: int,
    block_n: int,
    dst: Any = None,
) -> np.ndarray[Any, Any]:
    """One unit into ``dst`` (or a new array): ``[rows, group heads, d + 1]`` float32, O then
    LSE in the last column."""
    rows, hg, d = qd.shape
    packed = np.empty((rows, hg, d + 1), np.float32) if dst is None else dst
    out, lse = packed[..., :d], packed[..., d]
    out[...] = 0
    lse[...] = -np.inf
    kv_runs = runs(kv_pos)
    for hh in range(hg):
        for lo in range(0, rows, block_m):
            hi = min(lo + block_m, rows)
            for qa, qb, qg, ra, g0, s0, s1 in pieces(
                q_pos, lo, hi, kv_pos, kv_runs, st.mask, st.docs
            ):
                o_part, l_part = attention_tile(
                    qd[qa:qb, hh],
                    kd,
                    vd,
                    q_offset=qg,
                    kv_start=s0,
                    kv_end=s1,
                    block_n=block_n,
                    scale=st.scale,
                    mask=st.mask,
                    k_offset=g0 - ra,
                )
                _merge(out[qa:qb, hh], lse[qa:qb, hh], o_part, l_part)
    return packed


# -- backward ------------------------------------------------------------------------------------


def sequence_parallel_attention_backward(
    comm: Communicator,
    dout: np.ndarray[Any, Any],
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    lse: np.ndarray[Any, Any],
    *,
    causal: bool = False,
    window: Any = None,
    valid_length: Any = None,
    scale: float | None = None,
    schedule: str = "dynamic",
    block_m: int = 128,
    block_n: int = 256,
    unit_rows: int | None = None,
    threads: int | None = None,
    stats: SequenceParallelStats | None = None,
    _slowdown: float = 1.0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Gradients ``(dQ, dK, dV)`` of this rank's rows (collective).

    ``dout`` is dL/dO for this rank's rows; ``out`` and ``lse`` come from
    :func:`sequence_parallel_attention` with ``return_lse=True`` and the same arguments (any
    schedule: they are the same up to rounding). ``dK``/``dV`` have ``k``'s shape: with
    GQA they sum over each KV head's query heads. Every other argument is as for the forward,
    with the same sharding. Returns arrays of the dtypes of ``q``, ``k`` and ``v``.
    """
    start = time.perf_counter()
    where = "sequence_parallel_attention_backward"
    st = _setup(
        comm,
        where,
        {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse},
        schedule=schedule,
        causal=causal,
        window=window,
        valid_length=valid_length,
        scale=scale,
        block_m=block_m,
        block_n=block_n,
        unit_rows=unit_rows,
        threads=threads,
        stats=stats,
    )
    mine = SequenceParallelStats(schedule=schedule)
    world, me = st.world, st.world.rank
    plan = _plan(st, block_m)
    chunks, hg, d = plan.chunks, st.group, st.dim
    slots = _Slots(  # kind 0: dQ at the query home; kind 1: dK | dV at the KV home
        plan,
        [
            (plan.by_q_home, lambda u: chunks[u.q].rows * hg * d),
            (plan.by_kv_home, lambda u: chunks[u.kv].rows * 2 * d),
        ],
    )
    bufs = _symmetric(
        world,
        {
            "q": ((st.rows_max, st.heads, d), "float32"),
            "do": ((st.rows_max, st.heads, d), "float32"),
            "ld": ((st.rows_max, st.heads, 2), "float32"),  # LSE, D = rowsum(dO * O)
            "k": ((st.rows_max, st.kv_heads, d), "float32"),
            "v": ((st.rows_max, st.kv_heads, d), "float32"),
            **slots.buffers(),
        },
    )
    try:
        with guarded(world, bufs["counters"]):  # a failure here stops the peers at once
            for name, a in (("q", q), ("do", dout), ("k", k), ("v", v)):
                bufs[name].local()[: st.rows] = a
            ld = bufs["ld"].local()
            ld[: st.rows, :, 0] = lse
            ld[: st.rows, :, 1] = np.einsum(
                "rhd,rhd->rh", dout.astype(np.float32), out.astype(np.float32)
            )
            ready(world, bufs["counters"], where)
        reader = RowReader(capacity=15)
        dq_out = np.zeros((st.rows, st.heads, d), np.float32)
        dk_out = np.zeros((st.rows, st.kv_heads, d), np.float32)
        dv_out = np.zeros((st.rows, st.kv_heads, d), np.float32)

        def fetch(u: Unit) -> tuple[Any, ...]:
            qc, kc = chunks[u.q], chunks[u.kv]
            heads = slice(u.head * hg, (u.head + 1) * hg)
            return (
                reader.rows(bufs["q"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["do"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["ld"], qc.rank, qc.lo, qc.hi)[:, heads],
                reader.rows(bufs["k"], kc.rank, kc.lo, kc.hi)[:, u.head],
                reader.rows(bufs["v"], kc.rank, kc.lo, kc.hi)[:, u.head],
                slots.view(bufs["part"], qc.rank, 0, u, (qc.rows, hg, d)),
                slots.view(bufs["part"], kc.rank, 1, u, (kc.rows, 2, d)),
            )

        def compute(u: Unit, data: tuple[Any, ...]) -> tuple[Any, Any]:
            qd, dod, ldd, kd, vd, dq_dst, dkv_dst = data
            return _backward_unit(
                st,
                qd,
                dod,
                ldd,
                kd,
                vd,
                chunks[u.q].pos,
                chunks[u.kv].pos,
                block_m,
                block_n,
                dq_dst,
                dkv_dst,
            )

        def deliver(u: Unit, result: tuple[Any, Any]) -> None:
            slots.deliver(world, bufs, chunks[u.q].rank, 0, u, result[0])
            slots.deliver(world, bufs, chunks[u.kv].rank, 1, u, result[1])

        def fold_dq(u: Unit, part: Any, off: int) -> None:
            qc = chunks[u.q]
            heads = slice(u.head * hg, (u.head + 1) * hg)
            dq_out[qc.lo : qc.hi, heads] += part[off : off + qc.rows * hg * d].reshape(
                qc.rows, hg, d
            )

        def fold_dkv(u: Unit, part: Any, off: int) -> None:
            kc = chunks[u.kv]
            blk = part[off : off + kc.rows * 2 * d].reshape(kc.rows, 2, d)
            dk_out[kc.lo : kc.hi, u.head] += blk[:, 0]
            dv_out[kc.lo : kc.hi, u.head] += blk[:, 1]

        # fixed orders: dQ by (query chunk, KV head) over KV chunks; dK/dV by (KV chunk,
        # KV head) over query chunks
        dq_groups = _groups(plan.by_q_home[me], lambda u: (u.q, u.head))
        dkv_groups = _groups(plan.by_kv_home[me], lambda u: (u.kv, u.head))
        folds = OrderedFolds(
            world,
            bufs["flags"],
            slots.folds(world, bufs, 0, dq_groups, fold_dq)
            + slots.folds(world, bufs, 1, dkv_groups, fold_dkv),
        )
        with guarded(world, bufs["counters"]), threadpool_limits(limits=1, user_api="blas"):
            drive(
                world,
                plan,
                bufs["counters"],
                dynamic=schedule == "dynamic",
                fetch=fetch,
                compute=compute,
                deliver=deliver,
                folds=folds,
                threads=st.threads,
                slowdown=_slowdown,
                stats=mine,
                what=where,
            )
    finally:
        _close(bufs)
    _finish_stats(st, stats, mine, start)
    return (
        dq_out.astype(q.dtype, copy=False),
        dk_out.astype(k.dtype, copy=False),
        dv_out.astype(v.dtype, copy=False),
    )


def _backward_unit(
    st: _Setup,
    qd: Any,
    dod: Any,
    ldd: Any,
    kd: Any,
    vd: Any,
    q_pos: Any,
    kv_pos: Any,
    block_m: int,
    block_n: int,
    dq: Any = None,
    dkv: Any = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One unit into ``dq`` and ``dkv`` (or new arrays): dQ ``[rows, group heads, d]`` and
    dK | dV ``[kv rows, 2, d]``, float32."""
    rows, hg, d = qd.shape
    dq = np.zeros((rows, hg, d), np.float32) if dq is None else dq
    dkv = np.zeros((kv_pos.size, 2, d), np.float32) if dkv is None else dkv
    dq[...] = 0
    dkv[...] = 0
    kv_runs = runs(kv_pos)
    for hh in range(hg):
        for lo in range(0, rows, block_m):
            hi = min(lo + block_m, rows)
            for qa, qb, qg, ra, g0, s0, s1 in pieces(
                q_pos, lo, hi, kv_pos, kv_runs, st.mask, st.docs
            ):
                dq_p, dk_p, dv_p = attention_tile_backward(
                    qd[qa:qb, hh],
                    kd,
                    vd,
                    dod[qa:qb, hh],
                    ldd[qa:qb, hh, 0],
                    ldd[qa:qb, hh, 1],
                    q_offset=qg,
                    kv_start=s0,
                    kv_end=s1,
                    block_n=block_n,
                    scale=st.scale,
                    mask=st.mask,
                    k_offset=g0 - ra,
                )
                dq[qa:qb, hh] += dq_p
                r0 = s0 - g0 + ra
                dkv[r0 : r0 + s1 - s0, 0] += dk_p
                dkv[r0 : r0 + s1 - s0, 1] += dv_p
    return dq, dkv
