"""SequenceParallelOptions: one frozen options object, keywords override it, the schedule enum."""

from __future__ import annotations

import dataclasses

import pytest

from collectives.mha import Schedule, SequenceParallelOptions, simulate_straggler
from collectives.mha._sp_setup import HOOKS
from collectives.mha.options import resolve_options
from shmem.errors import SequenceParallelError


def test_defaults_and_overrides() -> None:
    base = resolve_options(None, {}, "f")
    assert base == SequenceParallelOptions()
    assert base.schedule == "dynamic" and base.schedule is Schedule.DYNAMIC
    opts = SequenceParallelOptions(causal=True, unit_rows=64)
    got = resolve_options(opts, {"schedule": "ring", "block_m": 32}, "f")
    assert (got.causal, got.unit_rows, got.schedule, got.block_m) == (True, 64, "ring", 32)
    assert opts.schedule == "dynamic"  # the caller's object is unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.causal = False  # type: ignore[misc]


def test_unknown_keywords_and_wrong_options_are_named() -> None:
    with pytest.raises(SequenceParallelError, match=r"f: unknown keyword\(s\) \['_slowdown'\]"):
        resolve_options(None, {"_slowdown": 2.0}, "f")  # type: ignore[typeddict-unknown-key]
    with pytest.raises(SequenceParallelError, match="options must be a SequenceParallelOptions"):
        resolve_options({"causal": True}, {}, "f")  # type: ignore[arg-type]


def test_schedule_enum_is_its_strings() -> None:
    assert [s.value for s in Schedule] == ["dynamic", "ring", "zigzag"]
    assert Schedule("zigzag") == "zigzag"


def test_simulate_straggler_sets_and_restores_the_hook() -> None:
    assert HOOKS.slowdown == 1.0
    with simulate_straggler(3):
        assert HOOKS.slowdown == 3.0
    assert HOOKS.slowdown == 1.0
    with (
        pytest.raises(SequenceParallelError, match=r"invalid factor \(got 0.5"),
        simulate_straggler(0.5),
    ):
        pass
