"""IPC hardening (issue 15, points 7 and 8), each written to fail first."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from shmem import ipc
from shmem.errors import DescriptorError, ShmemError
from shmem.ipc import registry, service

ROOT = Path(__file__).resolve().parents[2]


def test_an_importer_cannot_shrink_the_exporters_memory() -> None:
    """An importer's ftruncate used to kill the exporter with SIGBUS: the memfd is sealed."""
    with ipc.allocate(4096, "uint8") as buf:
        buf.array[:] = 7
        with ipc.import_(ipc.export(buf)) as other:
            fd = other._mapping.fd
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)
            assert int(buf.array.sum()) == 7 * 4096  # the exporter still reads its memory


def test_received_descriptors_are_not_inherited() -> None:
    with ipc.allocate(16, "uint8") as buf, ipc.import_(ipc.export(buf)) as other:
        assert not os.get_inheritable(other._mapping.fd)


def test_odd_socket_addresses_raise_shmem_errors() -> None:
    with ipc.allocate(16, "uint8") as buf:
        desc = ipc.export(buf)
        for address in ("/no/such/dir/" + "x" * 200, "", "\0abstract-nobody"):
            forged = ipc.IpcDescriptor(**{**desc.__dict__, "address": address})
            with pytest.raises(ShmemError):
                ipc.import_(forged)


def test_a_fifo_in_the_registry_neither_hangs_list_nor_lookup(tmp_path: Path) -> None:
    reg = registry._registry()
    fifo = reg / "planted.json"
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    done: list[object] = []
    try:

        def run() -> None:
            done.append(ipc.list_published())
            try:
                ipc.lookup("planted")
            except (ShmemError, KeyError) as exc:
                done.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "a FIFO in the registry hung list_published or lookup"
        assert isinstance(done[1], DescriptorError)
    finally:
        fifo.unlink()


def test_a_squatted_runtime_dir_falls_back_to_a_private_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    squat = tmp_path / f"shmem-ipc-{os.getuid()}"
    squat.mkdir()
    squat.chmod(0o777)  # as another user's squatted directory would be for us: unsafe
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SHMEM_IPC_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    service._private_dir = None
    with pytest.warns(RuntimeWarning, match="unsafe"):
        path = service.runtime_dir()
    assert path != squat and path.is_dir()
    assert (path.stat().st_mode & 0o777) == 0o700


def test_a_new_exporter_removes_stale_sockets() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(dead.stdout)
    stale = service.runtime_dir() / f"{pid}-deadbeef.sock"
    stale.write_bytes(b"")
    code = "from shmem import ipc\nbuf = ipc.allocate(8, 'uint8'); ipc.export(buf); buf.close()\n"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    assert not stale.exists()


def test_gpu_descriptors_travel_in_a_fixed_format_not_pickle() -> None:
    from shmem.ipc import _cuda_ipc

    tree = ast.parse(Path(_cuda_ipc.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "pickle" not in imported
    blob = _cuda_ipc.encode_descriptor(b"\x01\x02payload", 4096)
    assert _cuda_ipc.decode_descriptor(blob) == (b"\x01\x02payload", 4096)
    for bad in (b"", b"junk", blob[:-1], blob + b"x", b"SHGD\x09" + blob[5:]):
        with pytest.raises(DescriptorError):
            _cuda_ipc.decode_descriptor(bad)
    assert np.dtype(np.uint8)  # (numpy imported for the helpers above)
