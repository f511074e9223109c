"""Make shmem take the fake libcuda for a driver, and nvshmem4py usable over the NVSHMEM
stand-in library (tests/fakegpu/README.md). :func:`install` patches this process;
``FAKEGPU_DRIVER=1`` in the environment makes every Python child whose path holds
tests/fakegpu do the same at start-up (``sitecustomize.py``), e.g. the importing process of
a GPU IPC test."""

from __future__ import annotations

import os


def install() -> None:
    """Patch this process, and mark the environment so its Python children patch theirs."""
    import shmem.backends as _backends
    import shmem.device.cuda.device as _c

    _c._driver_present = lambda: True  # the fake libcuda stands in for a driver
    _c.device_count.cache_clear()
    _backends._nvshmem_status = lambda: None  # no /dev/nvidia*: nvshmem4py runs on the fake
    os.environ["FAKEGPU_DRIVER"] = "1"


def nvshmem_calls() -> list[str]:
    """The NVSHMEM entry points this process has called, in order, a run of one call once
    (the stand-in library, ``fake_nvshmem.c``)."""
    import ctypes

    lib = ctypes.CDLL("libnvshmem_host.so.3")
    lib.fake_nvshmem_calls.restype = ctypes.c_char_p
    return (lib.fake_nvshmem_calls() or b"").decode().split()
