"""Names for exported buffers: :func:`publish` one under a name in the user's runtime
directory, :func:`lookup` it from another process, :func:`list_published` what is there."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ArgumentError, DescriptorError
from .descriptor import IpcDescriptor
from .service import ExporterGoneError, runtime_dir

if TYPE_CHECKING:
    pass
from .buffers import IpcBuffer, export

__all__ = ["Published", "list_published", "lookup", "publish"]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _read_entry(path: Path) -> str:
    """A registry file's text, opened without blocking and only if it is a regular file (a
    FIFO or device planted in the registry must not hang or trick the reader)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DescriptorError(f"registry: {path.name} is not a regular file")
        return os.read(fd, 1 << 16).decode("utf-8")
    finally:
        os.close(fd)


def _registry() -> Path:
    path = runtime_dir() / "registry"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    return path


def publish(name: str, buf: IpcBuffer) -> IpcDescriptor:
    """Export ``buf`` under ``name`` on this node (replacing an entry whose owner is gone).

    Parameters
    ----------
    name : str
        1 to 64 of ``A-Z a-z 0-9 . _ -``.
    buf : IpcBuffer
        The buffer to export.

    Returns
    -------
    IpcDescriptor
        The descriptor, as :func:`export` returns it (:func:`lookup` finds it by name).

    Raises
    ------
    ArgumentError
        An invalid name, or one a live process has published already.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ArgumentError(
            f"publish: invalid name (got {name!r}; expected 1-64 of A-Z a-z 0-9 . _ -)"
        )
    path = _registry() / f"{name}.json"
    if path.exists():
        try:
            old = json.loads(_read_entry(path))
            owner = int(old["pid"])
        except (OSError, ValueError, KeyError, TypeError, DescriptorError):
            owner = 0
        if owner and owner != os.getpid() and _alive(owner):
            raise ArgumentError(f"publish: {name!r} is already published by pid {owner}")
    desc = export(buf)
    entry = {
        "name": name,
        "descriptor": desc.to_string(),
        "nbytes": desc.nbytes,
        "dtype": desc.dtype,
        "shape": list(desc.shape),
        "pid": desc.pid,
        "created": time.time(),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(entry, fh)
    os.replace(tmp, path)
    buf._published.append(path)
    return desc


def lookup(name: str) -> IpcDescriptor:
    """The descriptor published under ``name`` on this node.

    Parameters
    ----------
    name : str
        The name :func:`publish` used.

    Returns
    -------
    IpcDescriptor
        The descriptor, for :func:`import_`.

    Raises
    ------
    KeyError
        Nothing is published under ``name``.
    ExporterGoneError
        Its exporter has exited.
    ArgumentError
        ``name`` is not a valid name.
    DescriptorError
        The registry entry is corrupted.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ArgumentError(f"lookup: invalid name (got {name!r})")
    path = _registry() / f"{name}.json"
    try:
        entry = json.loads(_read_entry(path))
    except FileNotFoundError:
        raise KeyError(f"lookup: nothing is published as {name!r}") from None
    except (OSError, ValueError, RecursionError, DescriptorError):
        raise DescriptorError(f"lookup: the registry entry for {name!r} is corrupted") from None
    if not isinstance(entry, dict):
        raise DescriptorError(f"lookup: the registry entry for {name!r} is corrupted")
    desc = IpcDescriptor.parse(str(entry.get("descriptor", "")))
    if not _alive(desc.pid):
        raise ExporterGoneError(f"lookup: {name!r} was published by pid {desc.pid}, now gone")
    return desc


@dataclass(frozen=True)
class Published:
    """One entry of the node's registry, as :func:`list_published` reads it.

    Parameters
    ----------
    name : str
        The name the buffer was published under.
    nbytes : int
        The buffer's size in bytes.
    dtype : str
        The buffer's dtype name.
    shape : tuple of int
        The buffer's shape.
    pid : int
        The publishing (exporting) process.
    age_s : float
        Seconds since the entry was written.
    alive : bool
        Whether process ``pid`` still exists (False: a stale entry :func:`publish` may
        replace).
    """

    name: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    pid: int
    age_s: float
    alive: bool


def list_published() -> list[Published]:
    """Everything published on this node, oldest first (entries of exited owners included,
    marked ``alive=False``).

    Returns
    -------
    list of Published
        ``Published(name, nbytes, dtype, shape, pid, age_s, alive)`` records, oldest first.
    """
    out = []
    for path in sorted(_registry().glob("*.json")):
        try:
            e = json.loads(_read_entry(path))
            out.append(
                Published(
                    str(e["name"]),
                    int(e["nbytes"]),
                    str(e["dtype"]),
                    tuple(int(x) for x in e["shape"]),
                    int(e["pid"]),
                    time.time() - float(e["created"]),
                    _alive(int(e["pid"])),
                )
            )
        except (OSError, ValueError, KeyError, TypeError, DescriptorError):
            continue
    return sorted(out, key=lambda p: -p.age_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
