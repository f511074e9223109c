"""Build the fake GPU's libraries into one folder (tests/fakegpu/README.md), once per version
of their sources, and give the environment that makes a process use them.

    python3 tests/fakegpu/build.py DIR               # builds, prints DIR
    python3 tests/fakegpu/build.py DIR --env CACHE   # also prints the environment, KEY=VALUE

- ``libcudacpu.so``: the CUDA-on-CPU runtime (``cudacpu/runtime.cpp``, C++20);
- ``libcuda.so.1`` (and ``libcuda.so``): the fake driver (``fake_libcuda.c``), linked to it;
- ``libnvrtc.so.13``: the recording NVRTC (``fake_nvrtc.c``), preloaded so that every cubin
  NVRTC compiles is recorded with its source for the fake driver to build for the CPU;
- ``libnvshmem_host.so.3``: the NVSHMEM stand-in (``fake_nvshmem.c``) under the real
  nvshmem4py, which finds it on ``LD_LIBRARY_PATH`` as it finds NVSHMEM's own where the
  ``nvidia-nvshmem`` wheel is not installed (cuda.pathfinder's last resort: the loader).

Concurrent builds into one folder wait for each other (a lock file); a folder built from the
same sources is reused.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYER = HERE / "cudacpu"
SOURCES = [
    HERE / "fake_libcuda.c",
    HERE / "fake_async.h",
    HERE / "fake_cubin.h",
    HERE / "fake_nvrtc.c",
    HERE / "fake_nvshmem.c",
    LAYER / "runtime.cpp",
    LAYER / "cudacpu_api.h",
    LAYER / "cudacpu.h",
    LAYER / "resources.tsv",
]


class BuildError(RuntimeError):
    """A library of the fake GPU did not build (the compiler's output is in the message)."""


def compilers() -> tuple[str, str] | None:
    """The C and C++ compilers, or None where either is missing."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    return (cc, cxx) if cc and cxx else None


def _stamp() -> str:
    h = hashlib.sha256()
    for path in SOURCES:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise BuildError(f"build.py: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def build(out: str | os.PathLike[str]) -> Path:
    """Build the four libraries into ``out`` (skipped when they are there for these
    sources); returns the folder.

    Raises
    ------
    BuildError
        A compiler is missing or failed.
    """
    found = compilers()
    if found is None:
        raise BuildError("build.py: the fake GPU needs a C and a C++ compiler (cc, g++)")
    cc, cxx = found
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / f".built-{_stamp()}"
    if stamp.exists():
        return folder
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return folder
        for old in folder.glob(".built-*"):
            old.unlink()
        runtime = folder / "libcudacpu.so"
        _run(
            [
                cxx, "-std=c++20", "-O2", "-g", "-fPIC", "-shared", "-Wall", "-Wextra",
                f'-DCUDACPU_INCLUDE_DIR="{LAYER}"', str(LAYER / "runtime.cpp"),
                "-o", f"{runtime}.tmp", "-lpthread", "-ldl",
            ]
        )  # fmt: skip
        os.replace(f"{runtime}.tmp", runtime)
        lib = folder / "libcuda.so.1"
        _run(
            [
                cc, "-shared", "-fPIC", "-O1", "-I", str(HERE), "-o", f"{lib}.tmp",
                str(HERE / "fake_libcuda.c"), str(runtime), f"-Wl,-rpath,{folder}",
                "-lm", "-lpthread",
            ]
        )  # fmt: skip
        os.replace(f"{lib}.tmp", lib)
        link = folder / "libcuda.so"
        if not link.exists():
            link.symlink_to(lib.name)
        nvrtc = folder / "libnvrtc.so.13"
        _run(
            [
                cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wl,-soname,libnvrtc.so.13",
                "-o", f"{nvrtc}.tmp", str(HERE / "fake_nvrtc.c"), "-ldl", "-lpthread",
            ]
        )  # fmt: skip
        os.replace(f"{nvrtc}.tmp", nvrtc)
        nvshmem = folder / "libnvshmem_host.so.3"
        _run(
            [
                cc, "-shared", "-fPIC", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
                "-Wl,-soname,libnvshmem_host.so.3", "-o", f"{nvshmem}.tmp",
                str(HERE / "fake_nvshmem.c"), "-ldl", "-lpthread",
            ]
        )  # fmt: skip
        os.replace(f"{nvshmem}.tmp", nvshmem)
        stamp.touch()
    return folder


def real_nvrtc() -> str:
    """The path of the real libnvrtc.so.13 (the NVIDIA wheel's), which the recording one
    forwards to."""
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    for root in roots:
        for hit in sorted(glob.glob(f"{root}/nvidia/cu*/lib/libnvrtc.so.*")):
            if "builtins" not in hit:
                return hit
    raise BuildError("build.py: no libnvrtc.so.13 under site-packages (pip install '.[nvrtc]')")


def environment(folder: Path, kernel_cache: str | os.PathLike[str]) -> dict[str, str]:
    """What a process needs to run on the fake GPU built in ``folder``, with NVRTC's cubins
    (and their recorded sources) under ``kernel_cache``."""
    cache = Path(kernel_cache).resolve()
    preload = " ".join(
        p for p in [str(folder / "libnvrtc.so.13"), os.environ.get("LD_PRELOAD", "")] if p
    )
    return {
        "LD_LIBRARY_PATH": f"{folder}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        "LD_PRELOAD": preload,
        "FAKE_NVRTC_REAL": real_nvrtc(),
        "SHMEM_KERNEL_CACHE": str(cache),
        "FAKE_KERNEL_SOURCES": str(cache / "sources"),
        "CUDACPU_CACHE": str(folder / "modules"),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--env"):
        print("usage: build.py DIR [--env KERNEL_CACHE]", file=sys.stderr)
        return 2
    try:
        folder = build(argv[0])
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(folder)
    if len(argv) == 3:
        for key, value in environment(folder, argv[2]).items():
            print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
