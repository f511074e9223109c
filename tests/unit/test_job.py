"""shmem.global_exit and shmem.pcontrol: their argument checks and the exit status the
environment sees (the job-ending itself runs in tests/jobs)."""

from __future__ import annotations

import pytest

import shmem
from shmem.errors import ArgumentError
from shmem.job import exit_status


@pytest.mark.parametrize("bad", [1.5, "3", None, True])
def test_global_exit_refuses_a_status_that_is_not_an_integer(bad: object) -> None:
    with pytest.raises(ArgumentError, match=r"global_exit: invalid status \(got"):
        shmem.global_exit(bad)  # type: ignore[arg-type]


def test_exit_status_is_one_byte_and_never_turns_a_failure_into_success() -> None:
    assert [exit_status(s) for s in (0, 1, 6, 255, 256, 257, -1)] == [0, 1, 6, 255, 1, 1, 255]


def test_pcontrol_is_a_checked_no_op() -> None:
    for args in ((), (0,), (2, "x")):
        shmem.pcontrol(*args)  # returns at once, nothing raised
    shmem.World.pcontrol(1)
    with pytest.raises(ArgumentError, match=r"pcontrol: invalid level \(got 'high'"):
        shmem.pcontrol("high")  # type: ignore[arg-type]
