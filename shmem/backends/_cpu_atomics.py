"""Processor atomics on node-local shared memory, through libatomic (GCC's runtime).

MPI's ``Fetch_and_op`` on a shared-memory window goes through the library (MPICH: tens of
microseconds when the target rank's core is busy, and a GIL hand-off per call in a threaded
program). When every rank of a job is on one node, all of its atomics can be the processor's
own instead: ``__atomic_*`` (sequentially consistent, so each is also a full fence), called
through ``ctypes.PyDLL`` (a sub-microsecond call that keeps the GIL). They must not be mixed
with MPI accumulates on the same words, so the host heap uses them only when it has no RMA
window at all. None where libatomic cannot be loaded: the heap then keeps MPI's atomics.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
from typing import Any

import numpy as np

__all__ = ["CpuAtomics", "load"]

_SEQ_CST = 5
_OPS = {"add": "fetch_add", "and": "fetch_and", "or": "fetch_or", "xor": "fetch_xor"}


class CpuAtomics:
    """Fetch-and-op and compare-and-swap on 4- and 8-byte words at raw addresses."""

    def __init__(self, lib: Any) -> None:
        self._fn: dict[tuple[str, int], Any] = {}
        for width, c_t in ((4, ctypes.c_uint32), (8, ctypes.c_uint64)):
            for name in (*_OPS.values(), "exchange"):
                fn = getattr(lib, f"__atomic_{name}_{width}")
                fn.restype = c_t
                fn.argtypes = [ctypes.c_void_p, c_t, ctypes.c_int]
                self._fn[name, width] = fn
            load = getattr(lib, f"__atomic_load_{width}")
            load.restype = c_t
            load.argtypes = [ctypes.c_void_p, ctypes.c_int]
            self._fn["load", width] = load
            cas = getattr(lib, f"__atomic_compare_exchange_{width}")
            cas.restype = ctypes.c_bool
            cas.argtypes = [
                ctypes.c_void_p,
                ctypes.POINTER(c_t),
                c_t,
                ctypes.c_bool,
                ctypes.c_int,
                ctypes.c_int,
            ]
            self._fn["cas", width] = (cas, c_t)

    def fetch_op(self, address: int, value: float, dtype: np.dtype[Any], op: str) -> Any:
        """Apply ``op`` (``add``/``set``/``fetch``/``and``/``or``/``xor``) to the word of
        ``dtype`` at ``address``; return the old value as ``dtype``'s scalar."""
        width = dtype.itemsize
        if op == "fetch":
            bits = self._fn["load", width](address, _SEQ_CST)
        elif op == "set":
            bits = self._fn["exchange", width](address, _to_bits(value, dtype), _SEQ_CST)
        else:
            bits = self._fn[_OPS[op], width](address, _to_bits(value, dtype), _SEQ_CST)
        return _from_bits(bits, dtype)

    def compare_swap(self, address: int, compare: int, value: int, dtype: np.dtype[Any]) -> Any:
        """Store ``value`` if the word equals ``compare``; return the old value."""
        cas, c_t = self._fn["cas", dtype.itemsize]
        expected = c_t(_to_bits(compare, dtype))
        cas(address, ctypes.byref(expected), _to_bits(value, dtype), False, _SEQ_CST, _SEQ_CST)
        return _from_bits(expected.value, dtype)  # the old value whether or not it swapped


def _to_bits(value: float, dtype: np.dtype[Any]) -> int:
    if dtype.kind == "f":
        fmt, ifmt = ("<f", "<I") if dtype.itemsize == 4 else ("<d", "<Q")
        return int(struct.unpack(ifmt, struct.pack(fmt, value))[0])
    return int(value) & ((1 << (8 * dtype.itemsize)) - 1)  # two's complement, as C wraps


def _from_bits(bits: int, dtype: np.dtype[Any]) -> Any:
    if dtype.kind == "f":
        fmt, ifmt = ("<f", "<I") if dtype.itemsize == 4 else ("<d", "<Q")
        return dtype.type(struct.unpack(fmt, struct.pack(ifmt, bits))[0])
    if dtype.kind == "i" and bits >> (8 * dtype.itemsize - 1):
        bits -= 1 << (8 * dtype.itemsize)
    return dtype.type(bits)


@functools.cache
def load() -> CpuAtomics | None:
    """The processor's atomics, or None where libatomic is missing (or lacks a symbol).
    Loaded once per process (``find_library`` runs ``ldconfig``: only if the usual name
    does not load)."""
    for name in ("libatomic.so.1", None):
        try:
            return CpuAtomics(ctypes.PyDLL(name or ctypes.util.find_library("atomic") or ""))
        except (OSError, AttributeError):
            continue
    return None
