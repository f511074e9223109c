"""Every CUDA source of the project compiles to an sm_90 cubin with NVRTC (no GPU needed).

Skipped only when cuda.core or NVRTC is not installed; ``SHMEM_REQUIRE_NVRTC=1`` (set by
scripts/test.sh, so in CI) turns that skip into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for d in ("shmem/kernels", "collectives/kernels", "tests/gpu/kernels")
    for p in (ROOT / d).glob("*.cu")
)


def _program() -> tuple[type, type]:
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError as exc:
        if os.environ.get("SHMEM_REQUIRE_NVRTC") == "1":
            pytest.fail(f"cuda.core is required here (SHMEM_REQUIRE_NVRTC=1): {exc}")
        pytest.skip(f"cuda.core is not installed ({exc}); pip install '.[nvrtc]'")
    return Program, ProgramOptions


def test_sources_exist() -> None:
    assert any(p.name == "strided_copy.cu" for p in SOURCES)
    assert any(p.name == "saxpy.cu" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_compiles_to_sm90_cubin(path: Path) -> None:
    """With the runtime's own options (``shmem.device.cuda.nvrtc.compile_cubin``); in a test
    run that names a shared cache (``TESTS_KERNEL_CACHE``, scripts/test.sh) the cubins land
    there for the fake-GPU tier to load."""
    _program()
    from shmem.device.cuda import nvrtc as _nvrtc

    shared = os.environ.get("TESTS_KERNEL_CACHE")
    obj = _nvrtc.compile_cubin(
        _nvrtc.source_of(str(path.relative_to(ROOT))),
        name=path.name,
        arch="90",
        cache=Path(shared) if shared else False,
    )
    assert bytes(obj.code[:4]) == b"\x7fELF", "a cubin is an ELF image"


def test_broken_source_is_reported() -> None:
    program, options = _program()
    with pytest.raises(Exception, match="error"):
        program(
            'extern "C" __global__ void k() { nope; }',
            "c++",
            options=options(arch="sm_90", name="broken.cu"),
        ).compile("cubin")
