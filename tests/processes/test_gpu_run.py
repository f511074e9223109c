"""The GPU run (``scripts/gpu_run.py``, ``./dev gpu``) where it meets processes: a step past
its limit is killed with everything it started, and the setup (``scripts/gpu_setup.py``, what
``./dev gpu`` does first on a lent machine) over a stand-in of the GPU image, checked from
inside the run's virtualenv. The wheel list is what ./dev gpu-wheels downloads.

The stand-in: a Python environment whose site-packages holds NVIDIA's library layout
(``nvidia/nvshmem/lib/libnvshmem_host.so.3``, ``nvidia/cu13/lib/libnvrtc.so.13``: stub shared
objects), cuda.pathfinder, and a package ``standin_marker`` 1.0 that the carried wheels hold
too, in the same version. The image's Python has pip, and the setup may not rely on
ensurepip. What a lent machine would show if the setup were wrong: nvshmem4py's
``get_version()`` raising ``DynamicLibNotFoundError: libnvshmem_host.so.3`` (cuda.pathfinder
looks under ``site.getsitepackages()``, which in a venv is the venv alone), the image's copy
of a package winning over the carried one, a venv that needs ensurepip. Skipped without a C
compiler or cuda.pathfinder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.scripts import load_script

pytestmark = pytest.mark.processes
execute = load_script("gpu_run").execute

ROOT = Path(__file__).resolve().parents[2]
LIBS = {
    "nvshmem_host": "nvidia/nvshmem/lib/libnvshmem_host.so.3",
    "nvrtc": "nvidia/cu13/lib/libnvrtc.so.13",
}


def _site(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _stub_library(cc: str, path: Path, tmp: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = tmp / "stub.c"
    src.write_text("int standin_stub(void) { return 7; }\n")
    cmd = [cc, "-shared", "-fPIC", f"-Wl,-soname,{path.name}", "-o", str(path), str(src)]
    subprocess.run(cmd, check=True, timeout=60)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(directory: Path, who: str) -> Path:
    """``standin_marker`` 1.0 as a wheel: the module says ``who``, and it installs a script
    ``mpiexec`` (as the mpich wheel does) so the setup finds one beside the interpreter."""
    files = {
        "standin_marker/__init__.py": f"WHO = {who!r}\n".encode(),
        "standin_marker-1.0.data/scripts/mpiexec": b"#!/bin/sh\necho standin mpiexec\n",
        "standin_marker-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: standin_marker\nVersion: 1.0\n"
        ),
        "standin_marker-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    path = directory / "standin_marker-1.0-py3-none-any.whl"
    record = [_record_line(n, d) for n, d in files.items()]
    record.append("standin_marker-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("standin_marker-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in image: its Python (a venv with pip) and what its site-packages holds."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stub NVIDIA libraries")
    pathfinder = pytest.importorskip("cuda.pathfinder")
    tmp = tmp_path_factory.mktemp("image")
    prefix = tmp / "image"
    subprocess.run([sys.executable, "-m", "venv", str(prefix)], check=True, timeout=180)
    python = prefix / "bin" / "python"
    site = _site(python)
    for rel in LIBS.values():
        _stub_library(cc, site / rel, tmp)
    shutil.copytree(Path(pathfinder.__file__).parent, site / "cuda" / "pathfinder")
    # the same package and version as a carried wheel, installed in the image
    image_wheels = tmp / "image-wheels"
    image_wheels.mkdir()
    install = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run([*install, str(_wheel(image_wheels, "image"))], check=True, timeout=180)
    return python


def _setup(image_python: Path, venv: Path, wheels: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_", "VIRTUAL_ENV"))}
    env.update(GPU_VENV=str(venv), GPU_WHEELS=str(wheels), PYTHONNOUSERSITE="1")
    return subprocess.run(
        [str(image_python), str(ROOT / "scripts" / "gpu_setup.py")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def _in_venv(venv: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120,
        env={**env, "PYTHONNOUSERSITE": "1"}, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def test_the_runs_venv_finds_the_images_nvidia_libraries_and_the_carried_wheels(
    image: Path, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "carried")
    venv = tmp_path / "run-venv"
    done = _setup(image, venv, wheels)
    assert done.returncode == 0, done.stdout + done.stderr
    image_site = _site(image)
    # cuda.pathfinder, run inside the run's venv, finds both libraries in the image
    found = json.loads(
        _in_venv(
            venv,
            "import json; from cuda.pathfinder import load_nvidia_dynamic_lib as load; "
            f"print(json.dumps({{n: load(n).abs_path for n in {list(LIBS)!r}}}))",
        )
    )
    for name, rel in LIBS.items():
        assert Path(found[name]).resolve() == (image_site / rel).resolve(), (name, found)
    # the carried wheel wins over the image's copy of the same version (--ignore-installed)
    assert _in_venv(venv, "import standin_marker; print(standin_marker.WHO)") == "carried"
    assert (venv / "bin" / "mpiexec").exists()
    # the venv was made without pip (no ensurepip needed): the image's pip serves it
    assert not list(_site(venv / "bin" / "python").glob("pip")), "the run's venv has its own pip"
    pip_home = _in_venv(venv, "import pip, pathlib; print(pathlib.Path(pip.__file__).parent)")
    assert Path(pip_home).parent.resolve() == image_site.resolve()
    # a second setup (a warm machine) reuses the venv and the installed wheels
    again = _setup(image, venv, wheels)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _in_venv(venv, "import standin_marker; print(standin_marker.WHO)") == "carried"


def test_without_wheels_the_setup_says_what_to_run(image: Path, tmp_path: Path) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    done = _setup(image, tmp_path / "venv", empty)
    assert done.returncode == 1
    assert "run ./dev gpu-wheels here first and carry .whl" in done.stdout


def test_a_step_past_its_limit_is_killed_with_its_whole_session(tmp_path: Path) -> None:
    """The step, and a grandchild that ignores SIGTERM, are gone at the limit plus the grace
    (a step's limit is the run's guarantee that it ends within its budget)."""
    pidfile = tmp_path / "grandchild.pid"
    script = f"trap '' TERM; (trap '' TERM; sleep 300) & echo $! > {pidfile}; sleep 300"
    t0 = time.monotonic()
    rc, timed_out = execute(["bash", "-c", script], {}, tmp_path / "step.log", 1.0, grace_s=1.0)
    spent = time.monotonic() - t0
    assert (rc, timed_out) == (124, True)
    assert spent < 10, spent
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_the_wheel_list_is_what_gpu_wheels_downloads() -> None:
    listed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_setup.py"), "wheels"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert listed.stdout.split() == list(load_script("gpu_setup").WHEELS)
    assert "gpu_setup.py wheels" in (ROOT / "scripts" / "gpu-wheels.sh").read_text()
