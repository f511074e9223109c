"""The GPU run's own checks (``./dev gpu``, scripts/gpu_run.py, runs them).

    python scripts/gpu_preflight.py versions [--json F]  # libraries loaded, versions, mode
    python -m launch -n 2 --allow-gpu-sharing scripts/gpu_preflight.py canary
        # nvshmem backend: init, a ring put with signal, a read through a peer pointer,
        # barrier, finalize
    python scripts/gpu_preflight.py compile FAMILIES.json  # every .cu for this GPU, in parallel
    python scripts/gpu_preflight.py coverage FAMILIES.json TRACE_DIR
        # every kernel family of the runtime was launched by the smoke tests

``versions`` exits non-zero only for what stops every GPU step (no driver, no GPU seen, a
compute mode that forbids sharing); a missing NVSHMEM or NVRTC library is printed as a
problem and stops only the steps that need it (their own checks fail).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_SOURCES = ("shmem/kernels", "collectives/kernels")
TEST_SOURCES = ("tests/gpu/kernels",)

# -- versions ---------------------------------------------------------------------------------


def _smi() -> tuple[bool, str]:
    query = "name,driver_version,memory.total,compute_mode,compute_cap"
    try:
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"nvidia-smi did not run ({exc})"
    return smi.returncode == 0, (smi.stdout.strip() or smi.stderr.strip())


def _loaded_libraries() -> list[str]:
    """Paths of the NVIDIA and MPI shared libraries mapped into this process."""
    wanted = re.compile(r"lib(cuda|nvrtc|nvshmem\w*|mpi|cudart|nvJitLink)\b[^/]*\.so")
    seen: list[str] = []
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return seen
    for line in maps:
        path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
        if path.startswith("/") and wanted.search(Path(path).name) and path not in seen:
            seen.append(path)
    return seen


def _version_of(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(json_path: str | None = None) -> int:
    found: dict[str, Any] = {"python": f"{sys.version.split()[0]} at {sys.executable}"}
    fatal: list[str] = []
    problems: list[str] = []
    ok, said = _smi()
    found["gpu"] = said
    if not ok:
        fatal.append("nvidia-smi failed")
    elif "Exclusive_Process" in said or "Prohibited" in said:
        # ranks share the one GPU: an exclusive-process GPU admits one of them only
        fatal.append(f"the GPU's compute mode forbids sharing ({said})")
    packages: dict[str, str] = {}
    for name, dist in (
        ("numpy", "numpy"),
        ("ml_dtypes", "ml-dtypes"),
        ("cuda.core", "cuda-core"),
        ("cuda.bindings", "cuda-bindings"),
        ("cuda.pathfinder", "cuda-pathfinder"),
        ("mpi4py", "mpi4py"),
        ("nvshmem.core", "nvshmem4py-cu13"),
        ("pytest", "pytest"),
        ("threadpoolctl", "threadpoolctl"),
    ):
        try:
            mod = importlib.import_module(name)
            packages[name] = f"{_version_of(dist)} ({getattr(mod, '__file__', '?')})"
        except Exception as exc:
            packages[name] = f"MISSING ({type(exc).__name__}: {exc})"
            problems.append(f"{name} does not import")
    for name in ("torch", "cupy"):  # the peers a user would pick: reported, not required
        try:
            mod = importlib.import_module(name)
            extra = ""
            if name == "torch":
                extra = f", CUDA {mod.version.cuda}, available {mod.cuda.is_available()}"
            packages[name] = f"{mod.__version__}{extra}"
        except Exception as exc:
            packages[name] = f"missing ({type(exc).__name__}: {exc})"
    found["packages"] = packages
    libraries: dict[str, str] = {}
    try:  # the real libraries, found the way nvshmem4py and cuda.core find them
        from cuda.pathfinder import load_nvidia_dynamic_lib

        for lib in ("nvshmem_host", "nvrtc"):
            try:
                loaded = load_nvidia_dynamic_lib(lib)
                libraries[lib] = f"{loaded.abs_path} (found via {loaded.found_via})"
            except Exception as exc:
                libraries[lib] = f"MISSING ({type(exc).__name__}: {exc})"
                problems.append(f"lib{lib} not found: the steps that need it fail")
    except ImportError as exc:
        problems.append(f"cuda.pathfinder does not import ({exc})")
    try:
        from cuda.bindings import driver

        err, ver = driver.cuDriverGetVersion()
        libraries["CUDA driver API"] = f"{ver // 1000}.{ver % 1000 // 10} ({err})"
    except Exception as exc:
        fatal.append(f"the CUDA driver API does not answer ({exc})")
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        libraries["NVRTC"] = f"{major}.{minor} ({err})"
    except Exception as exc:
        libraries["NVRTC"] = f"MISSING ({type(exc).__name__}: {exc})"
    try:
        import nvshmem.core as nv

        version = nv.get_version()
        libraries["NVSHMEM"] = str(getattr(version, "libnvshmem_version", version))
    except Exception as exc:
        libraries["NVSHMEM"] = f"MISSING ({type(exc).__name__}: {exc})"
        problems.append("NVSHMEM's library does not load: the NVSHMEM steps fail")
    try:
        from mpi4py import MPI

        libraries["MPI"] = MPI.Get_library_version().splitlines()[0]
    except Exception as exc:
        fatal.append(f"libmpi does not load ({exc})")
    try:
        import shmem

        found["CUDA devices seen by shmem"] = shmem.Device.count("cuda")
        if not found["CUDA devices seen by shmem"]:
            fatal.append("shmem sees no CUDA device")
    except Exception as exc:
        fatal.append(f"shmem sees no GPU ({type(exc).__name__}: {exc})")
    found["libraries"] = libraries
    found["loaded"] = _loaded_libraries()
    found["problems"] = problems
    found["fatal"] = fatal
    for key, value in found.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        elif isinstance(value, list):
            print(f"{key}:" + "".join(f"\n  {v}" for v in value) if value else f"{key}: none")
        else:
            print(f"{key}: {value}")
    for p in problems:
        print(f"PREFLIGHT PROBLEM (stops only what needs it): {p}")
    for p in fatal:
        print(f"PREFLIGHT PROBLEM: {p}")
    if json_path:
        Path(json_path).write_text(json.dumps(found, indent=2) + "\n")
    return 1 if fatal else 0


# -- the NVSHMEM canary -----------------------------------------------------------------------


def canary() -> int:
    import numpy as np

    import shmem

    w = shmem.init(backend="nvshmem", heap_nbytes="64MiB", signal_timeout_s=30.0)
    heap: Any = w.heap
    print(
        f"[{w.rank}/{w.world_size}] backend {w.backend}, NVSHMEM {getattr(heap, 'version', '?')}, "
        f"mode {getattr(heap, 'mode', '?')}, device {getattr(heap, 'device', '?')}",
        flush=True,
    )
    buf = w.zeros(1024, "float32")
    seen = w.zeros(1024, "float32")
    right = (w.rank + 1) % w.world_size
    buf.put(right, np.full(1024, w.rank + 1, np.float32), signal=(0, 1))
    w.wait_until(0, "ge", 1)
    got = buf.local().to_numpy()
    want = (w.rank - 1) % w.world_size + 1
    w.barrier()  # every rank has its neighbour's data
    # a load through the peer pointer NVSHMEM gave for the right neighbour's heap (another
    # process on the same GPU, at several ranks)
    peer = heap.peer_address(right, buf.offset)
    through_peer = None
    if peer is not None:
        heap.memcpy(heap.address(seen.offset), peer, buf.nbytes)
        heap.stream.sync()
        through_peer = seen.local().to_numpy()
    w.barrier()
    buf.close()
    seen.close()
    w.finalize()
    wrong = []
    if not (got == want).all():
        wrong.append(f"put with signal: got {got[:4]}, expected {want}")
    if through_peer is None:
        wrong.append(f"rank {right}'s heap is not reachable through a peer pointer")
    elif not (through_peer == w.rank + 1).all():
        wrong.append(f"peer pointer read: got {through_peer[:4]}, expected {w.rank + 1}")
    for line in wrong:
        print(f"[{w.rank}] CANARY WRONG: {line}", flush=True)
    if not wrong:
        print(f"[{w.rank}] canary ok", flush=True)
    return 1 if wrong else 0


# -- kernels: compile, families, coverage -----------------------------------------------------


def elf_functions(code: bytes) -> list[str]:
    """The global function symbols (the kernels) of a 64-bit little-endian ELF (a cubin)."""
    if code[:4] != b"\x7fELF" or code[4] != 2 or code[5] != 1:
        raise ValueError("elf_functions: not a 64-bit little-endian ELF image")
    (shoff,) = struct.unpack_from("<Q", code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * shentsize) for i in range(shnum)
    ]
    names: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name, info = struct.unpack_from("<IB", code, at)
            if info & 0xF == 2 and info >> 4 == 1:  # STT_FUNC, STB_GLOBAL
                end = code.index(b"\0", strtab + name)
                names.append(code[strtab + name : end].decode())
    return names


_DTYPES = (
    "bfloat16|float16|float32_acc64|float32|float64|u?int(?:8|16|32|64)|bool|"
    "complex(?:64|128)|float8_e4m3|float8_e5m2"
)
_DTYPE = re.compile(rf"_(?:{_DTYPES})(?=_|$)")
_OP = re.compile(r"_(?:sum|avg|prod|min|max)$")


def family(kernel: str) -> str:
    """A kernel's family: its name without the element types and the reduction op
    (``allreduce_two_shot_bfloat16_to_float32_avg`` -> ``allreduce_two_shot_to``,
    ``mha_fwd_float16_d80`` -> ``mha_fwd_d80``, ``reduce_scatter_int8_op`` ->
    ``reduce_scatter_op``). Each family is one code path of one kernel template."""
    return _OP.sub("", _DTYPE.sub("", kernel))


def sources(dirs: Iterable[str]) -> list[str]:
    return [str(p.relative_to(ROOT)) for d in dirs for p in sorted((ROOT / d).glob("*.cu"))]


def _compile_one(relative: str, arch: str) -> tuple[str, float, list[str]]:
    sys.path.insert(0, str(ROOT))
    from shmem.device.cuda import nvrtc as _nvrtc

    t0 = time.perf_counter()
    obj = _nvrtc.compile_cubin(_nvrtc.source_of(relative), name=Path(relative).name, arch=arch)
    return relative, time.perf_counter() - t0, elf_functions(bytes(obj.code))


def _arch() -> str:
    from cuda.core import Device

    major, minor = Device(0).compute_capability
    return f"{major}{minor}"


def compile_all(families_path: str, arch: str | None = None) -> int:
    """Every CUDA source of the project for this GPU's architecture, one process per file
    (the kernel cache keeps the cubins for the steps after); the runtime's kernel families
    to ``families_path``."""
    arch = arch or _arch()
    files = sources(RUNTIME_SOURCES) + sources(TEST_SOURCES)
    families: dict[str, list[str]] = {}
    failed = 0
    with ProcessPoolExecutor(max_workers=len(files), mp_context=get_context("spawn")) as pool:
        futures = {f: pool.submit(_compile_one, f, arch) for f in files}
        for relative, future in futures.items():
            try:
                _, seconds, kernels = future.result()
            except Exception as exc:
                print(f"FAIL {relative}: {type(exc).__name__}: {exc}")
                failed += 1
                continue
            print(f"ok   {relative}: {len(kernels)} kernels for sm_{arch} in {seconds:.1f} s")
            if not relative.startswith(TEST_SOURCES):
                for k in kernels:
                    families.setdefault(family(k), []).append(k)
    Path(families_path).write_text(json.dumps(families, indent=1, sort_keys=True) + "\n")
    print(f"{len(files) - failed} of {len(files)} sources compiled; {len(families)} families")
    return 1 if failed else 0


def coverage(families_path: str, trace_dir: str) -> int:
    """Which kernel families the smoke tests launched (the trace: one ``file kernel`` line per
    kernel a process loaded, ``TESTS_KERNEL_TRACE`` in tests/gpu/conftest.py)."""
    families = json.loads(Path(families_path).read_text())
    launched: dict[str, set[str]] = {}
    for trace in Path(trace_dir).glob("*.txt"):
        for line in trace.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                launched.setdefault(family(parts[1]), set()).add(parts[1])
    missing = sorted(set(families) - set(launched))
    for fam in sorted(families):
        mark = "ok  " if fam in launched else "MISS"
        print(f"{mark} {fam}: {len(launched.get(fam, ()))} of {len(families[fam])} launched")
    print(f"{len(families) - len(missing)} of {len(families)} kernel families launched")
    if missing:
        print(f"never launched: {' '.join(missing)}")
    return 1 if missing else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="what", required=True)
    v = sub.add_parser("versions")
    v.add_argument("--json")
    sub.add_parser("canary")
    c = sub.add_parser("compile")
    c.add_argument("families")
    c.add_argument("--arch", help="e.g. 90 (default: GPU 0's)")
    cov = sub.add_parser("coverage")
    cov.add_argument("families")
    cov.add_argument("trace")
    args = ap.parse_args(argv)
    if args.what == "versions":
        return versions(args.json)
    if args.what == "canary":
        return canary()
    if args.what == "compile":
        return compile_all(args.families, args.arch)
    return coverage(args.families, args.trace)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
