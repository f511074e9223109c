"""The GPU kernels' float8 conversions (collectives/kernels/allreduce.cu, the section between
``BEGIN fp8`` and ``END fp8``, plain C too) compiled with the host's C compiler and checked
bit for bit against ml_dtypes, the host backend's float8: every code decoded, and float32
values of every exponent, the rounding ties, overflows, NaN and infinity encoded. Needs no
GPU; skipped without a C compiler."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.compile

SOURCE = Path(__file__).resolve().parents[2] / "collectives" / "kernels" / "allreduce.cu"
FORMATS = {  # name: (dtype, mantissa bits, bias, e4m3fn encoding)
    "e4m3": (ml_dtypes.float8_e4m3fn, 3, 7, 1),
    "e5m2": (ml_dtypes.float8_e5m2, 2, 15, 0),
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    text = SOURCE.read_text()
    section = text[text.index("// BEGIN fp8") : text.index("// END fp8")]
    d = tmp_path_factory.mktemp("fp8")
    c = d / "fp8.c"
    c.write_text("#include <string.h>\n#define FP8_HD\n" + section)
    so = d / "fp8.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(so), str(c)], check=True, timeout=60)
    lib = ctypes.CDLL(str(so))
    lib.fp8_from_f32.restype = ctypes.c_ubyte
    lib.fp8_from_f32.argtypes = [ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.fp8_to_f32.restype = ctypes.c_float
    lib.fp8_to_f32.argtypes = [ctypes.c_ubyte, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_code_decodes_as_ml_dtypes(lib: Any, name: str) -> None:
    dtype, mbits, bias, fn = FORMATS[name]
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(dtype).astype(np.float32)
    got = np.array([lib.fp8_to_f32(int(c), mbits, bias, fn) for c in codes], np.float32)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    assert got[~nan].tobytes() == want[~nan].tobytes()  # signed zeros included


@pytest.mark.parametrize("name", list(FORMATS))
def test_float32_encodes_as_ml_dtypes(lib: Any, name: str) -> None:
    dtype, mbits, bias, fn = FORMATS[name]
    rng = np.random.default_rng(3)
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    finite = codes[np.isfinite(codes)]
    mids = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # ties between neighbours
    values = np.concatenate(
        [
            finite,
            np.sort(finite),
            mids.astype(np.float32),
            np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
            np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
            rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            (rng.standard_normal(5000) * 2.0 ** rng.integers(-30, 30, 5000)).astype(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 480, 464, 61440],
                     np.float32),
        ]
    )  # fmt: skip
    sorted_vals = np.sort(np.concatenate([values, -values]))
    want = sorted_vals.astype(dtype).view(np.uint8)
    got = np.array([lib.fp8_from_f32(float(v), mbits, bias, fn) for v in sorted_vals], np.uint8)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [
        (float(sorted_vals[i]), hex(int(got[i])), hex(int(want[i]))) for i in bad[:10]
    ]
