"""Collectives built on symmetric memory: all-reduce (one-shot, two-shot, hierarchical) and
the family (reduce-scatter, all-gather, broadcast, all-to-all), deterministic, with bounded
waits. Depends on :mod:`shmem` only.

>>> comm = collectives.Communicator(world)           # doctest: +SKIP
>>> comm.all_reduce(x, op="sum")                       # x: SHMEMBuffer (zero-copy) or ndarray

The names below load on first use, so ``import collectives.torch_backend`` (which torch's
backend autoload runs inside ``import torch``) starts neither MPI nor a heap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .communicator import Communicator
    from .ops import OPS, ReduceOp
    from .schedule import ALGORITHMS, Algorithm, AlgorithmTable, shard_bounds
    from .stats import CommStats

__all__ = [
    "ALGORITHMS",
    "OPS",
    "Algorithm",
    "AlgorithmTable",
    "CommStats",
    "Communicator",
    "ReduceOp",
    "shard_bounds",
]

_HOME = {
    "CommStats": "stats",
    "Communicator": "communicator",
    "OPS": "ops",
    "ReduceOp": "ops",
    "ALGORITHMS": "schedule",
    "Algorithm": "schedule",
    "AlgorithmTable": "schedule",
    "shard_bounds": "schedule",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f".{home}", __name__), name)
    elif not name.startswith("__"):  # a submodule (``collectives.allreduce``), as before
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'collectives' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'collectives' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
