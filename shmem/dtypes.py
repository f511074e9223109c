"""The dtypes the runtime supports, accepted as numpy dtypes or strings.

numpy has no bfloat16 or float8: those come from ``ml_dtypes``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import ml_dtypes
import numpy as np

from .errors import ArgumentError

__all__ = [
    "SUPPORTED_DTYPES",
    "Casting",
    "DTypeLike",
    "ShapeLike",
    "as_dtype",
    "as_shape",
    "dtype_name",
    "int_operand",
]

Casting = Literal["no", "equiv", "safe", "same_kind", "unsafe"]
"""numpy's casting rules, as ``put(..., casting=)`` takes them."""

DTypeLike = np.dtype[Any] | type | str
"""A dtype: a numpy dtype, a scalar type (``np.float32``) or any spelling numpy accepts."""
ShapeLike = int | np.integer[Any] | tuple[int, ...] | list[int]
"""A shape: one extent, or a sequence of extents."""

SUPPORTED_DTYPES: dict[str, np.dtype[Any]] = {
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
    # C's long double (x86-64: 80-bit extended precision in 16 bytes); RMA and reductions,
    # no DLPack (DLPack has no such type)
    "longdouble": np.dtype(np.longdouble),
}

_ALIASES = {
    "float8_e4m3fn": "float8_e4m3",
    "e4m3": "float8_e4m3",
    "e5m2": "float8_e5m2",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "bf16": "bfloat16",
    "bool_": "bool",
    "complex": "complex128",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "long double": "longdouble",
    "longfloat": "longdouble",
}

_BY_DTYPE = {dt: name for name, dt in SUPPORTED_DTYPES.items()}


def as_dtype(dtype: Any, where: str = "as_dtype") -> np.dtype[Any]:
    """Return the numpy dtype for ``dtype``: a numpy dtype, a scalar type, one of the names of
    ``shmem.SUPPORTED_DTYPES`` (and ``"bf16"``, ``"e4m3"``, ``"e5m2"``, C's ``"half"``,
    ``"float"`` = float32, ``"double"``), or any other spelling numpy accepts (``"i4"``,
    ``"f8"``, ``"l"``, ``"<u2"``, ``"?"``) for one of the supported dtypes.

    Raises :class:`~shmem.errors.ArgumentError` naming ``where`` when unsupported.

    Parameters
    ----------
    dtype : dtype-like
        The dtype, in any of the spellings above.
    where : str, optional
        The caller's name, which heads the error message.

    Returns
    -------
    numpy.dtype
        The supported numpy dtype (``ml_dtypes``' for bfloat16 and the float8 formats).

    Raises
    ------
    ArgumentError
        ``dtype`` is None, big-endian, or not one of the supported dtypes.
    """
    if dtype is None:  # numpy reads None as float64: a silent default is a bug here
        raise ArgumentError(
            f"{where}: unsupported dtype (got None; expected one of {sorted(SUPPORTED_DTYPES)})"
        )
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name in SUPPORTED_DTYPES:
            return SUPPORTED_DTYPES[name]
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        dt = None
    if dt is not None and dt in _BY_DTYPE:
        return SUPPORTED_DTYPES[_BY_DTYPE[dt]]
    if dt is not None and dt.byteorder == ">" and dt.newbyteorder("=") in _BY_DTYPE:
        raise ArgumentError(
            f"{where}: unsupported byte order (got {dtype!r}, big-endian; expected the "
            "machine's byte order)"
        )
    raise ArgumentError(
        f"{where}: unsupported dtype (got {dtype!r}; expected one of {sorted(SUPPORTED_DTYPES)})"
    )


def as_shape(where: str, shape: Any) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints (``ArgumentError`` naming ``where`` if not)."""
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ArgumentError(
            f"{where}: invalid shape (got {shape!r}; expected an int or a tuple of ints)"
        ) from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0:
            raise ArgumentError(
                f"{where}: invalid shape (got {shape!r}; expected non-negative integers)"
            )
    return tuple(int(d) for d in dims)


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The canonical name of a supported dtype (``"bfloat16"``, ``"float8_e4m3"``...)."""
    return _BY_DTYPE[dtype]


def float_operand(where: str, name: str, value: object, dtype: np.dtype[Any]) -> float:
    """``value`` as a Python float that ``dtype`` (float32 or float64) holds without turning a
    finite value into an infinity; ``inf`` and ``nan`` themselves pass. Raises
    :class:`~shmem.errors.ArgumentError` naming ``where`` for anything else (the same on
    every path: no ``OverflowError`` from packing, no silent ``inf``)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ArgumentError(
            f"{where}: invalid {name} (got {value!r} of type {type(value).__name__}; expected "
            f"a real number for {dtype_name(dtype)})"
        )
    try:
        v = float(value)
    except OverflowError:
        v = math.inf  # an int beyond float64: out of range below
    finite_in = math.isfinite(v) if isinstance(value, float | np.floating) else True
    if finite_in and not (math.isfinite(v) and abs(v) <= float(np.finfo(dtype).max)):
        raise ArgumentError(
            f"{where}: {name} out of range (got {value!r}; expected |{name}| <= "
            f"{float(np.finfo(dtype).max):g} for {dtype_name(dtype)})"
        )
    return v


def int_operand(
    where: str, name: str, value: object, dtype: np.dtype[Any], *, wrap_negative: bool = False
) -> int:
    """``value`` as a Python int that ``dtype`` (an integer dtype) can hold.

    ``wrap_negative``: on an unsigned dtype a negative value ``-n`` (``n <= 2**bits``) becomes
    ``2**bits - n``, as C's unsigned arithmetic does (an atomic add of ``-1`` decrements).
    Raises :class:`~shmem.errors.ArgumentError` naming ``where`` for a non-integer or a value
    out of range (the same on every path: no numpy ``OverflowError`` leaks out).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentError(
            f"{where}: invalid {name} (got {value!r} of type {type(value).__name__}; expected "
            f"an integer for {dtype_name(dtype)})"
        )
    v = int(value)
    info = np.iinfo(dtype)
    if wrap_negative and dtype.kind == "u" and -(1 << (8 * dtype.itemsize)) < v < 0:
        return v + (1 << (8 * dtype.itemsize))
    if not int(info.min) <= v <= int(info.max):
        raise ArgumentError(
            f"{where}: {name} out of range (got {v}; expected {info.min} <= {name} <= "
            f"{info.max} for {dtype_name(dtype)})"
        )
    return v
