"""The short CI form of scripts/soak.py: seeded random heap, RMA, atomic, signal and
collective operations against bitwise references, and the heap back to its baseline.

With the defaults (the cached replays run, so the plan caches fill and evict: sizes are
drawn from 0 to 200,000 elements, and the cache holds 4 shapes) and with configs/ci.toml's
debug checks (the general paths). The long form (minutes per seed, both node splits, both
MPIs) is in docs/reliability.md."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shmem
from shmem import World

pytestmark = pytest.mark.mpi

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from soak import COLLECTIVES, KINDS, soak  # noqa: E402


@pytest.fixture
def defaults() -> Iterator[World]:
    """A World with the defaults: no argument checks, so the cached plans replay."""
    world = shmem.init(heap_nbytes="64MiB", signal_timeout_s=20.0)
    assert not world.config.collectives.check_args
    yield world
    world.finalize()


@pytest.mark.parametrize("seed", [1, 2])
def test_short_soak(defaults: World, seed: int) -> None:
    counts = soak(defaults, 500, seed, max_count=200_000, plan_cache=4)
    assert sum(counts[k] for k in KINDS) == 500
    assert sum(counts[k] for k in COLLECTIVES) == counts["collective"]


def test_short_soak_with_debug_checks(world: World) -> None:
    counts = soak(world, 300, 3, max_count=20_000)
    assert sum(counts[k] for k in KINDS) == 300
