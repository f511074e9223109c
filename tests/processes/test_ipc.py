"""IPC descriptors and the fd service: round trips, outsiders, concurrency, lifetime,
hardening (every bad descriptor, a 10,000-input fuzz) and the registry."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmem import ipc
from shmem.errors import DescriptorError
from shmem.ipc.descriptor import MAX_DESCRIPTOR_BYTES, IpcDescriptor

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]

OUTSIDER = """
import sys, numpy as np
from shmem import ipc
b = ipc.import_(sys.argv[1])
print("sum", float(b.array.astype(np.float64).sum()), flush=True)
b.array[...] = b.array * 2        # write back for the exporter to see
b.close()
"""


def run_outsider(desc: str, code: str = OUTSIDER, **kw: Any) -> subprocess.CompletedProcess[str]:
    out: subprocess.CompletedProcess[str] = subprocess.run(
        [sys.executable, "-c", code, desc],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
        **kw,
    )
    return out


def test_round_trips_bytes_and_string() -> None:
    with ipc.allocate((3, 4), "bfloat16") as buf:
        d = ipc.export(buf)
        assert IpcDescriptor.parse(d.to_bytes()) == d
        assert IpcDescriptor.parse(d.to_string()) == d
        assert IpcDescriptor.parse(str(d)) == d
        assert len(d.to_bytes()) < 400 and d.kind == "host" and d.shape == (3, 4)
        assert (d.pid, d.uid, d.dtype, d.nbytes) == (os.getpid(), os.getuid(), "bfloat16", 24)


def test_outsider_process_sees_writes_both_ways() -> None:
    with ipc.allocate(1000, "float32") as buf:
        buf.array[...] = np.arange(1000)
        proc = run_outsider(str(ipc.export(buf)))
        assert proc.returncode == 0, proc.stderr
        assert f"sum {float(np.arange(1000).sum())}" in proc.stdout
        np.testing.assert_array_equal(buf.array, np.arange(1000) * 2)


def test_sixteen_concurrent_importers() -> None:
    with ipc.allocate(4096, "int64") as buf:
        desc = ipc.export(buf)
        errors: list[BaseException] = []

        def importer(i: int) -> None:
            try:
                with ipc.import_(desc.to_string()) as b:
                    b.array[i] = i + 1  # each writes its own slot through its own mapping
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=importer, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        np.testing.assert_array_equal(buf.array[:16], np.arange(1, 17))


def test_lifetime_after_exporter_close() -> None:
    buf = ipc.allocate(64, "uint8")
    buf.array[...] = 9
    desc = ipc.export(buf)
    imported = ipc.import_(desc)
    buf.close()  # the exporter drops its handle
    assert (imported.array == 9).all(), "the memory stays while an importer holds it"
    imported.array[0] = 1
    with pytest.raises(DescriptorError, match="unknown buffer"):
        ipc.import_(desc)  # no new imports of a closed buffer
    imported.close()
    imported.close()


def test_lifetime_after_exporter_exit(tmp_path: Path) -> None:
    exporter = """
import sys, time
from shmem import ipc
b = ipc.allocate(256, "int32"); b.array[...] = 42
print(ipc.export(b), flush=True)
sys.stdin.readline()   # wait until told to exit
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", exporter],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdin is not None
    desc = proc.stdout.readline().strip()
    imported = ipc.import_(desc)
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)
    assert (imported.array == 42).all(), "host mappings outlive the exporter (memfd)"
    with pytest.raises(ipc.ExporterGoneError, match="is gone"):
        ipc.import_(desc)
    imported.close()


def _descriptor() -> tuple[ipc.IpcBuffer, IpcDescriptor]:
    buf = ipc.allocate(16, "float32")
    return buf, ipc.export(buf)


def test_every_bad_descriptor() -> None:
    buf, d = _descriptor()
    raw = d.to_bytes()
    with pytest.raises(DescriptorError, match="truncated"):
        IpcDescriptor.parse(raw[:-7])
    with pytest.raises(DescriptorError, match="truncated"):
        IpcDescriptor.parse(raw[:5])
    flipped = bytearray(raw)
    flipped[20] ^= 0x40
    with pytest.raises(DescriptorError, match=r"checksum|corrupted"):
        IpcDescriptor.parse(bytes(flipped))
    wrong_version = bytearray(raw)
    wrong_version[4] = 99
    with pytest.raises(DescriptorError, match="unsupported version"):
        IpcDescriptor.parse(bytes(wrong_version))
    with pytest.raises(DescriptorError, match="oversized"):
        IpcDescriptor.parse(raw + b"x" * MAX_DESCRIPTOR_BYTES)
    with pytest.raises(DescriptorError, match="not a descriptor string"):
        IpcDescriptor.parse("nope:" + d.to_string())
    with pytest.raises(DescriptorError, match="not base64"):
        IpcDescriptor.parse("shmipc1:@@@")
    with pytest.raises(DescriptorError, match="token rejected"):
        ipc.import_(dataclasses.replace(d, token="0" * 32))
    with pytest.raises(DescriptorError, match=r"lives on host"):
        ipc.import_(dataclasses.replace(d, host="elsewhere"))
    with pytest.raises(ipc.IpcPermissionError, match="uid"):
        ipc.import_(dataclasses.replace(d, uid=d.uid + 1))
    with pytest.raises(DescriptorError, match="expected the exporter"):
        ipc.import_(dataclasses.replace(d, pid=d.pid + 1 if d.pid < 4_000_000 else 2))
    with pytest.raises(DescriptorError, match="shape and dtype do not match"):
        IpcDescriptor.parse(dataclasses.replace(d, nbytes=d.nbytes + 4).to_bytes())
    with pytest.raises(DescriptorError, match="invalid token"):
        IpcDescriptor.parse(dataclasses.replace(d, token="short").to_bytes())
    buf.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a process as another user")
def test_another_user_is_refused() -> None:
    buf, d = _descriptor()
    code = """
import sys
from shmem import ipc
try:
    ipc.import_(sys.argv[1])
except PermissionError as exc:
    print("refused:", type(exc).__name__, exc)
"""
    try:
        proc = run_outsider(str(d), code, user=65534, env={**os.environ, "HOME": "/tmp"})
    except PermissionError:
        buf.close()
        pytest.skip("uid 65534 cannot run this interpreter (it lives under a private home)")
    assert "refused: IpcPermissionError" in proc.stdout, proc.stdout + proc.stderr
    buf.close()


def test_server_refuses_a_foreign_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's own check: a client whose SO_PEERCRED uid is not ours gets nothing."""
    from shmem.ipc import service

    real = service.peer_credentials

    def foreign_on_server(sock: object) -> tuple[int, int, int]:
        pid, uid, gid = real(sock)  # type: ignore[arg-type]
        if threading.current_thread().name.startswith("shmem-ipc"):
            return pid, uid + 12345, gid
        return pid, uid, gid

    buf, d = _descriptor()
    server = service.Server.get()
    refused = server.refused
    monkeypatch.setattr(service, "peer_credentials", foreign_on_server)
    with pytest.raises(ipc.IpcPermissionError, match="another user"):
        ipc.import_(d)
    assert server.refused >= refused + 1  # counted by the server thread (others may land too)
    buf.close()


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.one_of(
        st.binary(max_size=3000),
        st.text(max_size=300),
        st.binary(max_size=200).map(lambda b: b"SHMI\x01" + b),
        st.text(max_size=200).map(lambda t: "shmipc1:" + t),
    )
)
def test_fuzz_parser_raises_only_descriptor_error(data: bytes | str) -> None:
    with contextlib.suppress(DescriptorError):
        IpcDescriptor.parse(data)


def test_registry_publish_lookup_and_list() -> None:
    name = f"test-registry-{os.getpid()}"
    with ipc.allocate((2, 8), "int16") as buf:
        buf.array[...] = 5
        ipc.publish(name, buf)
        desc = ipc.lookup(name)
        with ipc.import_(desc) as b:
            assert (b.array == 5).all()
        with pytest.raises(TypeError, match=r"not an array .*shmem\.ipc\.import_\(desc\)"):
            np.asarray(desc)  # a descriptor names memory: no silent 0-d object array
        entries = {p.name: p for p in ipc.list_published()}
        assert entries[name].nbytes == 32 and entries[name].pid == os.getpid()
        assert entries[name].alive and entries[name].dtype == "int16"
        out = subprocess.run(
            [sys.executable, "-m", "shmem.ipc", "list"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        assert name in out and "alive" in out and "owner pid" in out
    with pytest.raises(KeyError, match="nothing is published"):
        ipc.lookup(name)  # closing the buffer unpublished it
    with pytest.raises(ValueError, match="invalid name"):
        ipc.publish("../escape", ipc.allocate(1))


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="expected an IpcBuffer"):
        ipc.export(np.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid shape"):
        ipc.allocate((2, -1))
    with pytest.raises(TypeError, match="unsupported dtype"):
        ipc.allocate(4, "clongdouble")


def test_import_shmem_does_not_start_mpi() -> None:
    """An IPC outsider (a plain process, maybe spawned by a rank) must not start MPI."""
    code = "import sys, shmem, shmem.ipc; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert out == "False"


def test_deeply_nested_body_is_a_descriptor_error() -> None:
    import struct
    import zlib

    body = b"[" * 1000
    raw = struct.pack(">4sBH", b"SHMI", 1, len(body)) + body
    raw += struct.pack(">I", zlib.crc32(raw))
    with pytest.raises(DescriptorError, match="not JSON"):
        IpcDescriptor.parse(raw)


def test_import_after_close_never_gets_another_buffer() -> None:
    a = ipc.allocate(4, "int32")
    a.array[...] = 1
    desc = ipc.export(a)
    early = ipc.import_(desc)
    a.close()
    b = ipc.allocate(4, "int32")  # may reuse a's fd number in this process
    b.array[...] = 42
    with pytest.raises(DescriptorError, match="unknown buffer"):
        ipc.import_(desc)
    assert (early.array == 1).all()
    early.close()
    b.close()
