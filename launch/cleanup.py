"""Shared-memory segments an abnormal job end leaves in ``/dev/shm``, and their removal.

MPI libraries back their node-local shared memory with files in ``/dev/shm`` and unlink
them at ``MPI_Finalize``; a rank that dies (a signal, ``MPI_Abort``) never gets there, so each
failed job used to leave a few MiB behind until the tmpfs filled. After an abnormal end the
launcher removes the segments of this user that no live process maps any more: those its
ranks made during the job, and older ones of earlier failed jobs (after a grace period, so a
job just starting elsewhere is never touched).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["SHM_DIR", "remove_stale_segments", "stale_segments"]

SHM_DIR = Path("/dev/shm")
# MPICH (ch4 shm), Open MPI (vader / sm), UCX: the names their shared segments take
_PREFIXES = ("mpich_shm_", "mpi_shm", "vader_segment", "sm_segment", "ucx_shm")
_GRACE_S = 60.0


def _mapped() -> set[str]:
    """Every ``/dev/shm`` path some process of this machine maps or holds open now."""
    paths: set[str] = set()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (pid_dir / "maps").read_text(errors="replace").splitlines():
                at = line.find(str(SHM_DIR) + "/")
                if at >= 0:
                    paths.add(line[at:].removesuffix(" (deleted)").strip())
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith(str(SHM_DIR) + "/"):
                        paths.add(target)
    return paths


def stale_segments(since: float, directory: Path = SHM_DIR) -> list[Path]:
    """This user's MPI segments in ``directory`` that nobody maps: made at or after
    ``since`` (a ``time.time()``), or older than the grace period."""
    now = time.time()
    candidates = [
        path
        for path, mtime in _own_segments(directory)
        if mtime >= since - 1.0 or now - mtime > _GRACE_S
    ]
    if not candidates:
        return []
    mapped = _mapped()
    return [p for p in candidates if str(p) not in mapped]


def remove_stale_segments(
    since: float,
    directory: Path = SHM_DIR,
    settle_s: float = 0.0,
    exiting: Callable[[], bool] | None = None,
) -> tuple[int, int]:
    """Remove :func:`stale_segments`: ``(files removed, bytes freed)``. While ``exiting()``
    says the job's processes are still going (ranks that outlive mpiexec for a moment still
    map their segments), segments made at or after ``since`` are looked at again, for at
    most ``settle_s``; whatever is still mapped after that is left (it is someone's)."""
    count = freed = 0
    deadline = time.monotonic() + settle_s
    while True:
        gone = exiting is None or not exiting()  # before the scan: then it is the last
        for path in stale_segments(since, directory):
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                count += 1
                freed += size
        if gone or time.monotonic() >= deadline or not _recent(since, directory):
            return count, freed
        time.sleep(0.05)


def _own_segments(directory: Path) -> list[tuple[Path, float]]:
    """This user's MPI segment files in ``directory`` (regular files), with their mtimes."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    uid = os.getuid()
    found = []
    for path in entries:
        if not path.name.startswith(_PREFIXES):
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_uid == uid and stat.S_ISREG(st.st_mode):
            found.append((path, st.st_mtime))
    return found


def _recent(since: float, directory: Path) -> bool:
    """Whether this user's MPI segments made at or after ``since`` remain (mapped ones)."""
    return any(mtime >= since - 1.0 for _, mtime in _own_segments(directory))
