"""The CUDA-on-CPU layer itself (tests/fakegpu/cudacpu/README.md): each PTX operation against a
table worked out from the PTX ISA (not from the layer's code), the warp shuffles, the block
barrier, the schedule a seed permutes, and the faults it reports instead of hanging. The
kernels run on host memory through the layer directly (tests/fakegpu/cudacpu/harness.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tests.fakegpu import build
from tests.fakegpu.cudacpu.harness import Layer, Module, source

pytestmark = pytest.mark.fakegpu

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "fakegpu" / "cudacpu" / "harness.py"
LAYER_TESTS = ROOT / "tests" / "fakegpu" / "cudacpu" / "layer_tests.cu"


def _folder() -> Path:
    if build.compilers() is None:
        pytest.skip("no C and C++ compiler to build the CPU layer")
    return build.build(os.environ.get("FAKEGPU_BUILD") or ROOT / "logs" / "fakegpu")


@pytest.fixture(scope="module")
def layer() -> Layer:
    folder = _folder()
    os.environ.setdefault("CUDACPU_CACHE", str(folder / "modules"))
    return Layer(folder)


@pytest.fixture(scope="module")
def probe(layer: Layer) -> Module:
    return layer.load(source("tests/gpu/kernels/ptx_probe.cu"))


@pytest.fixture(scope="module")
def tests_module(layer: Layer) -> Module:
    return layer.load(LAYER_TESTS.read_text())


# -- conversions: round to nearest even (numpy's float16 and ml_dtypes' bfloat16 casts are),
# NaN to the canonical 0x7fff (PTX ISA, cvt: "NaN inputs produce a canonical NaN") ----------

SPECIAL = [
    0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e10, np.inf, -np.inf, np.nan,
    2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-25 + 2.0**-40, 1 + 2.0**-11,
    1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.4028234663852886e38, 1e-45, -7.5e-39,
]  # fmt: skip


def _f16(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(over="ignore"):
        bits = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    return np.where(np.isnan(x), 0x7FFF, bits)


def _bf16(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(invalid="ignore"):
        bits = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    return np.where(np.isnan(x), 0x7FFF, bits)


def test_conversions_round_to_nearest_even_bit_for_bit(probe: Module) -> None:
    rng = np.random.default_rng(1)
    magnitudes = np.exp2(rng.uniform(-30, 20, 3000)) * rng.choice([-1, 1], 3000)
    patterns = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([np.array(SPECIAL), magnitudes]).astype(np.float32)
    x = np.concatenate([x, patterns])
    n = x.size
    h = np.arange(n, dtype=np.uint32).astype(np.uint16)  # every 16-bit pattern up to n
    flat = np.zeros(6 * n, np.uint32)
    probe.launch("ptx_probe_cvt", (n + 127) // 128, 128, x, h, flat, np.int32(n))
    out = flat.reshape(n, 6)
    y = np.roll(x, -1)
    f16, bf16 = _f16(x), _bf16(x)
    np.testing.assert_array_equal(out[:, 0], f16)
    np.testing.assert_array_equal(out[:, 1], bf16)
    # cvt.f32.f16 is exact: the float32 of the float16 value (NaN stays a NaN)
    wide = f16.astype(np.uint16).view(np.float16).astype(np.float32)
    got = out[:, 2].view(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(wide))
    np.testing.assert_array_equal(got[~np.isnan(got)], wide[~np.isnan(wide)])
    # the x2 forms: the first operand in the upper half
    np.testing.assert_array_equal(out[:, 3], (f16 << 16) | _f16(y))
    np.testing.assert_array_equal(out[:, 4], (bf16 << 16) | _bf16(y))
    widened = h.view(np.float16).astype(np.float32)
    got = out[:, 5].view(np.float32)
    finite = ~np.isnan(widened)
    np.testing.assert_array_equal(got[finite], widened[finite])
    assert np.isnan(got[~finite]).all()
    # the NaN keeps its sign and payload (a float16 NaN m becomes m << 13)
    nans = ~finite
    assert ((out[nans, 5] >> 13) & 0x3FF == h[nans] & 0x3FF).all()


# -- mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
# groupID g = lane / 4, threadID_in_group t = lane % 4 ------------------------------------------


def _fragments(rng: np.random.Generator, dt: Any) -> tuple[Any, ...]:
    """Random A (16x16), B (16x8), C (16x8) and their fragments, lane by lane."""
    A = rng.standard_normal((16, 16)).astype(dt)
    B = rng.standard_normal((16, 8)).astype(dt)
    C = rng.standard_normal((16, 8)).astype(np.float32)

    def bits(m: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return m.view(np.uint16).astype(np.uint32)

    a, b = np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.float32)
    Ab, Bb = bits(A), bits(B)
    for lane in range(32):
        g, t = lane // 4, lane % 4

        def pair(r: int, col: int) -> int:
            return int(Ab[r, col] | (Ab[r, col + 1] << 16))

        # a0,a1: (g, 2t..); a2,a3: (g+8, 2t..); a4,a5: (g, 2t+8..); a6,a7: (g+8, 2t+8..)
        a[lane] = [pair(g, 2 * t), pair(g + 8, 2 * t), pair(g, 2 * t + 8), pair(g + 8, 2 * t + 8)]
        # b0,b1: rows (k) 2t, 2t+1 of column g; b2,b3: rows 2t+8, 2t+9
        b[lane] = [Bb[2 * t, g] | (Bb[2 * t + 1, g] << 16),
                   Bb[2 * t + 8, g] | (Bb[2 * t + 9, g] << 16)]  # fmt: skip
        # c0,c1: (g, 2t..2t+1); c2,c3: (g+8, 2t..2t+1)
        c[lane] = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
    return A, B, C, a, b, c


@pytest.mark.parametrize("kind", [0, 1], ids=["bf16", "f16"])
def test_mma_follows_the_isa_fragment_layouts(probe: Module, kind: int) -> None:
    rng = np.random.default_rng(2 + kind)
    dt = ml_dtypes.bfloat16 if kind == 0 else np.float16
    tiles = [_fragments(rng, dt) for _ in range(4)]  # one warp each
    a = np.concatenate([t[3] for t in tiles]).reshape(-1)
    b = np.concatenate([t[4] for t in tiles]).reshape(-1)
    c = np.concatenate([t[5] for t in tiles]).reshape(-1)
    d = np.zeros_like(c)
    probe.launch("ptx_probe_mma", 2, 64, a, b, c, d, np.int32(kind))
    d = d.reshape(4, 32, 4)
    for i, (A, B, C, *_) in enumerate(tiles):
        # D = A B + C: exact products summed in float64 (k in order), C added, rounded once
        s = np.zeros((16, 8))
        for k in range(16):
            s += A[:, k, None].astype(np.float64) * B[None, k, :].astype(np.float64)
        D = (s + C).astype(np.float32)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            want = [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]
            np.testing.assert_array_equal(d[i, lane], want, err_msg=f"tile {i} lane {lane}")


# -- ldmatrix .m8n8.x2.b16 (PTX ISA, "ldmatrix"): lanes 8i..8i+7 address matrix i's rows ------


@pytest.mark.parametrize("trans", [0, 1], ids=["plain", "trans"])
def test_ldmatrix_gives_each_lane_its_isa_elements(probe: Module, trans: int) -> None:
    rng = np.random.default_rng(4)
    m = rng.integers(0, 2**16, (32, 8), dtype=np.uint32).astype(np.uint16)
    rows = rng.permutation(32)[:32].astype(np.int32)
    out = np.zeros(64, np.uint32)
    probe.launch("ptx_probe_ldmatrix", 1, 32, m.reshape(-1), rows, out, np.int32(trans))
    for lane in range(32):
        for i in range(2):
            M = m[rows[8 * i : 8 * i + 8]].astype(np.uint32)  # matrix i, row by row
            r, col = lane // 4, 2 * (lane % 4)
            lo, hi = (M[col, r], M[col + 1, r]) if trans else (M[r, col], M[r, col + 1])
            assert out[2 * lane + i] == lo | (hi << 16), (lane, i)


def test_cp_async_lands_at_its_wait_group_and_zero_fills(probe: Module) -> None:
    rng = np.random.default_rng(5)
    src = rng.integers(0, 2**32, (64, 4), dtype=np.uint64).astype(np.uint32)
    flat = np.zeros((64 * 3, 4), np.uint32)
    probe.launch("ptx_probe_cp_async", 1, 64, src, flat)
    out = flat.reshape(64, 3, 4)
    np.testing.assert_array_equal(out[:, 0], src)  # group 0, after wait_group 1
    np.testing.assert_array_equal(out[:, 1], 0)  # src_size 0: zero-filled, after wait_group 0
    # before its wait the group's data has not landed (the layer lands it at the wait)
    np.testing.assert_array_equal(out[:, 2], 0xFEEDFACE)


def test_release_acquire_atomics_and_the_timer(probe: Module) -> None:
    word = np.array([40, 0], np.uint64)
    out = np.zeros(3, np.uint64)
    probe.launch("ptx_probe_order", 1, 32, word, out)
    assert word.tolist() == [45, 7] and out.tolist() == [40, 7, 1]


# -- the layer's scheduling ------------------------------------------------------------------


def test_warp_shuffles_meet_every_lane(tests_module: Module) -> None:
    out = np.zeros(4096, np.int32)
    tests_module.launch("shuffles", 1, 256, out)
    t = np.arange(256)
    lane, base = t % 32, t - t % 32
    np.testing.assert_array_equal(out[:256], 100 * (base + (lane ^ 5)))
    np.testing.assert_array_equal(out[256:512], 100 * (base + 7))
    np.testing.assert_array_equal(out[512:768], 100 * np.where(lane >= 3, t - 3, t))
    np.testing.assert_array_equal(out[768:1024], 100 * np.where(lane < 30, t + 2, t))
    np.testing.assert_array_equal(out[1024:1280], 100 * (t ^ 1))  # width 8: within 8 lanes
    np.testing.assert_array_equal(out[1280:1536], 100 * (t - t % 8 + 1))  # lane 9 % 8
    np.testing.assert_array_equal(out[1536:1792], t ^ 16)


def test_the_barrier_orders_a_blocks_writes(tests_module: Module) -> None:
    out = np.zeros(4096, np.int32)
    tests_module.launch("barrier_orders", 8, 64, out)
    assert out[0] == 0


def _tickets(seed: str | None) -> list[int]:
    code = (
        f"import sys, numpy as np; sys.path.insert(0, {str(ROOT)!r});"
        "from tests.fakegpu.cudacpu.harness import Layer;"
        "from pathlib import Path;"
        f"m = Layer({str(_folder())!r}).load(Path({str(LAYER_TESTS)!r}).read_text());"
        "out = np.zeros(4096, np.int32);"
        "m.launch('tickets', 2, 64, out); print(' '.join(map(str, out[:128])))"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDACPU_SEED"}
    if seed is not None:
        env["CUDACPU_SEED"] = seed
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
        check=True,
    )  # fmt: skip
    return [int(x) for x in run.stdout.split()]


def test_a_seed_permutes_the_schedule_and_reproduces_it() -> None:
    plain = _tickets(None)
    assert plain[:64] == list(range(64))  # in thread order without a seed
    a, again, b = _tickets("7"), _tickets("7"), _tickets("8")
    assert a == again and a not in (b, plain)
    assert sorted(a[:64]) == list(range(64))  # every thread took one ticket


# -- faults: reported with each thread's state, never a hang --------------------------------


def _fault(kernel: str, **env: str) -> str:
    run = subprocess.run(
        [sys.executable, str(HARNESS), str(LAYER_TESTS), kernel],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "FAKEGPU_BUILD": str(_folder()), **env},
    )  # fmt: skip
    assert run.returncode != 0, (kernel, run.stdout[-2000:])
    return run.stderr


def test_a_divergent_barrier_is_reported() -> None:
    err = _fault("divergent_barrier")
    assert "[cudacpu] BARRIER DIVERGENCE in kernel divergent_barrier" in err, err
    assert "threads meet at different __syncthreads" in err and "waiting in __syncthreads" in err


def test_a_deadlock_is_reported_with_every_threads_state() -> None:
    err = _fault("deadlock")
    assert re.search(r"\[cudacpu\] DEADLOCK in kernel deadlock, block \([01],0,0\)", err), err
    assert "thread 0: waiting in __syncthreads" in err, err
    assert "threads 1-31: waiting in __shfl_xor_sync" in err, err
    assert "threads 32-63: waiting in __syncthreads" in err, err


def test_a_lane_that_exited_before_a_warp_wide_operation_is_reported() -> None:
    err = _fault("exited_lane")
    assert "[cudacpu] WARP DIVERGENCE in kernel exited_lane" in err, err
    # (found when lane 3 exits after the others wait, or when one comes after it exited)
    assert (
        "thread 3 exited while lanes of its warp wait for it" in err
        or "for lane 3 of its warp, which has exited" in err
    ), err
    assert "thread 3: exited" in err and "waiting in __shfl_xor_sync" in err, err


def test_lanes_at_different_shuffles_are_reported() -> None:
    err = _fault("divergent_shuffle")
    assert "[cudacpu] WARP DIVERGENCE in kernel divergent_shuffle" in err, err
    assert "meet at different warp-wide operations" in err, err


def test_the_watchdog_reports_a_launch_that_makes_no_progress() -> None:
    err = _fault("spins_forever", CUDACPU_WATCHDOG_S="2")
    assert "[cudacpu] WATCHDOG: kernel spins_forever" in err, err
    assert "made no progress for 2 s" in err and "waiting in __syncthreads" in err, err


def test_a_cooperative_grid_larger_than_the_occupancy_is_refused(tests_module: Module) -> None:
    """Every block of a cooperative grid must be resident: 64-thread blocks, 32 a
    multiprocessor (the block limit), on 4 multiprocessors."""
    out = np.zeros(4096, np.int32)
    tests_module.launch("barrier_orders", 128, 64, out, cooperative=True)
    with pytest.raises(RuntimeError, match=r"\(720\).*cooperative grid of 129 blocks does not fit"):
        tests_module.launch("barrier_orders", 129, 64, out, cooperative=True)
    assert out[0] == 0
