"""The GPU run's preflight checks (``./dev gpu`` runs them first; any failure stops the run).

    python scripts/gpu_preflight.py versions    # driver, CUDA, packages, NVSHMEM, compute mode
    python -m launch -n 2 --allow-gpu-sharing scripts/gpu_preflight.py canary
        # nvshmem backend: init, a symmetric buffer, a ring put with signal, barrier, finalize

Each prints what it found and exits non-zero on the first thing a GPU run cannot do without.
"""

from __future__ import annotations

import importlib
import subprocess
import sys


def versions() -> int:
    problems: list[str] = []
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,compute_mode",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        said, ok = (smi.stdout.strip() or smi.stderr.strip()), smi.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        said, ok = f"nvidia-smi did not run ({exc})", False
    print(f"gpu: {said}")
    if not ok:
        problems.append("nvidia-smi failed")
    elif "Exclusive_Process" in said or "Prohibited" in said:
        # ranks share the one GPU: an exclusive-process GPU admits one of them only
        problems.append(f"the GPU's compute mode forbids sharing ({said})")
    print(f"python: {sys.version.split()[0]} at {sys.executable}")
    for name in ("numpy", "ml_dtypes", "cuda.core", "cuda.bindings", "mpi4py", "nvshmem"):
        try:
            mod = importlib.import_module(name)
            print(f"{name}: {getattr(mod, '__version__', '?')} ({getattr(mod, '__file__', '?')})")
        except Exception as exc:
            print(f"{name}: MISSING ({type(exc).__name__}: {exc})")
            problems.append(f"{name} does not import")
    for name in ("torch", "cupy"):  # the peers a user would pick: reported, not required
        try:
            print(f"{name}: {importlib.import_module(name).__version__}")
        except Exception as exc:
            print(f"{name}: missing ({exc})")
    try:
        from cuda.bindings import driver

        err, ver = driver.cuDriverGetVersion()
        print(f"CUDA driver API: {ver // 1000}.{ver % 1000 // 10} ({err})")
    except Exception as exc:
        problems.append(f"the CUDA driver API does not answer ({exc})")
    try:
        from mpi4py import MPI

        print(f"MPI: {MPI.Get_library_version().splitlines()[0]}")
    except Exception as exc:
        problems.append(f"libmpi does not load ({exc})")
    try:
        import shmem

        print(f"CUDA devices seen by shmem: {shmem.Device.count('cuda')}")
    except Exception as exc:
        problems.append(f"shmem sees no GPU ({type(exc).__name__}: {exc})")
    for p in problems:
        print(f"PREFLIGHT PROBLEM: {p}")
    return 1 if problems else 0


def canary() -> int:
    import numpy as np

    import shmem

    w = shmem.init(backend="nvshmem", heap_nbytes="64MiB", signal_timeout_s=30.0)
    heap = w.heap
    print(
        f"[{w.rank}/{w.world_size}] backend {w.backend}, NVSHMEM {getattr(heap, 'version', '?')}, "
        f"mode {getattr(heap, 'mode', '?')}, device {getattr(heap, 'device', '?')}",
        flush=True,
    )
    buf = w.zeros(1024, "float32")
    right = (w.rank + 1) % w.world_size
    buf.put(right, np.full(1024, w.rank + 1, np.float32), signal=(0, 1))
    w.wait_until(0, "ge", 1)
    got = buf.local().to_numpy()
    want = (w.rank - 1) % w.world_size + 1
    w.barrier()
    buf.close()
    w.finalize()
    if not (got == want).all():
        print(f"[{w.rank}] CANARY WRONG: got {got[:4]}, expected {want}", flush=True)
        return 1
    print(f"[{w.rank}] canary ok", flush=True)
    return 0


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("versions", "canary"):
        sys.exit("usage: gpu_preflight.py versions | canary")
    sys.exit(versions() if what == "versions" else canary())
