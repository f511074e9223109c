"""Parameter grids for the GPU tests, with the GPU run's smoke tier marked in them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pytest


def grid(*axes: Sequence[Any], smoke: Iterable[tuple[Any, ...]] = ()) -> list[Any]:
    """Every combination of ``axes`` (in their order) as pytest params; the combinations in
    ``smoke`` carry the ``smoke`` mark (tier 1 of ``./dev gpu``: scripts/gpu_run.py)."""
    chosen = set(smoke)
    missing = chosen - set(itertools.product(*axes))
    if missing:
        raise ValueError(f"grid: smoke combinations not in the grid: {sorted(missing, key=str)}")
    return [
        pytest.param(*combo, marks=[pytest.mark.smoke] * (combo in chosen))
        for combo in itertools.product(*axes)
    ]
