"""Sequence-parallel attention over symmetric memory: forward and backward, three schedules.

Each rank holds a shard of one sequence (its query, key and value rows) and computes attention
for its own queries over the whole sequence. The rows a rank holds are a list of *segments*
of the global sequence: one contiguous segment for ``ring`` and ``dynamic``, two for
``zigzag`` (the standard 2P-chunk causal balancing: rank ``r`` holds chunks ``r`` and
``2P - 1 - r``). K/V (and, for ``dynamic`` and the backward pass, Q and the gradients' inputs)
live in symmetric buffers; ranks read peers' rows through zero-copy peer views where they are
load/store reachable, else through one-sided gets, fetched while the previous block computes.
No rank ever holds the whole sequence.

* ``ring`` / ``zigzag`` forward (``_sp_ring.py``): at step ``s`` a rank uses the K/V rows of
  rank ``(r - s) mod P`` and folds the partial result into its running one by log-sum-exp:
  ``lse = logaddexp(lse_a, lse_b)``, ``O = O_a e^(lse_a - lse) + O_b e^(lse_b - lse)``.
* ``dynamic`` (``_sp_dynamic.py``): work units of (a query chunk on its home rank, a KV head
  with its query heads, a KV chunk), in per-rank queues ordered longest first with their
  counters in symmetric memory (``_units.py``). Each rank drains its own queue, then takes
  units from the other ranks' queues by atomic fetch-and-add. Every unit's partial
  ``(O, LSE)`` goes to a slot on its home rank, which merges the slots in a fixed order: the
  result is bitwise identical whichever rank computed a unit.
* Backward, every schedule (``_sp_backward.py``): the same units, each producing ``dQ`` for its
  query chunk and ``dK``/``dV`` for its KV chunk (FlashAttention-2 backward, ``P`` recomputed
  from the forward's LSE), summed at the two home ranks in a fixed order.

Arguments are agreed across ranks before any symmetric allocation (``_sp_setup.py``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, Unpack, cast, overload

import numpy as np

from shmem import Buffer, flight
from shmem.dtypes import dtype_name
from shmem.errors import SequenceParallelError

from ..communicator import Communicator
from ..interop import as_gpu_buffer, is_gpu_array, like
from ._sp_backward import backward
from ._sp_dynamic import forward_dynamic
from ._sp_gpu import backward_ring_gpu, forward_dynamic_gpu, forward_ring_gpu
from ._sp_ring import forward_ring
from ._sp_setup import (
    HOOKS,
    BackwardOperands,
    Operands,
    OperandsT,
    Prepare,
    finish_stats,
    setup,
    zigzag_shard,
    zigzag_unshard,
)
from ._units import SequenceParallelStats
from .gpu_args import GPU_DTYPES, MAX_HEAD_DIM
from .options import SequenceParallelKeywords, SequenceParallelOptions, resolve_options

__all__ = [
    "SequenceParallelOptions",
    "SequenceParallelStats",
    "sequence_parallel_attention",
    "sequence_parallel_attention_backward",
    "simulate_straggler",
    "zigzag_shard",
    "zigzag_unshard",
]

Array = np.ndarray[Any, np.dtype[Any]]


@contextlib.contextmanager
def simulate_straggler(factor: float) -> Iterator[None]:
    """Make this rank a straggler inside the block (a testing and benchmarking aid): every
    attention unit it computes takes ``factor`` times as long (it sleeps the difference).
    Other ranks of the ``dynamic`` schedule then take its work.

    Parameters
    ----------
    factor : float
        The slowdown, >= 1.

    Yields
    ------
    None
        Inside the block this rank is slowed down; the previous factor is restored after.

    Raises
    ------
    SequenceParallelError
        ``factor`` is not a number >= 1.
    """
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 1.0:
        raise SequenceParallelError(
            f"simulate_straggler: invalid factor (got {factor!r}; expected a number >= 1)"
        )
    before = HOOKS.slowdown
    HOOKS.slowdown = float(factor)
    try:
        yield
    finally:
        HOOKS.slowdown = before


_F = TypeVar("_F", bound=Callable[..., Any])


def _recorded(fn: _F) -> _F:
    """``fn`` (a collective of ``comm``) with its calls recorded on the communicator's stream
    in the flight recorder, its first array as the input."""

    def call(comm: Any, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else None
        with flight.recording(getattr(comm, "stream", 0), fn.__name__, x):
            return fn(comm, *args, **kwargs)

    return cast(_F, functools.update_wrapper(call, fn))


@overload
def sequence_parallel_attention(
    comm: Communicator,
    q: Array,
    k: Array,
    v: Array,
    *,
    options: SequenceParallelOptions | None = ...,
    return_lse: Literal[False] = ...,
    stats: SequenceParallelStats | None = ...,
    **overrides: Unpack[SequenceParallelKeywords],
) -> Array: ...
@overload
def sequence_parallel_attention(
    comm: Communicator,
    q: Array,
    k: Array,
    v: Array,
    *,
    options: SequenceParallelOptions | None = ...,
    return_lse: Literal[True],
    stats: SequenceParallelStats | None = ...,
    **overrides: Unpack[SequenceParallelKeywords],
) -> tuple[Array, Array]: ...
@overload
def sequence_parallel_attention(  # GPU arrays (torch, cupy, Buffer): results of q's kind
    comm: Communicator,
    q: Any,
    k: Any,
    v: Any,
    *,
    options: SequenceParallelOptions | None = ...,
    return_lse: Literal[False] = ...,
    stats: SequenceParallelStats | None = ...,
    **overrides: Unpack[SequenceParallelKeywords],
) -> Any: ...
@overload
def sequence_parallel_attention(
    comm: Communicator,
    q: Any,
    k: Any,
    v: Any,
    *,
    options: SequenceParallelOptions | None = ...,
    return_lse: Literal[True],
    stats: SequenceParallelStats | None = ...,
    **overrides: Unpack[SequenceParallelKeywords],
) -> tuple[Any, Any]: ...
@_recorded
def sequence_parallel_attention(
    comm: Communicator,
    q: Any,
    k: Any,
    v: Any,
    *,
    options: SequenceParallelOptions | None = None,
    return_lse: bool = False,
    stats: SequenceParallelStats | None = None,
    **overrides: Unpack[SequenceParallelKeywords],
) -> Any:
    """Attention of this rank's queries over the whole sharded sequence (collective).

    Parameters
    ----------
    comm : collectives.Communicator
    q, k, v : ndarray
        This rank's rows ``[rows, heads, head_dim]`` (``k``/``v`` may have fewer heads:
        GQA), float32, float16 or bfloat16. ``ring`` and ``dynamic``: rank ``r`` holds the
        ``r``-th contiguous shard (any lengths, in rank order). ``zigzag``: rank ``r`` holds
        :func:`zigzag_shard` of the sequence. On the nvshmem backend they may be GPU arrays
        (torch or cupy tensors, GPU Buffers; head_dim a multiple of 8 up to 128): every
        schedule then runs on the GPU kernels (the backward in ring order, whatever the
        schedule), returning arrays of ``q``'s kind.
    options : SequenceParallelOptions, optional
        Mask, scale, schedule and tiling (defaults: non-causal, ``dynamic``).
    return_lse : bool
        Also return the log-sum-exp ``[rows, heads]`` (float32; what the backward needs).
    stats : SequenceParallelStats, optional
        Filled in with this rank's busy and idle time and units taken (all ranks pass one
        or none).
    **overrides
        Fields of :class:`SequenceParallelOptions` (``causal=True``, ``schedule="ring"``,
        ...), applied over ``options``.

    Returns
    -------
    O for this rank's rows (dtype of ``q``), or ``(O, LSE)``.

    Raises
    ------
    SequenceParallelError, CollectiveMismatchError
        Invalid options or operands, raised on every rank (``CollectiveMismatchError`` when
        another rank's are invalid or the ranks disagree).
    """
    start = time.perf_counter()
    where = "sequence_parallel_attention"
    opts = _options(options, overrides, where)
    operands = Operands(q=q, k=k, v=v)
    gpu = any(is_gpu_array(a) for _, a in operands.named())
    prepare = _gpu_inputs(comm, opts, where) if gpu else None
    st, dev = setup(comm, where, operands, stats=stats, prepare=prepare, **_setup_args(opts))
    mine = SequenceParallelStats(schedule=str(opts.schedule))
    if gpu:
        if opts.schedule == "dynamic":
            out_gpu, lse_gpu = forward_dynamic_gpu(st, dev.q, dev.k, dev.v, mine, HOOKS.slowdown)
        else:
            out_gpu, lse_gpu = forward_ring_gpu(st, dev.q, dev.k, dev.v, mine)
        finish_stats(st, stats, mine, start)
        o_like = like(q, out_gpu)
        return (o_like, like(q, lse_gpu)) if return_lse else o_like
    run = forward_dynamic if opts.schedule == "dynamic" else forward_ring
    out, lse = run(st, q, k, v, opts.block_m, opts.block_n, mine, HOOKS.slowdown)
    finish_stats(st, stats, mine, start)
    result = out.astype(q.dtype, copy=False)
    return (result, lse) if return_lse else result


@overload
def sequence_parallel_attention_backward(
    comm: Communicator,
    dout: Array,
    q: Array,
    k: Array,
    v: Array,
    out: Array,
    lse: Array,
    *,
    options: SequenceParallelOptions | None = ...,
    stats: SequenceParallelStats | None = ...,
    **overrides: Unpack[SequenceParallelKeywords],
) -> tuple[Array, Array, Array]: ...
@overload
def sequence_parallel_attention_backward(  # GPU arrays: gradients of each input's kind
    comm: Communicator,
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    options: SequenceParallelOptions | None = ...,
    stats: SequenceParallelStats | None = ...,
    **overrides: Unpack[SequenceParallelKeywords],
) -> tuple[Any, Any, Any]: ...
@_recorded
def sequence_parallel_attention_backward(
    comm: Communicator,
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    options: SequenceParallelOptions | None = None,
    stats: SequenceParallelStats | None = None,
    **overrides: Unpack[SequenceParallelKeywords],
) -> tuple[Any, Any, Any]:
    """Gradients ``(dQ, dK, dV)`` of this rank's rows (collective).

    ``dout`` is dL/dO for this rank's rows; ``out`` and ``lse`` come from
    :func:`sequence_parallel_attention` with ``return_lse=True`` and the same options (any
    schedule: they are the same up to rounding). ``dK``/``dV`` have ``k``'s shape: with
    GQA they sum over each KV head's query heads. ``options``, ``stats`` and the keyword
    overrides are as for the forward, with the same sharding. Returns arrays of the dtypes
    of ``q``, ``k`` and ``v``.

    Parameters
    ----------
    comm : collectives.Communicator
    dout, q, k, v, out, lse : ndarray
        This rank's rows (see above).
    options, stats, **overrides
        As for the forward.

    Returns
    -------
    dQ, dK, dV
        Like ``q``, ``k`` and ``v`` (dtype and kind of array).

    Raises
    ------
    SequenceParallelError, CollectiveMismatchError
        Invalid options or operands, raised on every rank (``CollectiveMismatchError`` when
        another rank's are invalid or the ranks disagree).
    """
    where = "sequence_parallel_attention_backward"
    opts = _options(options, overrides, where)
    operands = BackwardOperands(q=q, k=k, v=v, out=out, dout=dout, lse=lse)
    if not any(is_gpu_array(a) for _, a in operands.named()):
        return backward(
            comm, dout, q, k, v, out, lse, stats=stats, slowdown=HOOKS.slowdown, **_setup_args(opts)
        )
    start = time.perf_counter()
    prepare = _gpu_inputs(comm, opts, where)
    st, dev = setup(comm, where, operands, stats=stats, prepare=prepare, **_setup_args(opts))
    mine = SequenceParallelStats(schedule=str(opts.schedule))
    grads = backward_ring_gpu(st, dev.q, dev.k, dev.v, dev.out, dev.dout, dev.lse, mine)
    finish_stats(st, stats, mine, start)
    return like(q, grads[0]), like(k, grads[1]), like(v, grads[2])


def _gpu_inputs(comm: Communicator, opts: SequenceParallelOptions, where: str) -> Prepare:
    """The check and conversion of GPU inputs, run inside the setup's agreement (so an
    error on one rank raises on every rank)."""
    world = comm.world
    heap: Any = world.heap

    def device_buffer(name: str, a: Any) -> Buffer:
        buf = as_gpu_buffer(a, name, where, 4 if name == "lse" else 16, error=SequenceParallelError)
        if buf.device != heap.device:
            raise SequenceParallelError(
                f"{where}: {name} is on {buf.device.label}, this rank's World on "
                f"{heap.device.label} (expected the World's GPU)"
            )
        return buf

    def prepare(operands: OperandsT) -> OperandsT:
        if not heap.device_memory:
            raise SequenceParallelError(
                f"{where}: GPU inputs need the nvshmem backend (this World runs the "
                f"{world.backend} backend; shmem.init(backend='nvshmem'), or pass numpy arrays)"
            )
        bufs = operands.convert(device_buffer)
        tensors = [(n, b) for n, b in bufs.named() if n != "lse"]
        dtypes = {dtype_name(b.dtype) for _, b in tensors}
        d = bufs.q.shape[-1]
        if len(dtypes) != 1 or not dtypes <= set(GPU_DTYPES):
            names = ", ".join(n for n, _ in tensors)
            raise SequenceParallelError(
                f"{where}: on GPUs {names} must share one dtype of {list(GPU_DTYPES)} (got "
                f"{sorted(dtypes)})"
            )
        if isinstance(bufs, BackwardOperands) and dtype_name(bufs.lse.dtype) != "float32":
            raise SequenceParallelError(
                f"{where}: lse must be float32 (got {dtype_name(bufs.lse.dtype)}; pass the "
                "forward's return_lse=True result)"
            )
        if d > MAX_HEAD_DIM or d % 8:
            raise SequenceParallelError(
                f"{where}: on GPUs head_dim must be a multiple of 8 up to {MAX_HEAD_DIM} (got {d})"
            )
        return bufs

    return prepare


def _options(
    options: SequenceParallelOptions | None, overrides: SequenceParallelKeywords, where: str
) -> SequenceParallelOptions:
    return resolve_options(options, overrides, where)


def _setup_args(opts: SequenceParallelOptions) -> dict[str, Any]:
    """The options as the keywords of the shared setup (checked there, on every rank)."""
    return {
        "schedule": opts.schedule,
        "causal": opts.causal,
        "window": opts.window,
        "valid_length": opts.valid_length,
        "scale": opts.scale,
        "block_m": opts.block_m,
        "block_n": opts.block_n,
        "unit_rows": opts.unit_rows,
        "threads": opts.threads,
    }
