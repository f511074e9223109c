"""Strided views as pure arithmetic: basic indexing over (shape, strides, offset).

Host buffers could lean on numpy for this; device buffers cannot, so both use these functions
(and the tests check them against numpy). Strides and offsets are in bytes. Pure: no numpy
arrays are touched, no MPI, no CUDA.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

from ..errors import ViewError

__all__ = ["ViewError", "contiguous_strides", "index_view", "is_contiguous", "single_index"]


def contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """Row-major (C) strides in bytes for ``shape``."""
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> bool:
    """Whether the view is C-contiguous (dimensions of length 1 may have any stride)."""
    if math.prod(shape) == 0:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _as_index(item: Any) -> int | None:
    if isinstance(item, bool):
        return None
    try:
        return operator.index(item)
    except TypeError:
        return None


def index_view(
    shape: Sequence[int], strides: Sequence[int], key: Any, where: str = "Buffer.__getitem__"
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Apply a basic index (ints, slices, ``...``, ``None``) to a strided view.

    Returns ``(byte_offset, shape, strides)`` of the result, relative to the input's start.

    Raises
    ------
    ViewError
        Advanced indexing (lists, arrays, booleans), too many indices, or an int out of range.
    """
    items = key if isinstance(key, tuple) else (key,)
    n_ellipsis = sum(1 for it in items if it is Ellipsis)
    if n_ellipsis > 1:
        raise ViewError(f"{where}: an index can only have a single ellipsis ('...')")
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consumed > len(shape):
        raise ViewError(
            f"{where}: too many indices (got {consumed}; expected at most {len(shape)} for a "
            f"rank-{len(shape)} buffer)"
        )
    if n_ellipsis == 0:
        items = (*items, Ellipsis)
    offset = 0
    out_shape: list[int] = []
    out_strides: list[int] = []
    dim = 0
    for item in items:
        if item is Ellipsis:
            fill = len(shape) - consumed
            out_shape.extend(shape[dim : dim + fill])
            out_strides.extend(strides[dim : dim + fill])
            dim += fill
            continue
        if item is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        size, stride = shape[dim], strides[dim]
        idx = _as_index(item)
        if idx is not None:
            if not -size <= idx < size:
                raise ViewError(
                    f"{where}: index {idx} is out of range for axis {dim} (expected "
                    f"{-size} <= index < {size})"
                )
            offset += (idx % size) * stride
            dim += 1
            continue
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            length = len(range(start, stop, step))
            if length:
                offset += start * stride
            out_shape.append(length)
            out_strides.append(stride * step)
            dim += 1
            continue
        raise ViewError(
            f"{where}: unsupported index (got {type(item).__name__} {item!r}; expected ints, "
            "slices, '...' or None: buffer views cannot use lists, arrays or booleans)"
        )
    return offset, tuple(out_shape), tuple(out_strides)


def single_index(shape: Sequence[int], key: Any) -> bool:
    """Whether ``key`` selects exactly one element (one int per dimension)."""
    items = key if isinstance(key, tuple) else (key,)
    if len(items) != len(shape):
        return False
    return all(_as_index(it) is not None for it in items)
