"""Make shmem take the fake libcuda for a driver and the one-PE stand-in for nvshmem4py
(tests/fakegpu/README.md). :func:`install` patches this process; ``FAKEGPU_DRIVER=1`` in the
environment makes every Python child whose path holds tests/fakegpu do the same at start-up
(``sitecustomize.py``), e.g. the importing process of a GPU IPC test."""

from __future__ import annotations

import os


def install() -> None:
    """Patch this process, and mark the environment so its Python children patch theirs."""
    import shmem.backends as _backends
    import shmem.device.cuda.device as _c

    _c._driver_present = lambda: True  # the fake libcuda stands in for a driver
    _c.device_count.cache_clear()
    _backends._nvshmem_status = lambda: None  # and the fake nvshmem for nvshmem4py
    os.environ["FAKEGPU_DRIVER"] = "1"
