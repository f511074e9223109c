"""The GPU run's setup (``./dev gpu`` does it first; scripts/gpu_run.py): a virtualenv over
the image's Python with the carried wheels, and the list of those wheels.

    python3 scripts/gpu_setup.py           # make (or reuse) $GPU_VENV, install .whl/*.whl
    python3 scripts/gpu_setup.py wheels    # the carried wheels' pins (./dev gpu-wheels)

The venv is made ``--without-pip`` (the image's Python may lack ensurepip; its own pip serves
the venv through the ``.pth``), sees the image's packages after its own, and names the image's
prefixes in ``site.PREFIXES``: cuda.pathfinder looks for NVIDIA's libraries
(``libnvshmem_host.so.3``, ``libnvrtc.so.13``) under ``site.getsitepackages()`` only, which in a
venv is the venv alone. The wheels are installed ``--no-deps --ignore-installed``: the carried
version wins even where the image has the same one. Environment: ``GPU_VENV``
(``/tmp/shmem-gpu-venv``), ``GPU_WHEELS`` (``.whl``), ``GPU_BASE_PY`` (this interpreter),
``GPU_SETUP=skip`` (use ``$GPU_VENV`` as it is: the dry run on the fake driver).

Standard library only: it runs on the image's Python before the virtualenv exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PTH = "_gpu_image.pth"
# What the GPU image lacks, or has in other versions: CPython 3.12 wheels that ./dev gpu-wheels
# downloads here into the ignored .whl/ and the setup installs there --no-deps
# --ignore-installed. The image's torch, cupy, numpy and NVSHMEM library are used as they are.
# The pins are pyproject.toml's (tests/unit/test_gpu_run.py holds them equal).
WHEELS = (
    "nvshmem4py-cu13==0.4.1",  # the NVSHMEM host API (needs cuda-python: --no-deps)
    "cuda-core==1.2.2",
    "cuda-bindings==13.4.4",
    "cuda-pathfinder==1.9.1",
    "mpich==5.0.2",  # mpiexec and libmpi beside the interpreter that runs the ranks
    "mpi4py==4.1.2",
    "ml-dtypes==0.6.0",
    "threadpoolctl==3.8.0",
    "pytest==9.2.0",
    "pytest-mpi==0.6",
    "pytest-timeout==2.4.0",
    "pluggy==1.7.0",  # pytest's own requirements
    "iniconfig==2.3.1",
    "packaging==26.4",
    "pygments==2.21.0",
)


def image_paths(base_py: str) -> tuple[list[str], list[str]]:
    """The image interpreter's site-packages folders and ``site.PREFIXES``."""
    code = "import json, site; print(json.dumps([site.getsitepackages(), site.PREFIXES]))"
    out = subprocess.run([base_py, "-c", code], capture_output=True, text=True, check=True)
    sites, prefixes = json.loads(out.stdout)
    return list(sites), list(prefixes)


def pth_text(sites: Sequence[str], prefixes: Sequence[str]) -> str:
    """The venv's view of the image: its folders on ``sys.path`` after the venv's own, and its
    prefixes in ``site.PREFIXES``, so that ``site.getsitepackages()`` (where cuda.pathfinder
    looks for libnvshmem_host and libnvrtc) names the image's folders too."""
    lines = [*sites]
    # one statement, no nested scope: site runs a .pth line with exec in a local namespace
    lines.append(
        f"import site; site.PREFIXES[:] = list(dict.fromkeys(site.PREFIXES + {list(prefixes)!r}))"
    )
    return "\n".join(lines) + "\n"


def setup() -> int:
    """Make (or reuse) the run's virtualenv and install the carried wheels into it."""
    venv = Path(os.environ.get("GPU_VENV", "/tmp/shmem-gpu-venv"))
    py = venv / "bin" / "python"
    if os.environ.get("GPU_SETUP") == "skip":  # the dry run: $GPU_VENV as it is
        print(f"setup skipped (GPU_SETUP=skip): {py}")
        return 0 if py.exists() and (venv / "bin" / "mpiexec").exists() else 1
    base = os.environ.get("GPU_BASE_PY", sys.executable)
    wheels = sorted(Path(os.environ.get("GPU_WHEELS", ROOT / ".whl")).glob("*.whl"))
    if not wheels:
        print("setup: no wheels in .whl/: run ./dev gpu-wheels here first and carry .whl")
        return 1
    if not py.exists():
        # ensurepip may be missing from the image's Python: its own pip serves the venv
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    sites, prefixes = image_paths(base)
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, PTH).write_text(pth_text(sites, prefixes))
    digest = hashlib.sha256("".join(w.name for w in wheels).encode()).hexdigest()[:16]
    stamp = venv / f".wheels-{digest}"
    if not stamp.exists():
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        # --ignore-installed: the carried version wins even where the image has the same one
        pip += ["--no-index", "--no-deps", "--no-compile", "--ignore-installed"]
        done = subprocess.run([*pip, *map(str, wheels)], check=False)
        if done.returncode != 0:
            print(f"setup: pip install failed (exit {done.returncode})")
            return 1
        for old in venv.glob(".wheels-*"):
            old.unlink()
        stamp.touch()
    listing = subprocess.run(
        [str(py), "-m", "pip", "list", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=False,
    )
    print(listing.stdout)
    if not (venv / "bin" / "mpiexec").exists():
        print(f"setup: no mpiexec beside {py} (the mpich wheel installs it)")
        return 1
    print(f"setup ok: {py} over {base}, {len(wheels)} carried wheels")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["wheels"]:
        print("\n".join(WHEELS))
        sys.exit(0)
    if sys.argv[1:]:
        sys.exit("usage: gpu_setup.py [wheels]")
    sys.exit(setup())
