"""Pure chunk arithmetic and the algorithm table (no MPI, no numpy arrays).

Shards: ``n`` elements split over ``parts`` owners, the first ``n % parts`` shards one element
longer, so any count works (0, 1, primes, not divisible by the world size).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmName", "AlgorithmTable", "shard_bounds", "shard_of"]


class Algorithm(enum.StrEnum):
    """An all-reduce algorithm; ``Algorithm.ONE_SHOT`` and ``"one_shot"`` are interchangeable."""

    AUTO = "auto"  # the table's choice by size, world size and nodes
    ONE_SHOT = "one_shot"  # every rank reduces every input
    TWO_SHOT = "two_shot"  # reduce-scatter, then all-gather of the shards
    HIERARCHICAL = "hierarchical"  # within nodes through memory, between nodes through MPI


AlgorithmName = Literal["auto", "one_shot", "two_shot", "hierarchical"]
ALGORITHMS: tuple[str, ...] = ("one_shot", "two_shot", "hierarchical")


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the ``parts`` shards of ``n`` elements, in order.

    Parameters
    ----------
    n : int
        The number of elements.
    parts : int
        The number of shards; the first ``n % parts`` shards get one element more.

    Returns
    -------
    list of tuple of int
        ``parts`` half-open ``(start, stop)`` ranges covering ``range(n)`` in order.

    Raises
    ------
    ValueError
        ``parts`` is less than 1.
    """
    if parts < 1:
        raise ValueError(f"shard_bounds: parts must be >= 1 (got {parts})")
    base, extra = divmod(n, parts)
    bounds = []
    start = 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_of(n: int, parts: int, index: int) -> tuple[int, int]:
    """The ``index``-th shard of :func:`shard_bounds` without building the list."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass(frozen=True)
class AlgorithmTable:
    """Which all-reduce to run for a message of ``nbytes`` on ``world_size`` ranks.

    Across nodes: ``hierarchical``. On one node: ``one_shot`` up to the row's
    ``one_shot_max_nbytes`` (the first row whose ``max_world_size`` covers the world), else
    ``two_shot``; on a crowded node (more ranks than cores: every round of flags is a chain of
    context switches, and one-shot has one round fewer) up to ``crowded_one_shot_max_nbytes``
    at least. ``forced`` (from the config) overrides everything.

    Parameters
    ----------
    rows : tuple of (int, int)
        ``(max_world_size, one_shot_max_nbytes)`` rows, by increasing ``max_world_size``.
    forced : str
        ``"auto"`` (use the rows) or an algorithm's name, which every call then runs.
    crowded : bool
        Whether the node's ranks outnumber its cores (the same on every rank: the channel
        agrees on it when it is made).
    crowded_one_shot_max_nbytes : int
        One-shot up to this size where ``crowded``.
    """

    # Measured on the 2-core development machine (benchmarks/allreduce.py, forced algorithms):
    # 2 ranks, one-shot beats two-shot at every size from 8 KiB to 32 MiB (2.8-4.1x MPI vs
    # 1.9-2.8x); 4 ranks, one-shot wins up to 64 KiB, two-shot from 256 KiB. (The rows beyond
    # 2 ranks were measured there before the one-shot plan ran in C, the node crowded; they
    # stand for a node with a core per rank, where one-shot's P reads of every byte cost more
    # than its round fewer saves: not measured on such a node yet. Crowded: below.)
    rows: tuple[tuple[int, int], ...] = (
        (2, 1 << 62),
        (4, 128 << 10),
        (8, 64 << 10),
        (1 << 30, 32 << 10),
    )
    forced: str = "auto"
    crowded: bool = False
    # A crowded node (3, 4, 6 and 8 ranks on the 2 cores, float32, each form against MPI in
    # one job, the one-shot plan replayed in C against the two-shot path): one-shot wins in
    # place, numpy in, symmetric in at 128 KiB-512 KiB (0.7-1.3 -> 1.1-4.0x MPI) and every form
    # but numpy in at 1 MiB (in place 1.07-2.29 -> 1.20-3.42, symmetric 1.5-2.9 -> 2.1-7.9;
    # numpy in 0.99-1.89 -> 0.88-2.33); at 2 MiB (the plan's limit) mixed: 4 ranks in place
    # 1.96 -> 2.56, numpy in 1.63 -> 1.30, symmetric 2.0 -> 1.7-1.8
    crowded_one_shot_max_nbytes: int = 1 << 20

    def choose(self, nbytes: int, world_size: int, num_nodes: int) -> str:
        """The algorithm for one all-reduce, by the rules above.

        Parameters
        ----------
        nbytes : int
            The message's size in bytes.
        world_size : int
            The number of ranks taking part.
        num_nodes : int
            The number of nodes they span.

        Returns
        -------
        str
            ``"one_shot"``, ``"two_shot"``, ``"hierarchical"``, or ``forced`` when it is not
            ``"auto"``.
        """
        if self.forced != "auto":
            return self.forced
        if num_nodes > 1:
            return "hierarchical"
        if world_size == 1:
            return "one_shot"
        floor = self.crowded_one_shot_max_nbytes if self.crowded else -1
        for max_world, one_shot_max in self.rows:
            if world_size <= max_world:
                return "one_shot" if nbytes <= max(one_shot_max, floor) else "two_shot"
        return "one_shot" if nbytes <= floor else "two_shot"
