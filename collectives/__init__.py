"""Collectives built on symmetric memory: all-reduce (one-shot, two-shot, hierarchical) and
the family (reduce-scatter, all-gather, broadcast, all-to-all), deterministic, with bounded
waits. Depends on :mod:`shmem` only.

>>> comm = collectives.Communicator(world)           # doctest: +SKIP
>>> comm.all_reduce(x, op="sum")                       # x: SHMEMBuffer (zero-copy) or ndarray
"""

from __future__ import annotations

from .channel import CommStats
from .communicator import Communicator
from .ops import OPS, ReduceOp
from .schedule import ALGORITHMS, Algorithm, AlgorithmTable, shard_bounds

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
