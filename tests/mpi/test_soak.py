"""The short CI form of scripts/soak.py: seeded random heap, RMA, atomic, signal and
collective operations against bitwise references, and the heap back to its baseline."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shmem import World

pytestmark = pytest.mark.mpi

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from soak import soak  # noqa: E402


@pytest.mark.parametrize("seed", [1, 2])
def test_short_soak(world: World, seed: int) -> None:
    counts = soak(world, 300, seed)
    assert sum(counts.values()) == 300
