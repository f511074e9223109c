"""Collectives built on symmetric memory: all-reduce (one-shot, two-shot, hierarchical) and
the family (reduce-scatter, all-gather, broadcast, all-to-all), deterministic, with bounded
waits. Depends on :mod:`shmem` only.

>>> comm = collectives.Communicator(world)           # doctest: +SKIP
>>> comm.all_reduce(x, op="sum")                       # x: SHMEMBuffer (zero-copy) or ndarray
"""

from __future__ import annotations

from .communicator import CommStats, Communicator
from .ops import OPS
from .schedule import ALGORITHMS, AlgorithmTable, shard_bounds

__all__ = ["ALGORITHMS", "OPS", "AlgorithmTable", "CommStats", "Communicator", "shard_bounds"]
