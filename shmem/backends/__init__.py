"""Heap backends, one per file, loaded lazily by name.

``host``: MPI-3 shared-memory window (+ MPI RMA for off-node peers), needs no hardware.
``nvshmem``: the NVSHMEM heap on GPUs (the only module that imports nvshmem).
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import os
from typing import Literal

from ..config import env_value
from ..errors import BackendUnavailableError

__all__ = ["BACKENDS", "Backend", "BackendName", "resolve_backend"]

log = logging.getLogger(__name__)


class Backend(enum.StrEnum):
    """The heap backend of a World: ``Backend.HOST`` and ``"host"`` are interchangeable."""

    AUTO = "auto"  # nvshmem where a GPU and nvshmem4py are usable, else host
    HOST = "host"  # MPI-3 shared-memory window (+ MPI RMA off-node); needs no hardware
    NVSHMEM = "nvshmem"  # the NVSHMEM heap on GPUs


BackendName = Literal["auto", "host", "nvshmem"]
BACKENDS = ("host", "nvshmem")


def _nvshmem_status() -> str | None:
    """None when the NVSHMEM backend could run here, else the reason it cannot."""
    if importlib.util.find_spec("shmem.backends.nvshmem") is None:
        return "the nvshmem backend is not part of this version yet"
    if importlib.util.find_spec("nvshmem") is None:
        return "nvshmem4py is not installed (pip install '.[gpu]')"
    if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/nvidiactl"):
        return "no CUDA device node (/dev/nvidia*) on this machine"
    return None


def resolve_backend(name: Backend | str) -> tuple[str, str]:
    """Map ``"auto" | "host" | "nvshmem"`` to a usable backend and the reason for the choice.

    ``"auto"`` takes ``$SHMEM_BACKEND`` when it is set (the test scripts pin ``host``), else
    nvshmem where a GPU and nvshmem4py are usable, else host.

    Raises
    ------
    BackendUnavailableError
        The backend is unknown or cannot be used here (the reason is in the message).
    """
    pinned = env_value("SHMEM_BACKEND")
    if name == "auto" and pinned is not None and pinned != "auto":
        name = pinned
        if name not in BACKENDS:
            raise BackendUnavailableError(
                f"init: unknown backend in SHMEM_BACKEND (got {name!r}; expected one of "
                f"{['auto', *BACKENDS]})"
            )
    if name == "host":
        return "host", "requested"
    if name == "nvshmem":
        why = _nvshmem_status()
        if why is not None:
            raise BackendUnavailableError(f"init: backend 'nvshmem' is unavailable ({why})")
        return "nvshmem", "requested"
    if name == "auto":
        why = _nvshmem_status()
        if why is None:
            return "nvshmem", "auto: a CUDA device and nvshmem4py are usable"
        if env_value("SHMEM_REQUIRE_GPU") == "1":
            raise BackendUnavailableError(
                f"init: SHMEM_REQUIRE_GPU=1 but the nvshmem backend is unavailable ({why})"
            )
        return "host", f"auto: {why}"
    raise BackendUnavailableError(
        f"init: unknown backend (got {name!r}; expected one of {['auto', *BACKENDS]})"
    )
