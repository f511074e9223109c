"""The string choices of the public API are StrEnums that also accept the plain strings."""

from __future__ import annotations

import enum

import numpy as np
import pytest

import collectives
import shmem
from collectives.allreduce import choose
from collectives.ops import OPS, check_op
from collectives.schedule import ALGORITHMS, AlgorithmTable
from shmem.errors import ArgumentError, CollectiveArgumentError, OpError


@pytest.mark.parametrize(
    ("enum_type", "names"),
    [
        (collectives.ReduceOp, OPS),
        (collectives.Algorithm, ("auto", *ALGORITHMS)),
        (shmem.Cmp, ("eq", "ne", "gt", "ge", "lt", "le")),
        (shmem.SignalOp, ("set", "add")),
    ],
)
def test_each_enum_is_its_strings(enum_type: type[enum.StrEnum], names: tuple[str, ...]) -> None:
    assert [m.value for m in enum_type] == list(names)
    for name in names:
        member = enum_type(name)
        assert member == name and hash(member) == hash(name) and str(member) == name
        assert {name: 1}[member] == 1  # usable wherever the string keys a table


def test_ops_accept_the_enum_and_refuse_the_unknown() -> None:
    f32 = np.dtype(np.float32)
    check_op(collectives.ReduceOp.MAX, f32, "t")
    check_op("max", f32, "t")
    with pytest.raises(OpError, match=r"t: unknown op \(got 'maximum'; expected one of"):
        check_op("maximum", f32, "t")
    with pytest.raises(OpError, match="unknown op"):
        check_op(3, f32, "t")  # type: ignore[arg-type]
    with pytest.raises(OpError, match="needs an integer or bool dtype"):
        check_op(collectives.ReduceOp.BXOR, f32, "t")
    assert issubclass(OpError, ArgumentError)


class _Stats:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def count(self, algorithm: str) -> None:
        self.seen.append(algorithm)


class _Channel:
    """What ``choose`` reads of a channel, without a World."""

    def __init__(self, world_size: int, num_nodes: int) -> None:
        self.table = AlgorithmTable()
        self.world_size, self.num_nodes = world_size, num_nodes
        self.stats = _Stats()


def test_choose_takes_the_enum_the_string_and_refuses_others() -> None:
    ch = _Channel(4, 1)
    assert choose(ch, collectives.Algorithm.TWO_SHOT, 8, "t") == "two_shot"  # type: ignore[arg-type]
    assert choose(ch, "one_shot", 1 << 30, "t") == "one_shot"  # type: ignore[arg-type]
    assert choose(ch, collectives.Algorithm.AUTO, 8, "t") == "one_shot"  # type: ignore[arg-type]
    with pytest.raises(CollectiveArgumentError, match=r"t: unknown algorithm \(got 'fast'"):
        choose(ch, "fast", 8, "t")  # type: ignore[arg-type]
    assert choose(_Channel(4, 2), "one_shot", 8, "t") == "hierarchical"  # type: ignore[arg-type]
    assert ch.stats.seen == ["two_shot", "one_shot", "one_shot"]
