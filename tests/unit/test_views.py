"""The pure view arithmetic, checked against numpy's own basic indexing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmem.device.views import (
    ViewError,
    contiguous_strides,
    index_view,
    is_contiguous,
    single_index,
)


def _numpy_view(
    arr: np.ndarray[Any, Any], key: Any
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    items = key if isinstance(key, tuple) else (key,)
    if not any(it is Ellipsis for it in items):
        items = (*items, Ellipsis)
    view = arr[items]
    base = arr.__array_interface__["data"][0]
    offset = view.__array_interface__["data"][0] - base if view.size else None
    return offset or 0, view.shape, view.strides


index_item = st.one_of(
    st.integers(-6, 5),
    st.builds(
        slice,
        st.none() | st.integers(-7, 7),
        st.none() | st.integers(-7, 7),
        st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3]),
    ),
    st.just(Ellipsis),
    st.none(),
)


@settings(max_examples=500, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=0, max_size=4),
    key=st.lists(index_item, max_size=5),
    dtype=st.sampled_from(["int8", "float32", "float64"]),
)
def test_matches_numpy(shape: list[int], key: list[Any], dtype: str) -> None:
    arr = np.zeros(shape, dtype=dtype)
    k = tuple(key)
    try:
        expected = _numpy_view(arr, k)
    except (IndexError, TypeError, ValueError):
        with pytest.raises(ViewError):
            index_view(arr.shape, arr.strides, k)
        return
    offset, out_shape, out_strides = index_view(arr.shape, arr.strides, k)
    assert out_shape == expected[1]
    if np.prod(out_shape) > 0:
        assert offset == expected[0]
        assert all(
            s == e for s, e, n in zip(out_strides, expected[2], out_shape, strict=True) if n > 1
        )


def test_contiguity() -> None:
    assert contiguous_strides((2, 3, 4), 4) == (48, 16, 4)
    assert is_contiguous((2, 3), (12, 4), 4)
    assert not is_contiguous((2, 3), (4, 8), 4)
    assert is_contiguous((1, 3), (999, 4), 4)  # a length-1 axis may have any stride
    assert is_contiguous((0, 3), (5, 5), 4)


def test_errors_and_single_index() -> None:
    with pytest.raises(ViewError, match="too many indices"):
        index_view((2,), (4,), (0, 0))
    with pytest.raises(ViewError, match=r"index 5 is out of range for axis 0"):
        index_view((3,), (4,), 5)
    with pytest.raises(ViewError, match="cannot use lists, arrays or booleans"):
        index_view((3,), (4,), [0, 1])
    with pytest.raises(ViewError, match="single ellipsis"):
        index_view((3,), (4,), (Ellipsis, Ellipsis))
    assert single_index((2, 3), (1, -1))
    assert not single_index((2, 3), (1, slice(None)))
    assert not single_index((2, 3), 1)
