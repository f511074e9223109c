"""CUDA C++ compiled with NVRTC through cuda.core, cached on disk.

Cubins are cached by ``cuda.core.utils.FileStreamProgramCache`` under a key of the source
text, the compile options (architecture included) and the NVRTC version, so a changed kernel,
another GPU generation or another NVRTC never reuses a stale binary. The directory is
``$SHMEM_KERNEL_CACHE`` or ``$XDG_CACHE_HOME/shmem/kernels`` (``~/.cache/shmem/kernels``);
``SHMEM_KERNEL_CACHE=off`` disables the cache. Entries are written atomically, so ranks
compiling the same kernel at once are safe. Needs no GPU: only NVRTC.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

from ...config import env_value
from ...errors import KernelCompileError

__all__ = ["cache_dir", "compile_cubin", "nvrtc_version", "source_of"]

_ROOT = Path(__file__).resolve().parents[3]  # the directory holding shmem/ and collectives/
_lock = threading.Lock()
_caches: dict[Path, Any] = {}


def cache_dir() -> Path | None:
    """The kernel cache directory, or None when disabled (``SHMEM_KERNEL_CACHE=off``)."""
    env = env_value("SHMEM_KERNEL_CACHE") or ""
    if env.lower() in ("off", "0", "none"):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shmem" / "kernels"


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that compiles here."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if int(err) != 0:
        raise KernelCompileError(f"nvrtcVersion failed ({err})")
    return int(major), int(minor)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)


def source_of(relative: str) -> str:
    """The text of a kernel file shipped with the package, e.g. ``collectives/kernels/x.cu``,
    with each ``#include "path"`` (a path from the package root, such as
    ``shmem/kernels/ptx.cuh``) replaced by that file's text, once per source: NVRTC compiles
    one string, and what it compiled is that string (the CPU layer of the tests builds the
    same one)."""
    seen: set[str] = set()

    def expand(rel: str) -> str:
        seen.add(rel)

        def one(m: re.Match[str]) -> str:
            inc = m.group(1)
            if not (_ROOT / inc).is_file():
                raise KernelCompileError(
                    f"source_of({relative}): {rel} includes {inc!r}, which is not a file of "
                    "the package (expected a path from its root, e.g. shmem/kernels/ptx.cuh)"
                )
            return "" if inc in seen else f"// {inc}\n" + expand(inc)

        return _INCLUDE.sub(one, (_ROOT / rel).read_text())

    return expand(relative)


def _cache(directory: Path) -> Any:
    from cuda.core.utils import FileStreamProgramCache

    with _lock:
        if directory not in _caches:
            directory.mkdir(parents=True, exist_ok=True)
            _caches[directory] = FileStreamProgramCache(directory)
        return _caches[directory]


def compile_cubin(
    source: str,
    *,
    name: str,
    arch: str,
    defines: tuple[tuple[str, str], ...] = (),
    cache: Path | bool | None = True,
) -> Any:
    """Compile ``source`` to a cubin for ``arch`` (``"90"`` or ``"sm_90"``): a cuda.core
    ``ObjectCode`` (``get_kernel(name)`` needs a GPU).

    ``cache``: True for :func:`cache_dir`, a directory, or False/None for no cache.
    """
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError as exc:
        raise KernelCompileError(
            f"compile_cubin({name}): cuda.core is not installed ({exc}); pip install '.[nvrtc]'"
        ) from None
    if os.sep in name or "/" in name:
        raise KernelCompileError(
            f"compile_cubin: name must be a file name without a directory (got {name!r})"
        )
    sm = arch if arch.startswith("sm_") else f"sm_{arch}"
    options = ProgramOptions(
        arch=sm, std="c++17", name=name, define_macro=list(defines) if defines else None
    )
    directory = cache_dir() if cache is True else (cache or None)
    program = Program(source, "c++", options=options)
    try:
        if directory is None:
            return program.compile("cubin")
        return program.compile("cubin", cache=_cache(Path(directory)))
    except Exception as exc:
        raise KernelCompileError(f"compile_cubin({name}, {sm}): {exc}") from exc
    finally:
        program.close()
