"""The flight recorder's ring (shmem.flight) and what the launcher reads from the rings
(launch.stall): who never arrived at the call the others wait in."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from launch.stall import flight_lines, flight_verdict, read_rings, write_flight_json
from shmem import flight
from shmem.config import load_config
from shmem.errors import ConfigError
from shmem.flight import layout

ROOT = Path(__file__).resolve().parents[2]


def test_a_ring_keeps_the_last_calls_in_order_with_their_fields(tmp_path: Path) -> None:
    rec = flight.FlightRecorder(4, tmp_path / "r.flight", rank=2, world_size=3)
    s = rec.new_stream()
    for _ in range(6):
        rec.end(rec.begin(s, "all_reduce", 32, "float32"))
    n = rec.begin(s, "broadcast", 8, "int64", peer=0)
    log = flight.read_flight(tmp_path / "r.flight")
    # the stream's marker (number 0, seq 0), 6 all-reduces, a broadcast: the oldest are gone
    assert (log.rank, log.world_size, log.capacity, log.recorded) == (2, 3, 4, 8)
    assert [r.number for r in log.records] == [4, 5, 6, 7]
    assert [r.seq for r in log.records] == [4, 5, 6, 7]
    assert [r.state for r in log.records] == ["done", "done", "done", "pending"]
    last = log.records[-1]
    assert (last.op, last.nbytes, last.dtype, last.peer, last.stream) == (
        "broadcast",
        8,
        "int64",
        0,
        s,
    )
    assert log.pending() is last and log.last_completed() == log.records[-2]
    assert last.t_end == 0.0 and abs(last.t_start - time.time()) < 5
    rec.end(n, failed=True)
    again = rec.log().records[-1]
    assert again.state == "failed" and again.t_end >= again.t_start
    assert rec.log().pending() == again  # a failed last call is where the rank stopped


def test_a_new_stream_is_marked_in_the_ring_without_a_number() -> None:
    rec = flight.FlightRecorder(8)
    s = rec.new_stream()
    rec.end(rec.begin(s, "all_reduce"))
    got = [(r.op, r.seq, r.stream, r.state) for r in rec.log().records]
    assert got == [("communicator", 0, s, "done"), ("all_reduce", 1, s, "done")]
    assert rec.new_stream() == s + 1


def test_end_of_an_overwritten_record_changes_nothing() -> None:
    rec = flight.FlightRecorder(2)
    old = rec.begin(0, "barrier")
    rec.begin(0, "barrier")
    rec.begin(0, "barrier")  # overwrites old's slot
    rec.end(old)
    assert [r.state for r in rec.log().records] == ["pending", "pending"]
    rec.end(-1)  # what begin returns when off: nothing


def test_a_recorder_without_capacity_or_switched_off_records_nothing() -> None:
    off = flight.FlightRecorder(0)
    assert not off.enabled and off.begin(0, "init") == -1 and off.log().records == ()
    off.enabled = True  # no room: stays off
    assert not off.enabled
    rec = flight.FlightRecorder(8)
    rec.enabled = False
    assert rec.begin(0, "barrier") == -1 and rec.log().recorded == 0
    rec.enabled = True
    assert rec.begin(0, "barrier") == 0


def test_waits_are_numbered_apart_from_the_collectives_of_their_stream() -> None:
    rec = flight.FlightRecorder(16)
    for op in ("wait_until", "wait_until", "barrier", "wait_until", "barrier"):
        rec.end(rec.begin(0, op))
    seqs = [(r.op, r.seq) for r in rec.log().records]
    assert seqs == [
        ("wait_until", 1),
        ("wait_until", 2),
        ("barrier", 1),
        ("wait_until", 3),
        ("barrier", 2),
    ]


def test_recording_and_recorded_mark_a_call_pending_done_or_failed() -> None:
    rec = flight.install(flight.FlightRecorder(8))
    try:
        with flight.recording(0, "all_gather", _Array()):
            assert rec.log().pending() is not None
        with pytest.raises(KeyError), flight.recording(0, "collect"):
            raise KeyError("x")

        @flight.recorded("sync_all")
        def f(a: int) -> int:
            """doc"""
            return a + 1

        assert f(1) == 2 and f.__doc__ == "doc" and f.__name__ == "f"
        got = [(r.op, r.state, r.nbytes, r.dtype) for r in rec.log().records]
        assert got == [
            ("all_gather", "done", 64, "bfloat16"),
            ("collect", "failed", 0, ""),
            ("sync_all", "done", 0, ""),
        ]
        assert flight.recorder() is rec
    finally:
        flight.install(flight.FlightRecorder(64))


class _Array:
    nbytes = 64

    class dtype:
        name = "bfloat16"


def test_bad_arguments_and_foreign_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"FlightRecorder: capacity out of range \(got -1"):
        flight.FlightRecorder(-1)
    (tmp_path / "x").write_bytes(b"NOTARING" + bytes(2000))
    with pytest.raises(ValueError, match="read_flight: not a flight recorder ring"):
        flight.read_flight(tmp_path / "x")
    (tmp_path / "y").write_bytes(b"short")
    with pytest.raises(ValueError, match="too short"):
        flight.read_flight(tmp_path / "y")
    assert read_rings(tmp_path, 3) == {}  # no ring files: nothing, no error


def test_the_config_section_is_checked() -> None:
    assert load_config().flight.records == 64 and load_config().flight.stall_timeout_s == 0
    with pytest.raises(ConfigError, match=r"\[flight\] records: invalid \(got -1"):
        load_config(flight_records=-1)
    with pytest.raises(ConfigError, match=r"\[flight\] stall_timeout_s: invalid"):
        load_config(flight_stall_timeout_s=-2.0)


def test_the_c_replay_writes_the_layout_this_module_reads() -> None:
    """collectives/_replay.c writes records itself: its constants are flight.LAYOUT's (the
    records it writes are read back in tests/mpi/test_flight.py)."""
    src = (ROOT / "shmem" / "flight" / "flight_ring.h").read_text()
    for writer in ("collectives/_replay.c", "shmem/flight/_ring.c"):  # both on the header
        assert '#include "flight_ring.h"' in (ROOT / writer).read_text(), writer
    consts = dict(re.findall(r"FLIGHT_(\w+) = (\d+)", src))
    at = re.search(r"FLIGHT_RECORDS_AT = FLIGHT_HEADER \+ 2 \* FLIGHT_STREAMS \* 8", src)
    assert at and flight.LAYOUT["records_at"] == 128 + 2 * 64 * 8
    assert int(consts["HEADER"]) == flight.LAYOUT["header_bytes"]
    assert int(consts["STREAMS"]) == flight.LAYOUT["max_streams"]
    assert int(consts["NEXT"]) == flight.LAYOUT["next_word"]
    assert int(consts["ENABLED"]) == flight.LAYOUT["enabled_word"]
    assert int(consts["PENDING"]) == layout.PENDING and int(consts["DONE"]) == layout.DONE
    assert "sizeof(FlightRecord) == 64" in src and flight.LAYOUT["record_bytes"] == 64


# -- the launcher's reading of the rings ---------------------------------------------------------


def _rings(tmp_path: Path, calls: dict[int, list[tuple[str, bool]]]) -> Path:
    """Rank -> its calls on stream 1 (``(op, ended)``), as ring files in ``tmp_path``."""
    for r, seq in calls.items():
        rec = flight.FlightRecorder(8, tmp_path / f"rank.{r}.flight", rank=r, world_size=4)
        s = rec.new_stream()
        for op, ended in seq:
            n = rec.begin(0 if op == "wait_until" else s, op, 32, "float32")
            if ended:
                rec.end(n)
    return tmp_path


def test_the_rank_that_never_arrived_at_the_call_the_others_wait_in_is_found(
    tmp_path: Path,
) -> None:
    done20 = [("all_reduce", True)] * 20
    logs = _rings(
        tmp_path,
        {0: [*done20, ("all_reduce", False)], 1: done20, 2: [*done20, ("all_reduce", False)]},
    )
    rings = read_rings(logs, 3)
    v = flight_verdict(rings, 3)
    assert v.target is not None and v.target.describe() == "all_reduce #21"
    assert v.waiting == (0, 2) and v.behind == (1,) and v.elsewhere == {}
    lines = flight_lines(rings, 3, time.time() + 10)
    assert re.match(
        r"rank 1 last completed all_reduce #20; ranks 0 and 2 are in all_reduce #21 since 10\.\d s",
        lines[0],
    ), lines
    assert "rank 1: last completed all_reduce #20; in no recorded call" in lines[2]
    assert "rank 0: last completed all_reduce #20; in all_reduce #21 since" in lines[1]
    path = write_flight_json(logs, rings, 3, v)
    assert path is not None
    doc = json.loads(path.read_text())
    assert doc["never_arrived"] == [1] and doc["waiting"] == [0, 2]
    assert len(doc["rings"]["1"]["records"]) == 8 and doc["target"]["seq"] == 21


def test_a_rank_in_another_call_or_past_it_is_not_behind(tmp_path: Path) -> None:
    base = [("all_reduce", True)] * 3
    logs = _rings(
        tmp_path,
        {
            0: [*base, ("all_reduce", False)],
            1: [*base, ("all_reduce", False)],
            2: [*base, ("all_reduce", True), ("broadcast", False)],  # went past it
            3: [*base[:2], ("barrier", False)],  # stuck in an earlier, other call
        },
    )
    v = flight_verdict(read_rings(logs, 4), 4)
    assert v.waiting == (0, 1) and v.behind == (3,) and set(v.elsewhere) == {2, 3}


def test_waits_point_at_the_ranks_in_no_recorded_call_and_missing_rings_are_behind(
    tmp_path: Path,
) -> None:
    logs = _rings(
        tmp_path,
        {
            0: [("wait_until", True), ("wait_until", False)],
            2: [("wait_until", False)],  # another count of waits: the same wait
            3: [("all_reduce", True)],
        },
    )
    v = flight_verdict(read_rings(logs, 4), 4)
    assert v.waiting == (0, 2) and v.behind == (1, 3)  # rank 1 has no ring
    lines = flight_lines(read_rings(logs, 4), 4, time.time())
    assert any("rank 1: no flight record" in ln for ln in lines)


def test_no_target_when_every_rank_is_in_its_own_code(tmp_path: Path) -> None:
    logs = _rings(tmp_path, {0: [("init", True)], 1: [("init", True)]})
    v = flight_verdict(read_rings(logs, 2), 2)
    assert v.target is None and v.behind == () and v.waiting == ()


def test_the_call_a_rank_is_in_outlives_calls_made_inside_it() -> None:
    rec = flight.FlightRecorder(8)
    outer = rec.begin(1, "all_reduce")
    rec.end(rec.begin(0, "alloc"))  # the scratch grows inside the all-reduce
    rec.end(rec.begin(0, "free"))
    log = rec.log()
    assert log.pending() is not None and log.pending().op == "all_reduce"  # type: ignore[union-attr]
    assert log.last_completed() is not None and log.last_completed().op == "free"  # type: ignore[union-attr]
    rec.end(outer, failed=True)
    assert rec.log().pending() is None  # an inner call is the newest: the failure is over
    rec.end(rec.begin(1, "barrier"), failed=True)
    assert rec.log().pending().op == "barrier"  # type: ignore[union-attr]


def test_members_agree_on_a_stream_and_other_teams_are_told_apart(tmp_path: Path) -> None:
    """Ranks 0 and 1 made a team communicator (stream 1), ranks 2 and 3 another one (also
    stream 1, other members); rank 1 stalls before call 5 of its team: ranks 2 and 3, in
    their own team's call 3, are neither waiting with rank 0 nor behind it."""
    teams = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    calls = {0: 5, 1: 4, 2: 3, 3: 3}
    for r in range(4):
        rec = flight.FlightRecorder(4, tmp_path / f"rank.{r}.flight", rank=r, world_size=4)
        s = rec.new_stream(teams[r], agree=lambda n: [n, 1])  # every member proposes 1
        assert s == 1
        for i in range(calls[r]):
            n = rec.begin(s, "all_reduce")
            if i < calls[r] - 1 or r == 1:
                rec.end(n)
        for _ in range(6 if r == 1 else 0):  # waits push its stream's records out
            rec.end(rec.begin(0, "wait_until"))
    rings = read_rings(tmp_path, 4)
    assert not any(r.stream == 1 for r in rings[1].records)  # (gone from the ring)
    v = flight_verdict(rings, 4, 0)
    assert v.target is not None and v.target.seq == 5 and v.waiting == (0,)
    assert v.behind == (1,)  # by its counter: 4 calls on stream 1 (the records are gone)
    assert flight_verdict(rings, 4, 2).behind == ()  # ranks 2 and 3 are in call 3 together
    assert flight_verdict(rings, 4, 0, finished={1}).behind == ()


def test_a_new_stream_takes_the_highest_number_any_member_proposes() -> None:
    rec = flight.FlightRecorder(8)
    assert rec.new_stream(range(2), agree=lambda n: [n, 5]) == 5
    assert rec.new_stream(range(2)) == 6  # numbers go on from the agreed one


def test_configure_resizes_the_ring_in_its_file_or_switches_it_off(tmp_path: Path) -> None:
    old = flight.install(flight.FlightRecorder(8, tmp_path / "r.flight", rank=1, world_size=2))
    try:
        s = old.new_stream(range(2))
        old.end(old.begin(s, "all_reduce"))
        new = flight.configure(16)
        assert new is flight.recorder() and new is not old and new.capacity == 16
        log = flight.read_flight(tmp_path / "r.flight")  # the launcher reads the new one
        assert log.capacity == 16 and log.rank == 1 and log.counters[s] == 1
        assert new.new_stream() == s + 1  # the numbering goes on
        assert flight.configure(16) is new
        off = flight.configure(0)
        assert off is new and not off.enabled and off.begin(0, "barrier") == -1
    finally:
        flight.install(flight.FlightRecorder(64))


def test_sizes_that_raise_are_recorded_as_unknown() -> None:
    class Odd:
        @property
        def nbytes(self) -> int:
            raise RuntimeError("sparse")

    rec = flight.install(flight.FlightRecorder(4))
    try:
        with flight.recording(0, "barrier", Odd()):
            pass
        assert rec.log().records[-1].nbytes == 0
    finally:
        flight.install(flight.FlightRecorder(64))


def test_the_flight_file_that_cannot_be_written_costs_no_report(tmp_path: Path) -> None:
    logs = _rings(tmp_path, {0: [("all_reduce", False)], 1: []})
    rings = read_rings(logs, 2)
    assert write_flight_json(tmp_path / "gone", rings, 2, flight_verdict(rings, 2)) is None


def test_the_c_writer_and_the_python_writer_write_the_same_records() -> None:
    from shmem.flight import writer

    if getattr(writer, "_c_ring", None) is None:
        pytest.skip("the C writer (shmem.flight._ring) is not built")

    def calls(rec: flight.FlightRecorder) -> list[object]:
        s = rec.new_stream(range(3))
        rec.end(rec.begin(s, "all_reduce", 32, "float32"))
        rec.end(rec.begin(0, "wait_until", peer=2), failed=True)
        rec.begin(s, "broadcast", 8, "int64", 1)
        rec.end(rec.begin(0, "set_lock"))
        log = rec.log()
        got: list[object] = [
            (r.number, r.stream, r.seq, r.op, r.nbytes, r.dtype, r.peer, r.state)
            for r in log.records
        ]
        return [*got, log.counters[:3], log.counters[-1], log.members[s]]

    c = flight.FlightRecorder(4)
    py = flight.FlightRecorder(4)
    py._c = None  # the pure Python writer
    assert c._c is not None and calls(c) == calls(py)


def test_a_recorded_method_binds_and_records_its_failures() -> None:
    rec = flight.install(flight.FlightRecorder(8))
    try:

        class Thing:
            @flight.recorded("barrier")
            def go(self, fail: bool = False) -> Thing:
                """Go."""
                if fail:
                    raise OSError("no")
                return self

        t = Thing()
        assert t.go() is t and Thing.go(t) is t and Thing.go.__doc__ == "Go."
        with pytest.raises(OSError):
            t.go(fail=True)
        got = [(r.op, r.state) for r in rec.log().records]
        assert got == [("barrier", "done"), ("barrier", "done"), ("barrier", "failed")]
    finally:
        flight.install(flight.FlightRecorder(64))


def test_the_63rd_communicator_takes_the_first_ones_stream_anew() -> None:
    rec = flight.FlightRecorder(8)
    first = rec.new_stream(range(2))
    rec.end(rec.begin(first, "all_reduce"))
    streams = [rec.new_stream(range(2)) for _ in range(61)]
    assert streams == list(range(2, 63))  # the last counter is the waits'
    again = rec.new_stream(range(3))
    assert again == first == 1
    rec.end(rec.begin(again, "all_reduce"))
    log = rec.log()
    assert log.records[-1].seq == 1 and log.counters[1] == 1  # its calls are numbered anew
    assert log.members[1] != log.members[2]  # and its members are its own


def test_fail_current_marks_the_newest_pending_call_of_its_stream_only() -> None:
    """A rank about to report a mismatch records its call failed before it waits for the
    other lines (the job's abort may end it while it waits: CI saw such a rank's call still
    pending in flight.json)."""
    rec = flight.FlightRecorder(8)
    s, t = rec.new_stream(), rec.new_stream()
    outer = rec.begin(0, "alloc", 64, "float32")
    other = rec.begin(t, "all_reduce", 8, "float32")
    rec.end(rec.begin(s, "all_reduce", 8, "float32"))
    inner = rec.begin(s, "broadcast", 8, "float32")
    rec.fail_current(s)
    states = {r.number: r.state for r in rec.log().records}
    assert (states[inner], states[other], states[outer]) == ("failed", "pending", "pending")
    assert rec.log().records[-1].t_end > 0
    rec.fail_current(0)
    assert {r.number: r.state for r in rec.log().records}[outer] == "failed"
    rec.end(inner, failed=True)  # the call's own end records the same
    assert {r.number: r.state for r in rec.log().records}[inner] == "failed"
    rec.fail_current(s)  # nothing pending there: nothing changes
    flight.FlightRecorder(0).fail_current(0)  # the recorder off: a no-op
