"""This process's private memory, as leak checks measure it (``scripts/soak.py``,
``tests/mpi/test_host_windows.py``): ``RssAnon`` after malloc gave freed memory back, less
the resident pages of the symmetric heap where the heap is private memory (its pages are the
heap filling, not a leak)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
from pathlib import Path
from typing import Any


def steady_malloc() -> None:
    """Make glibc's malloc give large blocks back: a fixed mmap threshold (its default
    rises to 32 MiB once a large block is freed, after which the soak's random large
    temporaries stay in the process as freed heap) and a trim before each measure."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 256 << 10)  # M_MMAP_THRESHOLD: fixed, so no longer adaptive
    except (OSError, AttributeError):
        pass


def heap_private_kib(heap: Any) -> int:
    """The resident KiB of this rank's heap slab where that slab is private anonymous memory
    (Open MPI's shared window of a one-rank node communicator, ``node_split = rank``, is a
    private allocation: its pages count in ``RssAnon`` as they are first touched, which is
    the heap filling, not a leak); 0 where the slab is shared memory (counted apart)."""
    slab = heap.local_view(0, heap.nbytes)
    start = int(slab.ctypes.data)
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            span, perms, *rest = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= start < hi:
                path = rest[-1] if len(rest) == 4 else ""
                if "p" not in perms or path.startswith("/"):
                    return 0  # shared, or a file's mapping: not RssAnon
                break
        page = os.sysconf("SC_PAGE_SIZE")
        lo = start - start % page
        n = (start + int(heap.nbytes) - lo + page - 1) // page
        vec = (ctypes.c_ubyte * n)()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * page), vec) != 0:
            return 0
        return int(sum(v & 1 for v in vec)) * page // 1024
    except (OSError, ValueError, AttributeError):
        return 0


def private_kib(heap: Any) -> int:
    """This process's private resident memory (``RssAnon``) less the heap's pages where the
    heap is private memory (:func:`heap_private_kib`), KiB, after giving freed memory back;
    peak RSS where /proc is not there."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) - heap_private_kib(heap)
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
