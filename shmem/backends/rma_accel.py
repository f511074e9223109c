"""The blocking put and the signal to an off-node rank in C (:mod:`shmem._rmafast`).

``SHMEMBuffer.put`` to a rank reached through MPI RMA is ``MPI_Put`` + ``MPI_Win_flush``; a
signal is ``MPI_Win_sync`` + ``MPI_Rget_accumulate`` + ``MPI_Test``, returning once MPI has
started it (the process's next operation on the heap completes it: ``pending``; to a rank
whose memory MPI shares, ``MPI_Fetch_and_op`` + ``MPI_Win_flush``); a wait spins
on its word with ``MPI_Iprobe`` between loads (``spinner``). Through mpi4py a small
put or signal spends more time in Python (method calls, mpi4py's buffer and target parsing,
our argument checks) than in MPI; :mod:`shmem._rmafast` makes the same checks and calls in
C. It is an optional extension, built when the project is installed with a C compiler and
Python's headers; without it (or with an MPI this module cannot bind to) these take the
pure-Python path, which is the same operation, only slower.

Binding: the functions' addresses come from the libmpi that mpi4py loaded (looked up through
mpi4py's own extension module, else among the process's mapped libraries; checked to report
mpi4py's library version), the handles of the datatypes and operations from mpi4py
(``MPI._handleof``), and the handle width from mpi4py (``MPI._sizeof(MPI.Win)``: 4 bytes for
MPICH and its ABI, 8 for Open MPI and the MPI 5 standard ABI).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
from functools import cache
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["barrier", "pending", "putter", "requests", "signaller", "spinner", "status"]

_FUNCTIONS = (
    "MPI_Put",
    "MPI_Win_flush",
    "MPI_Win_sync",
    "MPI_Rget_accumulate",
    "MPI_Test",
    "MPI_Wait",
    "MPI_Iprobe",
    "MPI_Fetch_and_op",
    "MPI_Startall",
)

log = logging.getLogger(__name__)

_status = "not tried"


def status() -> str:
    """Why puts to off-node ranks do or do not take the C path (for logs and tests)."""
    _bound()
    return _status


def _libmpi_candidates() -> list[str]:
    """Paths of loaded libraries named libmpi* (Linux: /proc/self/maps)."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and os.path.basename("/" + path).startswith("libmpi"):
                    full = "/" + path
                    if full not in paths:
                        paths.append(full)
    except OSError:
        pass
    return paths


def _library_version(lib: ctypes.CDLL) -> str | None:
    fn = getattr(lib, "MPI_Get_library_version", None)
    if fn is None:
        return None
    size = max(MPI.MAX_LIBRARY_VERSION_STRING, 8192)
    text = ctypes.create_string_buffer(size)
    length = ctypes.c_int(0)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    if fn(text, ctypes.byref(length)) != 0:
        return None
    return text.raw[: length.value].decode(errors="replace")


@cache
def _bound() -> Any:
    """The bound :mod:`shmem._rmafast` module, or None (``status()`` says why). Any failure
    to bind leaves the pure-Python path, which does the same operations."""
    global _status
    try:
        _rmafast = importlib.import_module("shmem._rmafast")  # (no stub: it is C)
    except ImportError as exc:
        _status = f"pure Python: the C extension shmem._rmafast is not built ({exc})"
        return None
    try:
        return _bind(_rmafast)
    except Exception as exc:  # another mpi4py, ctypes, an odd library: degrade, say why
        _status = f"pure Python: binding shmem._rmafast failed ({type(exc).__name__}: {exc})"
        log.debug("rma_accel: %s", _status)
        return None


def _bind(mod: Any) -> Any:
    global _status
    handle_bytes = MPI._sizeof(MPI.Win)
    if handle_bytes not in (4, 8) or MPI._sizeof(MPI.Datatype) != handle_bytes:
        _status = f"pure Python: unexpected MPI handle width {handle_bytes}"
        return None
    wanted = MPI.Get_library_version()
    mode = getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY
    # mpi4py's own extension first: a lookup through it finds the symbols of the very libmpi
    # it was linked and loaded with (its dependency), whatever the file is called
    for path in [str(MPI.__file__), *_libmpi_candidates()]:
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError:
            continue
        if not all(hasattr(lib, name) for name in _FUNCTIONS):
            continue
        if _library_version(lib) != wanted:  # another MPI than mpi4py's
            continue
        fns = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _FUNCTIONS)
        mask = (1 << 64) - 1  # C takes the low handle_bytes of each handle
        handles = tuple(
            MPI._handleof(h) & mask for h in (MPI.BYTE, MPI.INT64_T, MPI.REPLACE, MPI.SUM)
        )
        anys = (MPI.ANY_SOURCE, MPI.ANY_TAG)
        mod.bind(fns, handle_bytes, handles, anys, np.ndarray, MPI.Exception)
        _status = f"C: puts and signals through {path} ({handle_bytes}-byte handles)"
        log.debug("rma_accel: %s", _status)
        return mod
    _status = "pure Python: mpi4py's libmpi was not found among the loaded libraries"
    return None


def putter(win: MPI.Win, nbytes: int, dtype: np.dtype[Any], nranks: int) -> Any:
    """A ``shmem._rmafast.Putter`` for a buffer of ``nbytes`` of ``dtype`` reached through
    ``win``, or None when the C path is not available."""
    mod = _bound()
    if mod is None:
        return None
    return mod.Putter(MPI._handleof(win), nbytes, dtype, nranks)


def signaller(
    win: MPI.Win,
    disps: list[int],
    slots: int,
    extra: MPI.Win | None = None,
    shm: frozenset[int] = frozenset(),
) -> Any:
    """A ``shmem._rmafast.Signaller`` for a signal pad of ``slots`` int64 words whose slot 0
    is at window displacement ``disps[rank]`` (-1: a rank not reached through ``win``),
    syncing ``extra`` too before each signal (``shm``: ranks whose memory MPI shares with
    this process, signalled without a request); or None when the C path is not available."""
    mod = _bound()
    if mod is None:
        return None
    handle = None if extra is None else MPI._handleof(extra)
    return mod.Signaller(MPI._handleof(win), disps, slots, handle, tuple(shm))


def barrier(rounds: list[tuple[int, int, int, int]], signaller: Any, comm: MPI.Comm | None) -> Any:
    """A ``shmem._rmafast.Barrier`` of ``rounds`` (peer word address or 0, destination rank,
    signaller slot, own word address), signalling off the node through ``signaller`` and
    driving MPI's progress on ``comm`` while it waits; or None without the C path."""
    mod = _bound()
    if mod is None:
        return None
    handle = 0 if comm is None else MPI._handleof(comm) & ((1 << 64) - 1)
    return mod.Barrier(rounds, signaller, handle)


def pending() -> Any:
    """``shmem._rmafast.pending`` (the signal still in flight, if any), or None when the C path
    is not available (no signal is ever left in flight then)."""
    mod = _bound()
    return None if mod is None else mod.pending


def requests(reqs: list[MPI.Prequest]) -> Any:
    """``shmem._rmafast.Requests`` of these persistent requests (``start``, ``Test`` and
    ``settle`` out of Python; the requests stay mpi4py's to free), or None when the C path
    is not bound."""
    mod = _bound()
    if mod is None:
        return None
    mask = (1 << 64) - 1
    return mod.Requests(tuple(MPI._handleof(r) & mask for r in reqs))


def spinner(comm: MPI.Comm) -> Any:
    """``spin(address, cmp, value, spins) -> int | None``: ``shmem._rmafast.spin`` with
    ``MPI_Iprobe`` on ``comm`` between loads, or None when the C path is not available."""
    mod = _bound()
    if mod is None:
        return None
    spin, handle = mod.spin, MPI._handleof(comm) & ((1 << 64) - 1)

    def spin_on(address: int, cmp: int, value: int, spins: int) -> int | None:
        return spin(address, cmp, value, spins, handle)  # type: ignore[no-any-return]

    return spin_on
