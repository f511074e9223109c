"""Collectives built on symmetric memory (all-reduce and family, sequence-parallel attention).

The algorithms land with their own issues; this package depends on :mod:`shmem` only.
"""

from __future__ import annotations

__all__: list[str] = []
