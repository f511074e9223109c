"""Operands of the collectives: inputs, outputs and the argument check (package-internal).

A collective takes a :class:`~shmem.SHMEMBuffer` (zero-copy: peers read it where it is) or a
C-contiguous numpy array (staged through scratch). :class:`Operand` is the flat local view of
either; :func:`output_array` resolves an ``out`` argument; :func:`agree` makes every rank
raise together on a bad argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from shmem import SUPPORTED_DTYPES, SHMEMBuffer
from shmem.agreement import compare_across_ranks
from shmem.dtypes import as_dtype, dtype_name
from shmem.errors import CollectiveArgumentError, ShmemError, ShmemStateError

from .signature import signature

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["Array", "Checked", "Operand", "agree", "output_array", "prepare"]

Array = np.ndarray[Any, np.dtype[Any]]
_SUPPORTED = frozenset(SUPPORTED_DTYPES.values())


class Operand:
    """A collective's input or output: the flat local array, and the SHMEMBuffer if any."""

    __slots__ = ("array", "count", "dtype", "obj", "shmem")

    def __init__(self, obj: SHMEMBuffer | Array, where: str, name: str) -> None:
        if type(obj) is np.ndarray and obj.ndim == 1 and obj.flags.c_contiguous:
            self.shmem: SHMEMBuffer | None = None
            self.array: Array = obj
        elif isinstance(obj, SHMEMBuffer):
            if obj.closed:
                raise ShmemStateError(
                    f"{where}: {name} is a closed SHMEMBuffer (expected an open one: a closed "
                    "buffer's memory is freed)"
                )
            self.shmem = obj
            self.array = obj.local().reshape(-1)
        elif isinstance(obj, np.ndarray):
            self.shmem = None
            if obj.flags.c_contiguous:
                self.array = obj.reshape(-1)
            elif name == "out":  # written into: a copy would lose the result
                raise CollectiveArgumentError(
                    f"{where}: {name} must be C-contiguous (got strides {obj.strides}; expected "
                    "a contiguous array: numpy.ascontiguousarray)"
                )
            else:  # an input: read through a contiguous copy, on every path alike (the
                # cached replays read strided inputs as they are)
                self.array = np.ascontiguousarray(obj).reshape(-1)
        else:
            raise CollectiveArgumentError(
                f"{where}: {name} must be a SHMEMBuffer or a numpy array (got {type(obj).__name__})"
            )
        self.obj = obj
        dt = self.array.dtype
        self.dtype: np.dtype[Any] = dt if dt in _SUPPORTED else as_dtype(dt, where)
        self.count: int = self.array.shape[0]


def output_array(
    out: SHMEMBuffer | Array | None, count: int, dtype: np.dtype[Any], where: str, like: Operand
) -> tuple[SHMEMBuffer | Array, Array]:
    """``(object to return, flat array to write)`` for an ``out`` argument (None: a new array
    shaped like the input when counts match, else flat)."""
    if out is None:
        shape = like.obj.shape if like.count == count else (count,)
        arr = np.empty(shape, dtype=dtype)
        return arr, arr.reshape(-1)
    if (
        type(out) is np.ndarray
        and out.ndim == 1
        and out.dtype == dtype
        and out.size == count
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        return out, out
    o = Operand(out, where, "out")
    if not o.array.flags.writeable:
        raise CollectiveArgumentError(
            f"{where}: out must be writeable (got a read-only {type(out).__name__}; expected "
            "an array the result can be written into)"
        )
    if o.dtype != dtype or o.count != count:
        raise CollectiveArgumentError(
            f"{where}: invalid out (got {o.count} elements of {dtype_name(o.dtype)}; expected "
            f"{count} elements of {dtype_name(dtype)})"
        )
    return out, o.array


class Checked(Protocol):
    """What :func:`agree` needs: the debug switch, a call counter, the deadline and the
    communicator."""

    check_args: bool
    calls: int
    timeout_s: float
    signature: int

    @property
    def comm(self) -> MPI.Intracomm: ...


def agree(ch: Checked, where: str, record: tuple[object, ...], error: Exception | None) -> None:
    """Debug mode: all ranks compare (call number, collective, arguments) before any flag;
    a bad or differing argument raises on every rank (``CollectiveMismatchError`` names the
    ranks). Without ``[collectives] check_args`` an argument error is raised here, locally
    (ranks validate identically, so with identical arguments all raise together)."""
    ch.calls += 1
    ch.signature = signature(record) if error is None else 0
    if not ch.check_args:
        if error is not None:
            raise error
        return
    compare_across_ranks(
        ch.comm, where, ch.calls, record, error, ch.timeout_s, getattr(ch, "progress", None)
    )


def prepare(
    ch: Checked,
    where: str,
    x: SHMEMBuffer | Array,
    out: SHMEMBuffer | Array | None,
    out_count: Callable[[int], int],
    extra: tuple[object, ...] = (),
    validate: Callable[[Operand], tuple[object, ...] | None] | None = None,
    default_out_is_x: bool = False,
    name: str | None = None,
) -> tuple[Operand, SHMEMBuffer | Array, Array]:
    """Validate identically on every rank (and compare across ranks in debug mode):
    ``(input operand, object to return, flat output array)``. The call's record is ``(name
    (default: where), count, dtype, *extra, *what validate returned)``."""
    error: Exception | None = None
    xin: Operand | None = None
    ret: SHMEMBuffer | Array | None = None
    dst: Array | None = None
    record: tuple[object, ...] = (name or where, "invalid")
    try:
        xin = Operand(x, where, "x")
        more = validate(xin) if validate is not None else None
        target = x if (out is None and default_out_is_x) else out
        ret, dst = output_array(target, out_count(xin.count), xin.dtype, where, xin)
        record = (name or where, xin.count, dtype_name(xin.dtype), *extra, *(more or ()))
    except (ValueError, TypeError, ShmemError) as exc:  # also closed buffers
        error = exc
    agree(ch, where, record, error)
    if xin is None or ret is None or dst is None:  # agree() raised already; for the types
        raise CollectiveArgumentError(f"{where}: invalid arguments")
    return xin, ret, dst
