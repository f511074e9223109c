"""The on-disk NVRTC cubin cache: keyed by source, architecture and options; atomic entries;
disabled by SHMEM_KERNEL_CACHE=off. Needs NVRTC, not a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shmem.device.cuda import nvrtc as _nvrtc

pytestmark = pytest.mark.compile

SOURCE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.fixture(autouse=True)
def _needs_nvrtc() -> None:
    try:
        import cuda.core  # noqa: F401
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError as exc:
        if os.environ.get("SHMEM_REQUIRE_NVRTC") == "1":
            pytest.fail(f"cuda.core and NVRTC are required here: {exc}")
        pytest.skip(f"cuda.core is not installed ({exc})")


def entries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def test_a_compile_is_stored_then_reused(tmp_path: Path) -> None:
    first = _nvrtc.compile_cubin(SOURCE, name="k.cu", arch="90", cache=tmp_path)
    stored = entries(tmp_path)
    assert len(stored) == 1 and stored[0].read_bytes()[:4] == b"\x7fELF"
    again = _nvrtc.compile_cubin(SOURCE, name="k.cu", arch="sm_90", cache=tmp_path)
    assert bytes(again.code) == bytes(first.code)
    assert entries(tmp_path) == stored  # a hit: nothing new


@pytest.mark.parametrize(
    "change",
    [
        {"source": SOURCE + "// edited\n"},
        {"arch": "80"},
        {"defines": (("SCALE", "3"),)},
    ],
    ids=["source", "arch", "defines"],
)
def test_each_input_is_part_of_the_key(tmp_path: Path, change: dict[str, object]) -> None:
    base: dict[str, object] = {"source": SOURCE, "arch": "90", "defines": ()}
    _nvrtc.compile_cubin(str(base["source"]), name="k.cu", arch="90", cache=tmp_path)
    args = {**base, **change}
    _nvrtc.compile_cubin(
        str(args["source"]),
        name="k.cu",
        arch=str(args["arch"]),
        defines=args["defines"],  # type: ignore[arg-type]
        cache=tmp_path,
    )
    assert len(entries(tmp_path)) == 2


def test_the_cache_directory_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHMEM_KERNEL_CACHE", str(tmp_path / "c"))
    assert _nvrtc.cache_dir() == tmp_path / "c"
    _nvrtc.compile_cubin(SOURCE, name="k.cu", arch="90")
    assert len(entries(tmp_path / "c")) == 1
    monkeypatch.setenv("SHMEM_KERNEL_CACHE", "off")
    assert _nvrtc.cache_dir() is None
    _nvrtc.compile_cubin(SOURCE, name="k.cu", arch="90")  # compiles, stores nothing
    monkeypatch.delenv("SHMEM_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _nvrtc.cache_dir() == tmp_path / "xdg" / "shmem" / "kernels"


def test_errors_name_the_kernel(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"compile_cubin\(bad.cu, sm_90\)"):
        _nvrtc.compile_cubin("this is not C++", name="bad.cu", arch="90", cache=tmp_path)
    with pytest.raises(RuntimeError, match="without a directory"):
        _nvrtc.compile_cubin(SOURCE, name="a/k.cu", arch="90", cache=tmp_path)
    assert _nvrtc.nvrtc_version() >= (12, 0)


def test_every_collectives_kernel_compiles_through_the_cache(tmp_path: Path) -> None:
    src = _nvrtc.source_of("collectives/kernels/allreduce.cu")
    obj = _nvrtc.compile_cubin(src, name="allreduce.cu", arch="90", cache=tmp_path)
    assert bytes(obj.code)[:4] == b"\x7fELF"
