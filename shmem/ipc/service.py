"""The IPC service: a background thread in the exporting process that hands out file
descriptors over a Unix socket (``SCM_RIGHTS``), after checking who asks.

The socket lives in a per-user directory (mode 0700, owned by the user, checked every time);
the server reads the client's credentials (``SO_PEERCRED``) and serves only its own uid, and
only a client that presents the buffer's 128-bit token (compared in constant time). The client,
in turn, checks that the socket's owner is the exporting process named in the descriptor.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import json
import os
import secrets
import socket
import stat
import struct
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..config import env_value
from ..errors import DescriptorError, ExporterGoneError, IpcPermissionError

__all__ = ["ExporterGoneError", "IpcPermissionError", "Server", "request", "runtime_dir"]

_CREDS = struct.Struct("3i")  # pid, uid, gid
_MAX_REQUEST = 512
_TIMEOUT_S = 5.0


_private_dir: Path | None = None  # the fallback when the shared directory is unsafe


def _unsafe(path: Path) -> str:
    """Why ``path`` is not a safe per-user directory ("" when it is)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return (
            f"{path} is unsafe (got mode {oct(st.st_mode & 0o777)}, owner {st.st_uid}; expected "
            f"a directory of uid {os.getuid()} with mode 0700)"
        )
    return ""


def runtime_dir() -> Path:
    """The per-user directory for sockets and the registry (created 0700, then verified).

    ``$SHMEM_IPC_DIR`` when set (it must be safe), else ``$XDG_RUNTIME_DIR/shmem-ipc-<uid>``,
    else ``<tmp>/shmem-ipc-<uid>``. When that shared directory is unsafe (another user made
    it first, or its mode lets others in) this process uses a private directory instead and
    warns: its sockets still work (descriptors carry their address), but names it publishes
    are visible only to processes that share that directory.
    """
    global _private_dir
    env = env_value("SHMEM_IPC_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    path = base if env else base / f"shmem-ipc-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=False)
    why = _unsafe(path)
    if not why:
        return path
    if env:
        raise IpcPermissionError(f"runtime_dir: {why}")
    if _private_dir is None or not _private_dir.is_dir():
        _private_dir = Path(tempfile.mkdtemp(prefix=f"shmem-ipc-{os.getuid()}-"))
        warnings.warn(
            f"shmem.ipc: {why}; using the private directory {_private_dir} instead (names "
            "published here are not visible to other processes; set SHMEM_IPC_DIR to share one)",
            RuntimeWarning,
            stacklevel=2,
        )
    return _private_dir


def _remove_stale_sockets(directory: Path) -> None:
    """Unlink the sockets of exporters that no longer run (killed before they cleaned up)."""
    for path in directory.glob("*.sock"):
        head = path.name.split("-", 1)[0]
        if not head.isdigit():
            continue
        try:
            os.kill(int(head), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.unlink()
        except PermissionError:
            continue


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    pid, uid, gid = _CREDS.unpack(raw)
    return pid, uid, gid


@dataclass
class _Entry:
    token: str
    fd: int  # the server's own duplicate: valid until unregister, whatever the owner does
    extra: bytes


class Server:
    """One per process, started on the first export."""

    _instance: Server | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.dir = runtime_dir()
        _remove_stale_sockets(self.dir)
        self.address = str(self.dir / f"{os.getpid()}-{secrets.token_hex(4)}.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        os.chmod(self.address, 0o600)
        self._sock.listen(64)
        self._entries: dict[str, _Entry] = {}
        self._entries_lock = threading.Lock()
        self._stopped = False
        self.served = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._serve, name="shmem-ipc", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    @classmethod
    def get(cls) -> Server:
        with cls._lock:
            inst = cls._instance
            # a forked child inherits the object but not the thread: it needs its own server
            if inst is None or inst._stopped or inst.pid != os.getpid():
                inst = cls._instance = cls()
            return inst

    def register(self, fd: int, extra: bytes = b"") -> tuple[str, str]:
        """Serve (a duplicate of) ``fd`` to holders of the returned ``(buffer_id, token)``."""
        buffer_id, token = secrets.token_hex(8), secrets.token_hex(16)
        own = os.dup(fd)
        with self._entries_lock:
            self._entries[buffer_id] = _Entry(token, own, extra)
        return buffer_id, token

    def unregister(self, buffer_id: str) -> None:
        with self._entries_lock:
            entry = self._entries.pop(buffer_id, None)
            if entry is not None:
                os.close(entry.fd)

    def _serve(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            # one short-lived thread per client: a slow one cannot stall the others
            threading.Thread(
                target=self._handle, args=(conn,), name="shmem-ipc-client", daemon=True
            ).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._answer(conn)
            except (OSError, ValueError):
                self.refused += 1  # a client that misbehaves gets nothing

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_TIMEOUT_S)
        _, uid, _ = peer_credentials(conn)
        if uid != os.getuid():
            self.refused += 1
            conn.sendall(b"ERR permission: another user")
            return
        data = b""
        while not data.endswith(b"\n") and len(data) <= _MAX_REQUEST:
            chunk = conn.recv(_MAX_REQUEST)
            if not chunk:
                break
            data += chunk
        req = json.loads(data[:_MAX_REQUEST].decode("utf-8"))
        if not isinstance(req, dict):
            raise ValueError("request is not an object")
        buffer_id, token = str(req.get("buffer_id", "")), str(req.get("token", ""))
        with self._entries_lock:  # a duplicate for this answer: unregister cannot recycle it
            entry = self._entries.get(buffer_id)
            ok = entry is not None and hmac.compare_digest(entry.token.encode(), token.encode())
            fd = os.dup(entry.fd) if (ok and entry is not None) else -1
        if entry is None:
            self.refused += 1
            conn.sendall(b"ERR unknown buffer (closed by its exporter)")
            return
        if not ok:
            self.refused += 1
            conn.sendall(b"ERR token rejected")
            return
        try:
            socket.send_fds(conn, [b"OK" + entry.extra], [fd])
        finally:
            os.close(fd)
        self.served += 1

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.address)


def request(address: str, buffer_id: str, token: str, exporter_pid: int) -> tuple[int, bytes]:
    """Ask the exporter at ``address`` for a buffer: ``(fd, extra bytes)``.

    Raises
    ------
    ExporterGoneError
        Nothing listens there any more.
    DescriptorError
        The socket is not the exporter's, or the exporter refused the token or buffer.
    IpcPermissionError
        The exporter refused our credentials.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_TIMEOUT_S)
    with sock:
        try:
            sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            raise ExporterGoneError(
                f"import_: the exporter (pid {exporter_pid}) is gone: nothing listens at {address}",
                failed_pid=exporter_pid,
            ) from None
        except PermissionError:
            raise IpcPermissionError(f"import_: not allowed to connect to {address}") from None
        except (OSError, ValueError, TypeError) as exc:  # a path too long, empty, malformed
            raise DescriptorError(
                f"import_: cannot reach the exporter's socket {address!r} ({exc})"
            ) from None
        pid, uid, _ = peer_credentials(sock)
        if uid != os.getuid() or pid != exporter_pid:
            raise DescriptorError(
                f"import_: the socket is served by pid {pid} uid {uid} (expected the exporter, "
                f"pid {exporter_pid} uid {os.getuid()})"
            )
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # a server that refuses us at once may close before reading: its answer still waits
            sock.sendall(json.dumps({"buffer_id": buffer_id, "token": token}).encode() + b"\n")
        try:
            # close-on-exec: a child process (os.system) must not hold the memory
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1, socket.MSG_CMSG_CLOEXEC)
            for fd in fds:  # and once more, whatever the platform did with the flag
                os.set_inheritable(fd, False)
        except ConnectionResetError:
            msg, fds = b"", []
        except TimeoutError:
            raise ExporterGoneError(
                f"import_: the exporter (pid {exporter_pid}) did not answer within "
                f"{_TIMEOUT_S:g} s",
                failed_pid=exporter_pid,
            ) from None
    if not msg.startswith(b"OK"):
        for fd in fds:
            os.close(fd)
        text = msg.decode("utf-8", "replace")
        if not msg:  # the connection closed unanswered: the exporter exited mid-request
            raise ExporterGoneError(
                f"import_: the exporter (pid {exporter_pid}) closed the connection without "
                "answering (it exited or closed the buffer)",
                failed_pid=exporter_pid,
            )
        if "permission" in text:
            raise IpcPermissionError(f"import_: the exporter refused: {text}")
        raise DescriptorError(f"import_: the exporter refused: {text or 'no answer'}")
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise DescriptorError(f"import_: expected one file descriptor (got {len(fds)})")
    return fds[0], msg[2:]
