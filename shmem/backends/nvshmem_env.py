"""NVSHMEM's environment, set before ``nvshmem.core.init``: the ``[nvshmem]`` settings and the
symmetric heap's size (NVSHMEM reads both once, at init)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import MutableMapping
from typing import Any

from ..errors import ConfigError

__all__ = ["SYMMETRIC_DEFAULT", "SYMMETRIC_RESERVE", "environment", "symmetric_size"]

SYMMETRIC_DEFAULT = 1 << 30  # NVSHMEM's NVSHMEM_SYMMETRIC_SIZE when unset
SYMMETRIC_RESERVE = 64 << 20  # room beside the slab for NVSHMEM's own symmetric allocations
_SCALE = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _parse_size(text: str) -> int:
    """A size as NVSHMEM reads its environment: a number, then at most one scale letter
    (k, m, g, t in either case; what follows it is ignored): ``"20m"``, ``"3.1M"``, ``".5g"``."""
    m = re.fullmatch(r"\s*(\d+\.?\d*|\.\d+)(?:([kKmMgGtT]).*)?\s*", text)
    if m is None:
        raise ValueError(text)
    return math.ceil(float(m.group(1)) * _SCALE.get((m.group(2) or "").lower(), 1))


def symmetric_size(heap_nbytes: int, env: MutableMapping[str, str] | None = None) -> int:
    """Make NVSHMEM's symmetric heap hold a slab of ``heap_nbytes`` (before ``init``).

    NVSHMEM reserves ``NVSHMEM_SYMMETRIC_SIZE`` per PE (1 GiB unset) and its allocations
    fail beyond it, so a larger heap sets it to the slab plus :data:`SYMMETRIC_RESERVE`; a
    value the user set is kept when it is large enough.

    Parameters
    ----------
    heap_nbytes : int
        The slab (``[heap] nbytes``).
    env : mapping, optional
        The environment to read and set (default ``os.environ``).

    Returns
    -------
    int
        The symmetric size NVSHMEM will use, in bytes.

    Raises
    ------
    ConfigError
        ``NVSHMEM_SYMMETRIC_SIZE`` is set but unreadable, or too small for the slab.
    """
    env = os.environ if env is None else env
    need = int(heap_nbytes) + SYMMETRIC_RESERVE
    given = env.get("NVSHMEM_SYMMETRIC_SIZE", "")
    if not given:
        if need <= SYMMETRIC_DEFAULT:
            return SYMMETRIC_DEFAULT
        env["NVSHMEM_SYMMETRIC_SIZE"] = str(need)
        return need
    try:
        have = _parse_size(given)
    except ValueError:
        raise ConfigError(
            f"init: NVSHMEM_SYMMETRIC_SIZE={given!r} is not a size NVSHMEM reads (a number "
            "with an optional k, m, g or t: '2g', '1536m')"
        ) from None
    if have < need:
        raise ConfigError(
            f"init: NVSHMEM_SYMMETRIC_SIZE={given!r} ({have} bytes) cannot hold a heap of "
            f"{heap_nbytes} bytes and NVSHMEM's own {SYMMETRIC_RESERVE >> 20} MiB; set it to "
            f"at least {need} or unset it (the backend then sets it from the heap size)"
        )
    return have


def environment(cfg: Any, single_node: bool) -> None:
    """NVSHMEM settings from ``[nvshmem]`` (the launcher sets them too; the environment wins)."""
    wanted = {
        "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": cfg.bootstrap_ifname or ("lo" if single_node else ""),
        "NVSHMEM_REMOTE_TRANSPORT": cfg.remote_transport,
        "NVSHMEM_DISABLE_NVLS": "1" if cfg.disable_nvls else "",
        "NVSHMEM_DISABLE_NCCL": "1" if cfg.disable_nccl else "",
    }
    for key, value in wanted.items():
        if value:
            os.environ.setdefault(key, value)
