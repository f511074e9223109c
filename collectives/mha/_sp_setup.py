"""Sequence-parallel attention: argument agreement, the shared setup and the result slots.

Every rank validates its arguments, then all agree in one all-gather (which also exchanges
the shard lengths) before any symmetric allocation, so an argument error on any rank raises
on every rank. :class:`Setup` is what the schedules share; :class:`Slots` lays out where unit
results go on their home ranks. Package-internal (see ``sequence_parallel.py``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import numpy as np

from shmem import CPU, Buffer
from shmem.agreement import allgather_within
from shmem.dtypes import as_dtype, dtype_name
from shmem.errors import SequenceParallelError

from ..communicator import Communicator
from ..interop import is_gpu_array
from ..schedule import shard_bounds
from ._sp_agree import agree, meet_first, text_of
from ._units import SequenceParallelStats
from .attention import INPUT_DTYPES, normalise_window
from .scheduler import MaskSpec

__all__ = [
    "CHUNKS_PER_RANK",
    "HOOKS",
    "SCHEDULES",
    "BackwardOperands",
    "Operands",
    "Prepare",
    "Setup",
    "close_all",
    "finish_stats",
    "merge_partial",
    "setup",
    "symmetric",
    "zigzag_shard",
    "zigzag_unshard",
]

SCHEDULES = ("dynamic", "ring", "zigzag")
CHUNKS_PER_RANK = 4  # dynamic: default query/KV chunks per rank (unit_rows=None)
F32 = np.dtype(np.float32)


@dataclass
class _Hooks:
    """Testing and benchmarking aids, set through ``simulate_straggler``: ``slowdown`` makes
    every unit this rank computes take that many times as long (it sleeps the difference)."""

    slowdown: float = 1.0


HOOKS = _Hooks()


def zigzag_shard(x: np.ndarray[Any, Any], rank: int, world_size: int) -> np.ndarray[Any, Any]:
    """This rank's rows of ``x`` (sequence on axis 0) under zigzag sharding: chunks ``rank``
    and ``2P - 1 - rank`` of ``2P`` near-equal chunks, concatenated.

    Parameters
    ----------
    x : numpy.ndarray
        The whole sequence.
    rank, world_size : int
        This rank, and the ranks ``P`` sharing the sequence.

    Returns
    -------
    numpy.ndarray
        The rank's two chunks, concatenated on axis 0.
    """
    bounds = shard_bounds(x.shape[0], 2 * world_size)
    a0, a1 = bounds[rank]
    b0, b1 = bounds[2 * world_size - 1 - rank]
    return np.concatenate([x[a0:a1], x[b0:b1]], axis=0)


def zigzag_unshard(parts: list[np.ndarray[Any, Any]], total: int) -> np.ndarray[Any, Any]:
    """Reassemble the full sequence from every rank's zigzag shard (in rank order).

    Parameters
    ----------
    parts : list of numpy.ndarray
        Every rank's :func:`zigzag_shard`, in rank order.
    total : int
        The sequence's length (rows).

    Returns
    -------
    numpy.ndarray
        The whole sequence, ``total`` rows.
    """
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
class Operands:
    """The tensors of one sequence-parallel forward call, as the caller passed them (numpy
    arrays, or GPU arrays: torch or cupy tensors, Buffers) or as :func:`setup` converted
    them (GPU Buffers)."""

    q: Any
    k: Any
    v: Any

    def named(self) -> list[tuple[str, Any]]:
        """``(name, tensor)`` of every field, in argument order (for checks and messages)."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

    def convert(self, fn: Callable[[str, Any], Any]) -> Self:
        """A copy with every tensor ``x`` of field ``name`` replaced by ``fn(name, x)``."""
        return dataclasses.replace(self, **{name: fn(name, x) for name, x in self.named()})


@dataclass(frozen=True)
class BackwardOperands(Operands):
    """The tensors of one sequence-parallel backward call: the forward's, its result ``out``
    and ``lse``, and ``dout`` (dL/dO)."""

    out: Any
    dout: Any
    lse: Any


OperandsT = TypeVar("OperandsT", bound=Operands)


class Prepare(Protocol):
    """What :func:`setup` runs on GPU inputs before the agreement: checks them and returns
    them converted (GPU Buffers), as operands of the same kind."""

    def __call__(self, operands: OperandsT, /) -> OperandsT: ...


@dataclass(frozen=True)
class Setup:
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
    kv_chunk_rows: int | None = None

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def rows(self) -> int:
        return int(self.counts[self.world.rank])

    @property
    def rows_max(self) -> int:
        return max(*self.counts, 1)


def check_int(where: str, name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SequenceParallelError(
            f"{where}: invalid {name} (got {value!r}; expected an int >= 1"
            + (" or None)" if optional else ")")
        )


def _prepared(
    world: Any, where: str, operands: OperandsT, schedule: str, prepare: Prepare | None
) -> OperandsT:
    """The operands the schedules take: ``prepare``'s conversion of GPU inputs, or numpy
    inputs as they are (refused on a GPU, or when the World's heap is device memory)."""
    if schedule not in SCHEDULES:
        raise SequenceParallelError(
            f"{where}: unknown schedule (got {schedule!r}; expected one of {list(SCHEDULES)})"
        )
    if prepare is not None:
        return prepare(operands)
    if on_gpu := [name for name, a in operands.named() if is_gpu_array(a)]:
        raise SequenceParallelError(
            f"{where}: {', '.join(on_gpu)} on a GPU where this path takes numpy arrays "
            "(GPU inputs go through sequence_parallel_attention and its backward)"
        )
    if world.heap.device_memory:
        raise SequenceParallelError(
            f"{where}: numpy inputs run on the host backend's symmetric memory (this World "
            f"runs the {world.backend} backend: pass GPU arrays, torch or cupy tensors or "
            "GPU Buffers, to the forward with schedule 'ring' or 'zigzag')"
        )
    return operands


def _check_operands(where: str, operands: Operands) -> None:
    """Each operand's kind, rank, dtype and shape, against q's."""
    for name, a in operands.named():
        want = 2 if name == "lse" else 3
        if not isinstance(a, np.ndarray | Buffer) or a.ndim != want:
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
    q, k, v = operands.q, operands.k, operands.v
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise SequenceParallelError(
            f"{where}: shapes do not match (got q {q.shape}, k {k.shape}, v {v.shape}; "
            "expected k and v [rows, kv_heads, head_dim] with q's rows and head_dim)"
        )
    if isinstance(operands, BackwardOperands):
        for name, a in (("out", operands.out), ("dout", operands.dout)):
            if a.shape != q.shape:
                raise SequenceParallelError(
                    f"{where}: {name} has the wrong shape (got {a.shape}; expected q's {q.shape})"
                )
        if operands.lse.shape != q.shape[:2]:
            raise SequenceParallelError(
                f"{where}: lse has the wrong shape (got {operands.lse.shape}; expected "
                f"{q.shape[:2]}, as returned by the forward with return_lse=True)"
            )
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise SequenceParallelError(
            f"{where}: num_kv_heads must divide num_heads (got {q.shape[1]} and {k.shape[1]})"
        )


def _positions(
    where: str, schedule: str, counts: list[int], total: int, size: int
) -> list[np.ndarray[Any, Any]]:
    """Each rank's token positions in the whole sequence: two segments per rank in zigzag
    (checked against the shard lengths), one contiguous run otherwise."""
    if schedule == "zigzag":
        bounds = shard_bounds(total, 2 * size)
        segs = [[bounds[r], bounds[2 * size - 1 - r]] for r in range(size)]
        if [sum(b - a for a, b in sg) for sg in segs] != counts:
            raise SequenceParallelError(
                f"{where}: zigzag shards have the wrong lengths (got {counts}; shard the "
                "caller's tokens with zigzag_shard)"
            )
        return [np.concatenate([np.arange(a, b) for a, b in sg]) for sg in segs]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return [np.arange(starts[r], starts[r + 1]) for r in range(size)]


def setup(
    comm: Communicator,
    where: str,
    operands: OperandsT,
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
    prepare: Prepare | None = None,
) -> tuple[Setup, OperandsT]:
    """Validate locally, then agree across ranks (one all-gather, which also exchanges the
    shard lengths): an argument error on any rank raises on every rank, so none is left
    waiting in the collective. ``prepare`` (GPU inputs) checks and converts the inputs
    first. Returns the setup and the operands the schedules take: what ``prepare`` made of
    ``operands``, or ``operands`` themselves."""
    world = comm.world
    if comm.team.members != world.team_world.members:  # every member refuses at once
        raise SequenceParallelError(
            f"{where}: runs on a Communicator of the whole World (got one of team "
            f"{comm.team.name}, {comm.team.n_pes} of {world.world_size} ranks: the sequence's "
            "shards, queues and slots are the World's)"
        )
    error: Exception | None = None
    record: tuple[Any, ...] = ()
    rows = 0
    left = right = None
    try:
        operands = _prepared(world, where, operands, schedule, prepare)
        _check_operands(where, operands)
        for name, value in (("block_m", block_m), ("block_n", block_n)):
            check_int(where, name, value)
        check_int(where, "unit_rows", unit_rows, optional=True)
        check_int(where, "threads", threads, optional=True)
        if stats is not None and not isinstance(stats, SequenceParallelStats):
            raise SequenceParallelError(
                f"{where}: stats must be a SequenceParallelStats (got {type(stats).__name__})"
            )
        left, right = normalise_window(window, where)
        docs_rec = None if valid_length is None else tuple(int(x) for x in valid_length)
        q, k = operands.q, operands.k
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
    meet_first(comm, where, text_of(where, record, rows))
    counts = agree(comm, where, record, rows, error)
    total, size = sum(counts), world.world_size
    positions = _positions(where, schedule, counts, total, size)
    q = operands.q
    dim = q.shape[2]
    chunk_rows = kv_chunk_rows = None
    if schedule == "dynamic":
        chunk_rows = unit_rows or max(block_m, -(-max(counts) // CHUNKS_PER_RANK), 1)
        # the key/value side in whole shards by default: a query chunk's partial results
        # are then folded once per home rank, as on the ring, while the query chunks keep
        # the units small enough to balance (an explicit unit_rows cuts both sides)
        kv_chunk_rows = unit_rows
    cores = CPU().attributes.cores or 1
    st = Setup(
        world=world,
        counts=counts,
        positions=positions,
        mask=MaskSpec(causal=bool(causal), left=left, right=right),
        docs=document_offsets(where, valid_length, total),
        scale=float(1.0 / math.sqrt(dim) if scale is None else scale),
        heads=q.shape[1],
        kv_heads=operands.k.shape[1],
        dim=dim,
        threads=threads or max(1, cores // world.local_size),
        chunk_rows=chunk_rows,
        order="lpt" if schedule == "dynamic" else "ring",
        kv_chunk_rows=kv_chunk_rows if schedule == "dynamic" else chunk_rows,
    )
    return st, operands


def document_offsets(where: str, valid_length: Any, total: int) -> np.ndarray[Any, Any] | None:
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


def finish_stats(
    st: Setup, stats: SequenceParallelStats | None, mine: SequenceParallelStats, start: float
) -> None:
    """Wall and idle time, and every rank's busy time (collective: all ranks pass stats)."""
    if stats is None:
        return
    mine.wall_s = time.perf_counter() - start
    mine.idle_s = max(mine.wall_s - mine.busy_s, 0.0)
    busy = allgather_within(
        st.world.comm,
        mine.busy_s,
        st.world.config.signal.timeout_s,
        "sequence-parallel stats",
        st.world.heap.progress,
    )
    mine.busy_per_rank = tuple(float(b) for b in busy)
    for f in dataclasses.fields(SequenceParallelStats):
        setattr(stats, f.name, getattr(mine, f.name))


def symmetric(
    world: Any, shapes: dict[str, tuple[tuple[int, ...], str]], zeroed: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Allocate symmetric buffers (collective): int64 ones and those named in ``zeroed``
    zero-filled; on failure free those already made."""
    bufs: dict[str, Any] = {}
    try:
        for name, (shape, dtype) in shapes.items():
            bufs[name] = (
                world.zeros(shape, dtype)
                if dtype == "int64" or name in zeroed
                else world.empty(shape, dtype)
            )
    except BaseException:
        close_all(bufs)
        raise
    return bufs


def close_all(bufs: dict[str, Any]) -> None:
    for buf in reversed(list(bufs.values())):
        buf.close()


def merge_partial(out: Any, lse: Any, o_part: Any, l_part: Any) -> None:
    """Fold a partial (O, LSE) into the running one, rows where the partial saw keys."""
    if lse.size == 0 or lse.max() == -np.inf:  # nothing yet (the first partial): a copy,
        out[...] = o_part  # bitwise the same as the fold (weights exactly 0 and 1)
        lse[...] = l_part
        return
    new = np.logaddexp(lse, l_part)
    seen = np.isfinite(new)
    with np.errstate(invalid="ignore"):  # -inf - -inf where neither saw a key: masked out
        w_old = np.where(seen, np.exp(np.where(seen, lse - new, 0)), 0).astype(np.float32)
        w_new = np.where(seen, np.exp(np.where(seen, l_part - new, 0)), 0).astype(np.float32)
    out *= w_old[..., None]  # in place: the same two products and sum, rounded alike
    out += o_part * w_new[..., None]
    lse[...] = new
