"""The PTX operations on a GPU against the CUDA-on-CPU layer, with the same inputs: the first
step of tier 1 of ``./dev gpu`` (tests/fakegpu/cudacpu/README.md, "The PTX operations").

    python scripts/gpu_ptx_probe.py expect .whl/ptx_expected.npz   # here (./dev gpu-wheels)
    python scripts/gpu_ptx_probe.py compare .whl/ptx_expected.npz  # on the GPU machine

``expect`` runs each probe kernel of ``tests/gpu/kernels/ptx_probe.cu`` on the CPU layer (a C++
compiler needed) and saves the inputs and the layer's outputs; ``compare`` runs the same
kernels with those inputs on GPU 0 and compares: bit for bit for the conversions, ldmatrix,
cp.async and the atomics, within a stated tolerance for mma (the hardware's fp32 accumulation
order is not the layer's). Where the file is missing and a compiler is here, ``compare``
computes it first. One line per operation; exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROBE = "tests/gpu/kernels/ptx_probe.cu"
MMA_RTOL = 1e-5  # relative to the tile's largest |D|: a few fp32 ulps of accumulation order


@dataclass
class Case:
    """One launch of a probe kernel: ``args`` in parameter order (arrays are pointers;
    ``outputs`` names the indices of the arrays it writes)."""

    name: str
    kernel: str
    grid: int
    block: int
    args: list[Any]
    outputs: list[int]
    compare: Callable[[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]], str] = field(
        repr=False, default=lambda want, got: ""
    )


def _exact(want: list[np.ndarray[Any, Any]], got: list[np.ndarray[Any, Any]]) -> str:
    bad = [
        int(np.count_nonzero(w.view(np.uint8) != g.view(np.uint8)))
        for w, g in zip(want, got, strict=True)
    ]
    return "" if not any(bad) else f"{sum(bad)} bytes differ"


def _mma(want: list[np.ndarray[Any, Any]], got: list[np.ndarray[Any, Any]]) -> str:
    w, g = want[0].reshape(-1, 128), got[0].reshape(-1, 128)
    scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-30)
    err = float((np.abs(w - g) / scale).max())
    return "" if err <= MMA_RTOL else f"relative error {err:.2e} (tolerance {MMA_RTOL:.0e})"


def _cp_async(want: list[np.ndarray[Any, Any]], got: list[np.ndarray[Any, Any]]) -> str:
    # out[3t + 2] is slot 1 read before its group's wait: either value on a GPU
    w, g = want[0].reshape(64, 3, 4), got[0].reshape(64, 3, 4)
    return _exact([w[:, :2].copy()], [g[:, :2].copy()])


def _order(want: list[np.ndarray[Any, Any]], got: list[np.ndarray[Any, Any]]) -> str:
    return _exact(want, got)  # (the timer's check is 1 on both sides)


def cases() -> list[Case]:
    """The probe's launches with seeded random inputs (and the specials of each)."""
    rng = np.random.default_rng(2026)
    special = [0.0, -0.0, 1.0, 65504.0, 65520.0, 1e10, np.inf, -np.inf, np.nan, 2.0**-24,
               2.0**-25, 1 + 2.0**-11, 1 + 2.0**-8, 3.4e38, 1e-45]  # fmt: skip
    x = np.concatenate([special, np.exp2(rng.uniform(-30, 20, 4000)) * rng.choice([-1, 1], 4000)])
    x = np.concatenate(
        [x.astype(np.float32), rng.integers(0, 2**32, 1000).astype(np.uint32).view(np.float32)]
    )
    n = x.size
    h = rng.integers(0, 2**16, n).astype(np.uint16)
    out: list[Case] = [
        Case("cvt (f16, bf16, x2, f32.f16)", "ptx_probe_cvt", (n + 127) // 128, 128,
             [x, h, np.zeros(6 * n, np.uint32), np.int32(n)], [2], _exact),
    ]  # fmt: skip
    for kind, dt in ((0, ml_dtypes.bfloat16), (1, np.float16)):
        tiles = 8
        a = rng.standard_normal(tiles * 32 * 8).astype(dt).view(np.uint32)
        b = rng.standard_normal(tiles * 32 * 4).astype(dt).view(np.uint32)
        c = rng.standard_normal(tiles * 128).astype(np.float32)
        out.append(
            Case(
                f"mma m16n8k16 {'bf16' if kind == 0 else 'f16'}",
                "ptx_probe_mma",
                4,
                64,
                [a, b, c, np.zeros_like(c), np.int32(kind)],
                [3],
                _mma,
            )
        )
    m = rng.integers(0, 2**16, 256).astype(np.uint16)
    rows = rng.permutation(32).astype(np.int32)
    for trans in (0, 1):
        out.append(
            Case(
                f"ldmatrix x2{' trans' if trans else ''}",
                "ptx_probe_ldmatrix",
                1,
                32,
                [m, rows, np.zeros(64, np.uint32), np.int32(trans)],
                [2],
                _exact,
            )
        )
    src = rng.integers(0, 2**32, 256).astype(np.uint32)
    out.append(Case("cp.async, commit, wait_group", "ptx_probe_cp_async", 1, 64,
                    [src, np.zeros(64 * 12, np.uint32)], [1], _cp_async))  # fmt: skip
    word = np.array([40, 0], np.uint64)
    out.append(Case("acquire, release, atom.add, globaltimer", "ptx_probe_order", 1, 32,
                    [word, np.zeros(3, np.uint64)], [0, 1], _order))  # fmt: skip
    return out


def run_on_cpu(all_cases: list[Case]) -> list[list[np.ndarray[Any, Any]]]:
    """Each case on the CUDA-on-CPU layer (builds it: tests/fakegpu/build.py)."""
    sys.path.insert(0, str(ROOT))
    import os

    from tests.fakegpu import build
    from tests.fakegpu.cudacpu.harness import Layer, source

    folder = build.build(os.environ.get("FAKEGPU_BUILD") or ROOT / "logs" / "fakegpu")
    os.environ.setdefault("CUDACPU_CACHE", str(folder / "modules"))
    module = Layer(folder).load(source(PROBE))
    results = []
    for case in all_cases:
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
        module.launch(case.kernel, case.grid, case.block, *args)
        results.append([args[i] for i in case.outputs])
    return results


def run_on_gpu(all_cases: list[Case]) -> list[list[np.ndarray[Any, Any]]]:
    """Each case on GPU 0, through the runtime's own kernel loading (NVRTC, cached)."""
    sys.path.insert(0, str(ROOT))
    from cuda.core import Buffer as CCBuffer
    from cuda.core import Device, LaunchConfig, launch

    from shmem.device.cuda.kernels import kernel

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    results = []
    for case in all_cases:
        host = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
        bufs: dict[int, Any] = {}
        params: list[Any] = []
        for i, a in enumerate(host):
            if isinstance(a, np.ndarray):
                buf = dev.allocate(max(a.nbytes, 1), stream=stream)
                buf.copy_from(CCBuffer.from_handle(int(a.ctypes.data), a.nbytes), stream=stream)
                bufs[i] = buf
                params.append(np.uint64(int(buf.handle)))
            else:
                params.append(a)
        fn = kernel(0, PROBE, case.kernel)
        launch(stream, LaunchConfig(grid=case.grid, block=case.block), fn, *params)
        for i in case.outputs:
            bufs[i].copy_to(
                CCBuffer.from_handle(int(host[i].ctypes.data), host[i].nbytes), stream=stream
            )
        stream.sync()
        results.append([host[i] for i in case.outputs])
    return results


def save(path: Path, all_cases: list[Case], results: list[list[np.ndarray[Any, Any]]]) -> None:
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for k, (case, outs) in enumerate(zip(all_cases, results, strict=True)):
        for i, a in enumerate(case.args):
            if isinstance(a, np.ndarray):
                arrays[f"c{k}_in{i}"] = a
        for j, o in enumerate(outs):
            arrays[f"c{k}_out{j}"] = o
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)  # type: ignore[arg-type]


def load(path: Path, all_cases: list[Case]) -> list[list[np.ndarray[Any, Any]]]:
    """The saved outputs; the saved inputs replace the cases' (the same by construction,
    and the comparison must use exactly what the CPU layer saw)."""
    data = np.load(path)
    results = []
    for k, case in enumerate(all_cases):
        for i, a in enumerate(case.args):
            if isinstance(a, np.ndarray):
                case.args[i] = data[f"c{k}_in{i}"]
        results.append([data[f"c{k}_out{j}"] for j in range(len(case.outputs))])
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["expect", "compare"])
    ap.add_argument("path", type=Path)
    args = ap.parse_args()
    all_cases = cases()
    if args.mode == "expect":
        save(args.path, all_cases, run_on_cpu(all_cases))
        print(f"ptx probe: {len(all_cases)} cases on the CPU layer -> {args.path}")
        return 0
    if not args.path.exists():
        print(f"ptx probe: no {args.path}: computing the CPU layer's results here")
        save(args.path, all_cases, run_on_cpu(all_cases))
    want = load(args.path, all_cases)
    got = run_on_gpu(all_cases)
    failed = 0
    for case, w, g in zip(all_cases, want, got, strict=True):
        why = case.compare(w, g)
        failed += bool(why)
        print(f"ptx probe: {case.name}: {'DIFFERS: ' + why if why else 'same as the CPU layer'}")
    print(f"ptx probe: {len(all_cases) - failed} of {len(all_cases)} operations agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
