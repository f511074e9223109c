"""as_dtype: every spelling numpy accepts for a supported dtype, and clear refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from shmem import SUPPORTED_DTYPES
from shmem.dtypes import as_dtype, dtype_name
from shmem.errors import ArgumentError


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("i4", "int32"),
        ("f8", "float64"),
        ("l", "int64"),
        ("u2", "uint16"),
        ("?", "bool"),
        ("b1", "bool"),
        ("<f4", "float32"),
        ("=i8", "int64"),
        ("int", "int64"),
        ("int_", "int64"),
        ("e", "float16"),
        (np.int16, "int16"),
        (np.dtype("u8"), "uint64"),
        (ml_dtypes.bfloat16, "bfloat16"),
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("float8_e4m3fn", "float8_e4m3"),
        ("e5m2", "float8_e5m2"),
        # C's names, as the runtime has always read them
        ("half", "float16"),
        ("float", "float32"),
        ("double", "float64"),
        ("c8", "complex64"),
        ("D", "complex128"),
        (complex, "complex128"),
        ("g", "longdouble"),
        ("long double", "longdouble"),
    ],
)
def test_numpy_spellings_are_accepted(spelling: object, name: str) -> None:
    dt = as_dtype(spelling, "t")
    assert dt == SUPPORTED_DTYPES[name] and dtype_name(dt) == name


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("c32", r"t: unsupported dtype \(got 'c32'; expected one of"),
        ("not-a-dtype", r"t: unsupported dtype \(got 'not-a-dtype'"),
        (">i4", r"t: unsupported byte order \(got '>i4', big-endian"),
        (object, r"t: unsupported dtype"),
        (3.5, r"t: unsupported dtype \(got 3.5"),
    ],
)
def test_unsupported_spellings_are_refused_clearly(bad: object, match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        as_dtype(bad, "t")
