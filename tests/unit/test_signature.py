"""Call signatures (collectives.signature): what every rank packs and compares."""

from __future__ import annotations

import numpy as np
import pytest

from collectives.ops import ReduceOp
from collectives.signature import (
    BARRIER,
    COLLECTIVES,
    collective_of,
    describe,
    describe_args,
    describe_call,
    signature,
)


def test_every_field_round_trips_through_describe() -> None:
    sig = signature(("Communicator.all_reduce", 1000, "float32", "sum", "auto"))
    assert sig > 0
    assert describe(sig) == "all_reduce(1000 float32, op=sum)"
    assert describe(signature(("Communicator.broadcast", 7, "int64", "3"))) == (
        "broadcast(7 int64, root=3)"
    )


@pytest.mark.parametrize("name", COLLECTIVES)
def test_each_collective_has_its_own_signature(name: str) -> None:
    sigs = {signature((n, 8, "float32")) for n in COLLECTIVES}
    assert len(sigs) == len(COLLECTIVES)
    assert describe(signature((name, 8, "float32"))).startswith(name + "(")


def test_alltoalls_signs_nelems_not_the_local_size_of_x() -> None:
    # x may be larger than needed on some ranks: only nelems (and the dtype) must agree
    a = signature(("Communicator.alltoalls", 100, "float32", 2, 1, 3))
    b = signature(("Communicator.alltoalls", 40, "float32", 2, 4, 1))
    assert a == b and describe(a) == "alltoalls(2 float32)"
    assert a != signature(("Communicator.alltoalls", 100, "float32", 3, 1, 1))


def test_collect_signs_no_count() -> None:
    # collect's counts may differ between ranks
    assert signature(("collect", 5, "int32")) == signature(("collect", 9, "int32"))
    assert describe(signature(("collect", 5, "int32"))) == "collect(int32)"


def test_anything_else_is_unknown_and_every_word_describes() -> None:
    assert signature(("scan", 4, "float32")) == 0
    assert signature(("all_reduce", "invalid")) == 0
    assert describe(0) == "no collective" and describe(-1) == "an abandoned call"
    assert "another size" in describe((1 << 62) | 0xF)  # not a signature: no error


def test_the_algorithm_that_runs_is_signed() -> None:
    """Ranks whose all-reduces would run different protocols differ in their signatures
    (before, one rank's one_shot against another's two_shot timed out)."""
    one = signature(("all_reduce", 8, "float32", "sum", "one_shot"))
    two = signature(("all_reduce", 8, "float32", "sum", "two_shot"))
    assert one != two
    assert describe(two) == "all_reduce(8 float32, op=sum, algorithm=two_shot)"
    # "auto" is resolved before the signature is made: unresolved, it signs no algorithm
    assert describe(signature(("all_reduce", 8, "float32", "sum", "auto"))).endswith("op=sum)")


def test_counts_up_to_36_bits_and_the_barrier() -> None:
    assert describe(signature(("all_gather", (1 << 36) - 2, "int8"))).startswith(
        f"all_gather({(1 << 36) - 2} int8"
    )
    assert describe(signature(("all_gather", 1 << 40, "int8"))).startswith(
        f"all_gather({(1 << 36) - 1}+ int8"
    )
    assert describe(BARRIER) == "barrier()" and collective_of(BARRIER) == "barrier"
    assert collective_of(0) == "" and collective_of(-2) == ""


def test_abandoned_calls_say_why() -> None:
    assert describe(-1) == "an abandoned call"
    assert describe(-2) == "an abandoned call (ranks called different collectives)"


def test_a_call_is_described_from_its_own_arguments() -> None:
    x = np.zeros((4, 4), np.float32)
    assert describe_args("all_reduce", (x, "sum", None, "auto", None, None, None)) == (
        "all_reduce(16 float32, op=sum, algorithm=auto)"
    )
    fused = describe_args("all_reduce", (x, "avg", x, "one_shot", None, "bfloat16", 0.5))
    assert fused == (
        "all_reduce(16 float32, op=avg, algorithm=one_shot, out_dtype=bfloat16, scale=0.5)"
    )
    assert describe_args("broadcast", (np.zeros(3, np.int64), 2)) == "broadcast(3 int64, root=2)"
    assert describe_args("barrier", ()) == "barrier()"
    counts = list(range(12))
    text = describe_args("all_to_allv", (np.zeros(66, np.int8), counts, counts))
    assert "send_counts=[0, 1, 2, 3, 4, 5, 6, 7, ... (12 in all)]" in text
    assert describe_call("all_gather", object()) == "all_gather(a object)"
    assert describe_call("reduce_scatter", x, op=ReduceOp.MAX) == (
        "reduce_scatter(16 float32, op=max)"
    )
