"""Reduction operators, accumulation dtypes, and the fixed-order reduction kernel.

Semantics: ``all_reduce(x, op)`` on every rank equals ``reduce(op, [x_0, x_1, ..., x_{P-1}])``
evaluated left to right, ``((x_0 op x_1) op x_2) ...``, in the accumulation dtype, rounded
once to the input dtype at the end. The order is fixed, so results are bitwise identical on
every rank and for every algorithm that keeps it (one-shot and two-shot do).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Sequence
from typing import Any, Literal

import ml_dtypes
import numpy as np

from shmem.dtypes import dtype_name
from shmem.errors import OpError

__all__ = [
    "CHUNK_BYTES",
    "C_FLOAT_OPS",
    "C_OPS",
    "C_WIDENED",
    "OPS",
    "STREAM_MIN",
    "UFUNCS",
    "OpName",
    "ReduceOp",
    "accumulate_dtype",
    "canonical_padding",
    "check_op",
    "divide_by_count",
    "fused_out_dtype",
    "int_avg",
    "reduce_into",
    "stage_copy",
    "stream_copy_available",
    "ufunc_of",
    "widen",
]


class ReduceOp(enum.StrEnum):
    """A reduction: ``ReduceOp.SUM`` and ``"sum"`` are interchangeable everywhere."""

    SUM = "sum"
    AVG = "avg"  # the sum divided by the world size (integers: truncated toward zero)
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    BAND = "band"  # bitwise and (integers and bool)
    BOR = "bor"
    BXOR = "bxor"


OpName = Literal["sum", "avg", "prod", "min", "max", "band", "bor", "bxor"]
OPS: tuple[str, ...] = tuple(op.value for op in ReduceOp)
_BITWISE = ("band", "bor", "bxor")
UFUNCS: dict[str, np.ufunc] = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}
_LOW_PRECISION = {
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
}
# Elements reduced per pass: small enough that the accumulator stays in cache while every
# rank's input streams through it.
CHUNK_BYTES = 256 << 10


_CHECKED: set[tuple[str, np.dtype[Any]]] = set()


def check_op(op: ReduceOp | str, dtype: np.dtype[Any], where: str) -> None:
    """Raise unless ``op`` applies to ``dtype`` (valid pairs are remembered)."""
    if isinstance(op, str) and (op, dtype) in _CHECKED:
        return
    _check_op(op, dtype, where)
    _CHECKED.add((str(op), dtype))


def _check_op(op: ReduceOp | str, dtype: np.dtype[Any], where: str) -> None:
    if not isinstance(op, str) or op not in OPS:
        raise OpError(f"{where}: unknown op (got {op!r}; expected one of {list(OPS)})")
    is_float = dtype.kind in "fc" or dtype in _LOW_PRECISION
    if op in _BITWISE and is_float:
        raise OpError(
            f"{where}: op {op!r} needs an integer or bool dtype (got {dtype_name(dtype)})"
        )
    if op == "avg" and dtype.kind == "b":
        raise OpError(f"{where}: op 'avg' does not apply to bool (got bool)")
    if dtype.kind == "c" and op not in ("sum", "prod", "avg"):
        raise OpError(
            f"{where}: op {op!r} does not apply to complex numbers (got "
            f"{dtype_name(dtype)}; expected 'sum', 'prod' or 'avg', as OpenSHMEM's complex "
            "reductions)"
        )


def accumulate_dtype(dtype: np.dtype[Any], float32_in: np.dtype[Any]) -> np.dtype[Any]:
    """float16/bfloat16/float8 -> float32; float32 -> ``float32_in``; others unchanged."""
    if dtype in _LOW_PRECISION:
        return np.dtype(np.float32)
    if dtype == np.dtype(np.float32):
        return float32_in
    return dtype


def _finite(value: Any) -> bool:
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:  # an int beyond float's range
        return False


def fused_out_dtype(
    dtype: np.dtype[Any], out_dtype: Any, scale: float | None, where: str
) -> np.dtype[Any]:
    """The output dtype of ``all_reduce(x, out_dtype=, scale=)`` for an input of ``dtype``
    (``out_dtype`` or ``dtype``), after checking both options: they apply to floating
    inputs and outputs (not complex), and ``scale`` is a finite real number."""
    from shmem.dtypes import as_dtype
    from shmem.errors import CollectiveArgumentError

    if out_dtype is None and scale is None:
        return dtype
    is_float = (dtype.kind == "f" or dtype in _LOW_PRECISION) and dtype.kind != "c"
    if not is_float:
        raise CollectiveArgumentError(
            f"{where}: out_dtype and scale apply to floating-point inputs (got {dtype})"
        )
    odt = dtype if out_dtype is None else as_dtype(out_dtype, where)
    if not (odt.kind == "f" or odt in _LOW_PRECISION):
        raise CollectiveArgumentError(
            f"{where}: invalid out_dtype (got {dtype_name(odt)}; expected a floating-point "
            "dtype such as float32)"
        )
    if scale is not None and (
        isinstance(scale, bool)
        or not isinstance(scale, int | float | np.floating | np.integer)
        or not _finite(scale)
    ):
        raise CollectiveArgumentError(
            f"{where}: invalid scale (got {scale!r}; expected a finite real number)"
        )
    return odt


# x87 extended precision (x86's long double) stores 10 bytes in 12 or 16: the rest is
# padding that arithmetic leaves as it was. Reductions zero it, so results are bitwise
# identical on every rank, as for every other dtype.
_LONG = np.dtype(np.longdouble)
_LONG_BYTES = 10 if np.finfo(np.longdouble).nmant == 63 and _LONG.itemsize > 10 else 0


def canonical_padding(out: np.ndarray[Any, Any]) -> None:
    """Zero the padding bytes of a long double array (a no-op for every other dtype)."""
    if _LONG_BYTES and out.dtype == _LONG and out.size:
        raw = out.reshape(-1).view(np.uint8).reshape(-1, _LONG.itemsize)
        raw[:, _LONG_BYTES:] = 0


_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)

# collectives._replay's codes: its ops, and the float16/bfloat16 types it accumulates in
# float32 (sums, products, averages: C_FLOAT_OPS), rounded once; _c_reduce_wide is None where
# the extension is not built or predates reduce_wide
C_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6, "avg": 7}
C_FLOAT_OPS = ("sum", "prod", "avg")
C_WIDENED = {np.dtype(np.float16): 10, _BF16: 11}
try:
    _c_replay_module: Any = importlib.import_module("collectives._replay")
except ImportError:
    _c_replay_module = None
_c_reduce_wide: Any = getattr(_c_replay_module, "reduce_wide", None)
_c_stream_copy: Any = getattr(_c_replay_module, "stream_copy", None)

# A numpy input staged for node-local peers from this many bytes is copied with streaming
# (non-temporal) stores (collectives._replay.stream_copy): a stage that large, with the input
# and the result, outgrows the caches (here a 32 MiB L3 shared by the node's ranks), and a
# stage written through this core's cache only makes the peers pull each line across from
# it. 2 ranks, float32, numpy out=, the general node-local route, cached -> streaming stores
# in one job (docs/benchmarks.md, "tenth pass"): all_reduce 8 / 12 MiB 1.23-1.33 / 1.34 ->
# 1.04-1.16 / 1.26 (worse: not streamed), 16 / 24 / 32 MiB 1.15-1.27 / 1.25 / 2.17 ->
# 1.23-1.41 / 1.42 / 2.51; at 4 ranks 16 / 32 MiB 1.60 / 2.26 -> 1.62 / 2.52; all_gather
# 16 / 32 MiB 0.79 / 0.74 -> 0.85 / 0.82; a broadcast beyond its plan, 32 MiB 0.46 -> 0.52
STREAM_MIN = 16 << 20


def stream_copy_available() -> bool:
    """Whether :func:`stage_copy` can write with streaming stores (the C extension built)."""
    return _c_stream_copy is not None


def stage_copy(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], stream: bool | None = None
) -> None:
    """``np.copyto(dst, src)`` of a numpy input into its stage (the same dtype and length),
    with streaming stores where ``stream`` (None: from :data:`STREAM_MIN` bytes), both are
    contiguous and the C extension is built (:mod:`collectives.stage_way` chooses)."""
    if stream is None:
        stream = dst.nbytes >= STREAM_MIN
    if (
        stream
        and _c_stream_copy is not None
        and src.flags.c_contiguous
        and dst.flags.c_contiguous
        and src.dtype == dst.dtype
        and src.shape == dst.shape
    ):
        _c_stream_copy(dst, src)
    else:
        np.copyto(dst, src)


def _reduce_wide_in_c(
    out: np.ndarray[Any, Any],
    sources: Sequence[np.ndarray[Any, Any]],
    op: str,
    acc_dtype: np.dtype[Any],
    avg_count: int | None,
) -> bool:
    """Whether :func:`reduce_into` of float16/bfloat16 in float32 was done in C (its bits:
    the same operations, an average's division, the same rounding); False leaves it to
    numpy (not such a call, an input it does not take, or a NaN or flag numpy must raise:
    ``out`` then partly written, so it is taken only where ``out`` overlaps no input)."""
    code = C_WIDENED.get(out.dtype)
    if (
        _c_reduce_wide is None
        or code is None
        or acc_dtype != _F32
        or op not in C_FLOAT_OPS
        or not out.flags.c_contiguous
        or any(s.dtype != out.dtype or not s.flags.c_contiguous for s in sources)
        or any(np.may_share_memory(out, s) for s in sources)
    ):
        return False
    if op == "avg" and avg_count is None:  # a partial: the plain sum
        op = "sum"
    count = avg_count or len(sources)  # (what an average divides by)
    return bool(_c_reduce_wide(out, list(sources), code, C_OPS[op], count))


def widen(src: np.ndarray[Any, Any], acc: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``src`` converted to ``acc``'s dtype, written into ``acc`` when that is cheaper.

    bfloat16 -> float32 is exact: the 16 bits become the top half of the float32 (a widening
    copy and a shift: about 2x faster than the generic cast).
    """
    if src.dtype == _BF16 and acc.dtype == _F32:
        bits = acc.view(np.uint32)
        np.copyto(bits, src.view(np.uint16))
        np.left_shift(bits, 16, out=bits)
        return acc
    return src.astype(acc.dtype)


def _narrow(acc: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """Round ``acc`` once into ``out`` (round-to-nearest-even, ml_dtypes' casts)."""
    np.copyto(out, acc, casting="unsafe")


def complex_multiply(
    a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """``out = a * b`` for complex arrays, componentwise: ``re = ar br - ai bi``, ``im = ar bi
    + ai br``, each product and sum one IEEE operation in the component type, never fused.
    numpy's own complex multiply may fuse (its SIMD loops use FMA where the CPU has it), so
    its bits depend on the machine; these are the same everywhere, and on the GPU
    (collectives/kernels/allreduce.cu). ``out`` may be ``a`` or ``b``."""
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    re = ar * br
    re -= ai * bi
    im = ar * bi
    im += ai * br
    out.real[...] = re
    out.imag[...] = im
    return out


def ufunc_of(op: str, dtype: np.dtype[Any]) -> Any:
    """The elementwise combination of ``op`` in ``dtype``: numpy's ufunc (``UFUNCS``), but
    :func:`complex_multiply` for a complex product. Called as ``f(a, b, out=out)``."""
    if op == "prod" and dtype.kind == "c":
        return complex_multiply
    return UFUNCS[op]


def divide_by_count(a: np.ndarray[Any, Any], count: int) -> None:
    """``a /= count`` in place for an average of floating or complex ``a``; a complex ``a``
    has each component divided by the real count (numpy's complex division by ``count + 0j``
    multiplies by its reciprocal: another rounding, and not the GPU's)."""
    if a.dtype.kind == "c":
        np.divide(a.real, a.real.dtype.type(count), out=a.real)
        np.divide(a.imag, a.imag.dtype.type(count), out=a.imag)
    else:
        np.divide(a, a.dtype.type(count), out=a)


def reduce_into(
    out: np.ndarray[Any, Any],
    sources: Sequence[np.ndarray[Any, Any]],
    op: str,
    acc_dtype: np.dtype[Any],
    avg_count: int | None = None,
) -> None:
    """``out = ((s0 op s1) op s2) ...`` elementwise, in ``acc_dtype``, rounded once into ``out``.

    For ``op="avg"`` the sum is divided by ``avg_count`` (when given) before that rounding;
    without it ``out`` holds the plain sum (a partial result to combine further). All arrays
    are 1-D of equal length. ``out`` may be ``sources[0]`` only when both are ``acc_dtype``.
    Works in cache-sized chunks so the accumulator is not streamed through memory P times.
    """
    n = out.shape[0]
    if n == 0 or _reduce_wide_in_c(out, sources, op, acc_dtype, avg_count):
        return
    ufunc = ufunc_of(op, acc_dtype)
    direct = out.dtype == acc_dtype and all(s.dtype == acc_dtype for s in sources)
    if direct and n * acc_dtype.itemsize <= CHUNK_BYTES:  # the common small case, unchunked
        if len(sources) == 1:
            if not np.shares_memory(out, sources[0]):
                np.copyto(out, sources[0])
        else:
            ufunc(sources[0], sources[1], out=out)
            for src in sources[2:]:
                ufunc(out, src, out=out)
        if op == "avg" and avg_count is not None:
            if out.dtype.kind in "fc":
                divide_by_count(out, avg_count)
            else:
                int_avg(out, avg_count)
        canonical_padding(out)
        return
    step = max(1, CHUNK_BYTES // max(acc_dtype.itemsize, 1))
    acc = None if direct else np.empty(min(step, n), dtype=acc_dtype)
    tmp = np.empty(0 if direct else min(step, n), dtype=acc_dtype)
    divide = op == "avg" and avg_count is not None
    count = avg_count or 1
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        if acc is None:
            dst = out[lo:hi]
            if len(sources) == 1:
                if not np.shares_memory(dst, sources[0]):
                    np.copyto(dst, sources[0][lo:hi])
            else:
                ufunc(sources[0][lo:hi], sources[1][lo:hi], out=dst)
                for src in sources[2:]:
                    ufunc(dst, src[lo:hi], out=dst)
            if divide and out.dtype.kind in "fc":
                divide_by_count(dst, count)
        else:
            a = acc[: hi - lo]
            first = widen(sources[0][lo:hi], a)
            if first is not a:
                np.copyto(a, first, casting="unsafe")
            for src in sources[1:]:
                ufunc(a, widen(src[lo:hi], tmp[: hi - lo]), out=a)
            if divide:
                divide_by_count(a, count)
            _narrow(a, out[lo:hi])
    if divide and out.dtype.kind in "iu":
        int_avg(out, avg_count or 1)
    canonical_padding(out)


def int_avg(out: np.ndarray[Any, Any], count: int) -> None:
    """Divide an integer sum by ``count`` in place, truncating toward zero (as C and NCCL)."""
    if out.dtype.kind == "u":
        np.floor_divide(out, out.dtype.type(count), out=out)
        return
    wide = out.astype(np.int64)
    q = np.abs(wide) // count
    np.copyto(out, np.where(wide < 0, -q, q), casting="unsafe")
