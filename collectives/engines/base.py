"""The engine protocol, and the steps every engine takes alike.

A :class:`~collectives.Communicator` validates its construction, picks one engine and hands
each call to it whole: liveness, the choice of path and the call itself are the engine's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np

from shmem import Buffer, SHMEMBuffer, World, flight
from shmem.callreport import Reporter, mismatch_error
from shmem.dtypes import dtype_name
from shmem.errors import (
    CollectiveArgumentError,
    CollectiveMismatchError,
    PeerFailedError,
    ShmemStateError,
)

from ..operand import Array, Operand
from ..ops import ReduceOp, accumulate_dtype, check_op, fused_out_dtype
from ..schedule import Algorithm
from ..signature import COLLECTIVES, describe_args

__all__ = [
    "Engine",
    "Input",
    "Output",
    "Result",
    "check_live",
    "explain",
    "mismatched",
    "not_on_channel",
    "refuse_device_buffers",
    "single_node",
    "widened_all_reduce",
]

Input = SHMEMBuffer | Array
Output = SHMEMBuffer | Array | None
Result = SHMEMBuffer | Array | Buffer  # what an all-reduce may return
AllReduce = Callable[[Any, ReduceOp | str, Any, Algorithm | str, object, Any, Any], Result]


class Engine(Protocol):
    """What a Communicator hands its calls to (one engine per communicator, chosen once).

    Every method is the Communicator method of the same name, with its semantics and errors
    (see :class:`collectives.Communicator`); ``closed`` is the communicator's state,
    ``stream`` its calls' number in the flight recorder (:mod:`shmem.flight`).
    """

    closed: bool
    stream: int

    @property
    def scratch_capacity(self) -> int: ...
    @property
    def scratch_nbytes(self) -> int: ...
    @property
    def cross(self) -> object: ...

    def choose(self, algorithm: Algorithm | str, nbytes: int, where: str) -> str: ...
    def all_reduce(
        self,
        x: Any,
        op: ReduceOp | str,
        out: Any,
        algorithm: Algorithm | str,
        stream: object,
        out_dtype: Any,
        scale: float | None,
    ) -> Result: ...
    def reduce_scatter(
        self, x: Input, op: ReduceOp | str, out: Output, stream: object
    ) -> Input: ...
    def all_gather(self, x: Input, out: Output, stream: object) -> Input: ...
    def broadcast(self, x: Input, root: int, out: Output, stream: object) -> Input: ...
    def all_to_all(self, x: Input, out: Output, stream: object) -> Input: ...
    def collect(self, x: Input, out: Output) -> Input: ...
    def alltoalls(
        self, x: Input, nelems: int, dst_stride: int, src_stride: int, out: Output
    ) -> Input: ...
    def all_to_allv(
        self, x: Input, send_counts: Sequence[int], recv_counts: Sequence[int], out: Output
    ) -> Input: ...
    def barrier(self, timeout: float | None) -> None: ...
    def close(self) -> None: ...


_RECORDED = COLLECTIVES  # each engine method recorded


def _recording(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, an engine's method, with its calls recorded as ``op`` on the engine's
    stream in the flight recorder (:mod:`shmem.flight`), and a mismatch reported
    (:func:`explain`)."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with flight.recording(self.stream, op, args[0] if args and op != "barrier" else None):
                return fn(self, *args, **kwargs)
        except (CollectiveMismatchError, PeerFailedError) as exc:
            text = describe_args(op, args)
            raise explain(self.reporter, self.stream, 0, exc, f"Communicator.{op}", text) from None

    return functools.update_wrapper(call, fn)


def mismatched(exc: BaseException) -> bool:
    """Whether ``exc`` says ranks called different collectives (found here, or learnt from
    a peer that stopped on it)."""
    return isinstance(exc, CollectiveMismatchError) or (
        isinstance(exc, PeerFailedError) and exc.mismatch
    )


def explain(
    reporter: Reporter | None,
    stream: int,
    call: int,
    exc: BaseException,
    where: str,
    text: str,
) -> BaseException:
    """The error a call that failed with ``exc`` raises: for a mismatch, every member's own
    account of its call, exchanged now (:mod:`shmem.callreport`; this member's is ``text``,
    numbered by the flight recorder's ``stream``, else ``call``), in a
    ``CollectiveMismatchError`` every member raises alike (``where``: this member's call);
    else ``exc`` itself."""
    if reporter is None or not mismatched(exc) or getattr(exc, "calls", None):
        return exc
    if getattr(exc, "agreed", False):  # every rank knows already (another rank's bad argument)
        return exc
    rec = flight.recorder()
    number = rec.calls(stream) or call
    rec.fail_current(stream)  # (before the wait for the others' lines: see fail_current)
    lines = reporter.exchange(number, text)
    return mismatch_error(where, lines).with_traceback(exc.__traceback__)


class ChannelFree:
    """What the engines without a channel (the GPU and team engines) answer alike: no
    scratch of their own, one node's algorithms, no algorithm to choose; and their calls
    recorded in the flight recorder (each subclass's collectives and barrier; a GPU call
    as it is enqueued: it ends when it returns, not when its kernels do)."""

    world: World
    stream = 0  # the engine's number in the flight recorder (each sets its own)
    reporter: Reporter | None = None  # who exchanges report lines on a mismatch (explain)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for op in _RECORDED:
            if op in cls.__dict__:
                setattr(cls, op, _recording(op, cls.__dict__[op]))

    def _live(self, where: str) -> object:
        raise NotImplementedError

    @property
    def scratch_capacity(self) -> int:
        return max(int(self.world.config.collectives.scratch_nbytes), 1 << 20)

    @property
    def scratch_nbytes(self) -> int:
        return 0

    @property
    def cross(self) -> object:
        raise single_node()

    def choose(self, algorithm: Algorithm | str, nbytes: int, where: str) -> str:
        self._live(where)
        raise not_on_channel(where)


def check_live(closed: bool, world: World, where: str) -> None:
    """Raise :class:`~shmem.errors.ShmemStateError` when the communicator is closed or its
    World is finalized (``where``: the Communicator method)."""
    if closed:
        raise ShmemStateError(f"Communicator.{where}: the communicator is closed")
    world.check_open(f"Communicator.{where}")


def refuse_device_buffers(x: object, out: object) -> None:
    """Raise unless ``x`` and ``out`` are host operands (an all-reduce off the nvshmem
    backend)."""
    if isinstance(x, Buffer) or isinstance(out, Buffer):
        raise CollectiveArgumentError(
            "Communicator.all_reduce: device Buffers need the nvshmem backend (got "
            f"{type(x).__name__} and {type(out).__name__}; expected SHMEMBuffer or numpy "
            "arrays on the host backend)"
        )


def single_node() -> ShmemStateError:
    """The error of ``Communicator.cross`` where there is no other node."""
    return ShmemStateError("Communicator.cross: the job has a single node")


def not_on_channel(where: str) -> ShmemStateError:
    """The error of a call that only the host engine's channel serves."""
    return ShmemStateError(
        f"Communicator.{where}: not available on the nvshmem backend yet (its GPU "
        "kernels cover all_reduce, reduce_scatter, all_gather, broadcast and "
        "all_to_all); use a host World (backend='host') for it"
    )


def widened_all_reduce(
    all_reduce: AllReduce,
    x: Input,
    op: ReduceOp | str,
    out: Output,
    algorithm: Algorithm | str,
    out_dtype: Any,
    scale: float | None,
    acc32: np.dtype[Any],
) -> Input:
    """``all_reduce`` with ``out_dtype``/``scale`` on the host: the input is widened to its
    accumulation dtype first (the reduction that dtype's all-reduce runs is the same
    rank-order reduction, without the final rounding), scaled there, and rounded once to
    ``out_dtype``. ``all_reduce``: the engine's own (positional arguments as
    :meth:`Engine.all_reduce`'s)."""
    where = "Communicator.all_reduce"
    src = Operand(x, where, "x").array  # the normal path's checks and errors
    odt = fused_out_dtype(src.dtype, out_dtype, scale, where)
    check_op(op, src.dtype, where)
    target: Array | None = None
    if out is not None:
        target = out.local() if isinstance(out, SHMEMBuffer) else out
        if (
            not isinstance(target, np.ndarray)
            or target.dtype != odt
            or target.size != src.size
            or not target.flags.writeable
        ):
            kind = getattr(target, "dtype", type(target).__name__)
            got = f"{kind} {getattr(target, 'size', '?')}"
            raise CollectiveArgumentError(
                f"{where}: invalid out (got {got} elements; expected a writeable "
                f"{dtype_name(odt)} array of {src.size})"
            )
    # the final accumulation dtype (a float32 all-reduce may accumulate in float64):
    # the inner call then rounds nothing, and the cast below is the one rounding
    acc = accumulate_dtype(accumulate_dtype(src.dtype, acc32), acc32)
    wide = cast(
        "Array",
        all_reduce(np.ascontiguousarray(src, dtype=acc), op, None, algorithm, None, None, None),
    )
    if scale is not None:
        np.multiply(wide, acc.type(scale), out=wide)
    if target is None:
        return wide.astype(odt, copy=False).reshape(src.shape)
    np.copyto(target, wide.reshape(target.shape), casting="unsafe")  # any layout of out
    return out  # type: ignore[return-value]
