"""Call signatures (collectives.signature): what every rank packs and compares."""

from __future__ import annotations

import pytest

from collectives.signature import COLLECTIVES, describe, signature


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
