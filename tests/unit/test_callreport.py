"""Call reports (shmem.callreport): each rank's line, the table, and the exchange on one
rank (the exchange between ranks runs in tests/mpi/test_mismatch_matrix.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shmem.callreport import CallLine, Reporter, differ, mismatch_error, table
from shmem.errors import CollectiveMismatchError


def test_a_line_names_the_rank_its_member_index_and_its_call() -> None:
    assert str(CallLine(2, 2, 5, "barrier()")) == "rank 2 in its call 5: barrier()"
    assert str(CallLine(3, 0, 1, "all_gather(4 int8)")) == (
        "rank 3 (member 0) in its call 1: all_gather(4 int8)"
    )
    missing = CallLine(1, 1, 0, "", waited_s=20.04)
    assert not missing.seen
    assert str(missing) == "rank 1: not seen yet (waited 20.0 s)"


def test_lines_differ_by_call_or_by_number_never_by_an_absent_rank() -> None:
    a = CallLine(0, 0, 3, "all_reduce(8 float32, op=sum, algorithm=auto)")
    same = CallLine(1, 1, 3, a.text)
    assert not differ([a, same])
    assert not differ([a, same, CallLine(2, 2, 0, "", 1.0)])  # not seen: no evidence
    assert differ([a, CallLine(1, 1, 3, "broadcast(8 float32, root=0)")])
    assert differ([a, CallLine(1, 1, 2, a.text)])  # the same call, one call apart


def test_the_error_carries_the_table() -> None:
    lines = [CallLine(0, 0, 1, "barrier()"), CallLine(1, 1, 1, "all_gather(2 int32)")]
    err = mismatch_error("Communicator.barrier", lines)
    assert isinstance(err, CollectiveMismatchError) and isinstance(err, RuntimeError)
    assert err.calls == tuple(lines)
    assert str(err) == (
        "Communicator.barrier: ranks called different collectives; each rank's call, as it "
        "described it:\n" + table(lines)
    )
    assert table(lines).splitlines() == ["  " + str(line) for line in lines]
    assert CollectiveMismatchError("old style").calls == ()


def test_alone_the_exchange_is_this_rank_s_line() -> None:
    mpi = pytest.importorskip("mpi4py.MPI")
    if not mpi.Is_initialized():
        pytest.skip("MPI is not initialised in this process")
    seen: list[int] = []
    reporter = Reporter(mpi.COMM_SELF, [7], 1.0, lambda: seen.append(1))
    assert reporter.exchange(4, "barrier()") == [CallLine(7, 0, 4, "barrier()")]
    assert reporter.reports == 1


class _Comm:
    """Two members, as seen by member 0: member 1's lines arrive as queued (none: it never
    reports), with an earlier report's line first."""

    def __init__(self, queued: list[Any]) -> None:
        self.queued = queued
        self.sent: list[Any] = []

    def Get_rank(self) -> int:
        return 0

    def isend(self, obj: Any, dest: int, tag: int) -> Any:
        self.sent.append((obj, dest, tag))
        return None

    def iprobe(self, source: int, tag: int) -> bool:
        return bool(self.queued)

    def recv(self, source: int, tag: int) -> Any:
        return self.queued.pop(0)


def test_a_stale_line_is_dropped_and_a_missing_one_is_not_seen(monkeypatch: Any) -> None:
    from shmem import callreport

    monkeypatch.setattr(callreport, "_reap", lambda: None)
    monkeypatch.setattr(callreport, "_SENDS", [])
    comm = _Comm([(0, 9, "all_gather(2 int8)"), (1, 4, "barrier()")])
    reporter = Reporter(comm, [0, 5], 0.05)  # type: ignore[arg-type]
    reporter.reports = 1  # this is the member's second report: index 1
    lines = reporter.exchange(4, "all_gather(2 int8)")
    assert lines == [CallLine(0, 0, 4, "all_gather(2 int8)"), CallLine(5, 1, 4, "barrier()")]
    assert comm.sent == [((1, 4, "all_gather(2 int8)"), 1, callreport.REPORT_TAG)]
    alone = Reporter(_Comm([]), [0, 5], 0.05)  # type: ignore[arg-type]
    lines = alone.exchange(1, "barrier()")
    assert not lines[1].seen and lines[1].waited_s >= 0.05
    assert alone.exchange(2, "barrier()", wait=False)[1].waited_s < 0.05
