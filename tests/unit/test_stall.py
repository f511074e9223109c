"""Stall analysis (launch.stall and the launcher's root cause), on made-up records."""

from __future__ import annotations

import os
import time
from pathlib import Path

from launch.report import ErrorRecord, StartRecord
from launch.stall import process_state, stalled_ranks, waited_for
from launch.verdict import root_cause
from shmem.errors import RemoteTimeoutError, SignalTimeoutError


def _timeout(peers: tuple[int, ...]) -> SignalTimeoutError:
    return SignalTimeoutError(
        "x", operation="all_reduce", slot=1, expected=">= 2", last_value=1, peers=peers
    )


def test_waited_for_reads_the_timeouts_in_the_chain() -> None:
    assert waited_for(_timeout((1, 2, 1))) == [1, 2]
    assert waited_for(_timeout(())) == []
    assert waited_for(ValueError("no timeout")) == []
    try:
        try:
            raise RemoteTimeoutError("signal did not complete", peer=3)
        except RemoteTimeoutError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as outer:
        assert waited_for(outer) == [3]


def test_stalled_ranks_follow_the_waits_to_their_end() -> None:
    assert stalled_ranks({0: [1], 2: [1]}, set()) == [1]
    assert stalled_ranks({0: [2], 2: [1], 3: [1]}, set()) == [1]  # 2 waited too: follow it
    assert stalled_ranks({0: [1]}, {1}) == []  # rank 1 failed: that is the root cause
    assert stalled_ranks({0: [1], 1: [0]}, set()) == []  # a loop of waits ends nowhere
    assert stalled_ranks({}, set()) == []


def test_process_state_of_this_process_and_of_none() -> None:
    assert process_state(os.getpid()).startswith("running")
    assert process_state(2**22 + 12345) == "gone"


def _error(rank: int, waited: list[int], states: dict[str, str] | None = None) -> ErrorRecord:
    return ErrorRecord(
        rank, 3, "host", 100 + rank, time.time() + rank * 1e-3, 1,
        f"SignalTimeoutError: rank {rank} waited", "tb", -1, waited, states or {},
    )  # fmt: skip


def test_the_rank_everyone_waited_for_is_theroot_cause(tmp_path: Path) -> None:
    for r in range(3):
        StartRecord(r, 3, "host", 100 + r, time.time()).write(tmp_path)
    (tmp_path / "rank.1.stack").write_text('  File "job.py", line 7 in spin\n')
    errors = [_error(0, [1], {"1": "running on a CPU"}), _error(2, [1])]
    result = root_cause(tmp_path, errors, [], 1)
    text = "\n".join(result.summary)
    assert result.exit_code == 1
    assert text.startswith(
        "launch: job failed; root cause: rank 1 of 3 on host (pid 101) stalled: "
        "rank(s) 0, 2 timed out waiting for it"
    ), text
    assert "what rank 1 was doing: running on a CPU" in text
    assert 'File "job.py", line 7 in spin' in text
    assert "timed out waiting for rank 1: rank 0 of 3" in text


def test_a_failed_rank_stays_the_root_cause_of_the_waits(tmp_path: Path) -> None:
    own = ErrorRecord(1, 3, "host", 101, time.time() + 1, 4, "ValueError: boom", "tb")
    result = root_cause(tmp_path, [_error(0, [1]), own], [], 1)
    assert result.summary[0].startswith("launch: job failed; root cause: rank 1 of 3"), (
        result.summary
    )
    assert result.exit_code == 4
    assert any(ln.startswith("  timed out waiting for rank 1: rank 0") for ln in result.summary)


def test_timeouts_that_name_nobody_keep_the_earliest_as_root_cause(tmp_path: Path) -> None:
    """No rank named: the earliest timeout is all there is to say (the flight recorder's
    work, issue 33)."""
    result = root_cause(tmp_path, [_error(0, []), _error(2, [])], [], 1)
    assert result.summary[0].startswith("launch: job failed; root cause: rank 0 of 3")


def test_a_later_asker_reports_the_state_the_first_saw_before_its_signal(tmp_path: Path) -> None:
    """Two ranks time out on rank 1 together: the first reads ``/proc``, asks for the stacks
    (rank 1 then runs its dump); the second, reading ``/proc`` during the dump, would say
    "running on a CPU". It reports the first asker's reading instead (CI saw the race)."""
    from launch.rank import _Rank

    first, second = object.__new__(_Rank), object.__new__(_Rank)
    first.log_dir = second.log_dir = tmp_path
    first.rank, second.rank = 0, 2
    assert first._first_to_ask(1, "sleeping in the kernel") == (True, "sleeping in the kernel")
    assert second._first_to_ask(1, "running on a CPU (busy)") == (False, "sleeping in the kernel")
    assert second._first_to_ask(3, "running on a CPU (busy)") == (True, "running on a CPU (busy)")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["rank.1.stack.asked", "rank.3.stack.asked"]  # no draft stays
