"""Stalls: a rank that stopped making progress while its peers waited for it.

A timeout that names the rank it waited for (``SignalTimeoutError.peers``,
``RemoteTimeoutError.peer``) is a consequence of that rank. The failing rank records whom it
waited for and, for a waited-for rank on its own host, what that rank was doing at that
moment: its state from ``/proc`` (stopped, running, or blocked in the kernel and where) and
its Python stacks of every thread (``SIGUSR1``, which ``faulthandler`` answers even from C).
The launcher then names the rank everyone waited for as the root cause
(:func:`stalled_ranks`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from shmem.flight import OPS, WAITS, FlightLog, FlightRecord, read_flight

__all__ = [
    "FlightVerdict",
    "ask_for_stacks",
    "flight_lines",
    "flight_verdict",
    "process_state",
    "read_rings",
    "stalled_ranks",
    "timeouts_in",
    "waited_for",
    "write_flight_json",
]

_STATES = {
    "R": "running on a CPU (busy: a loop that never reaches the next call?)",
    "S": "sleeping in the kernel",
    "D": "in an uninterruptible wait in the kernel",
    "T": "stopped (SIGSTOP or another stop signal)",
    "t": "stopped by a debugger",
    "Z": "a zombie (it exited; its parent has not reaped it)",
    "X": "dead",
}


def waited_for(exc: BaseException) -> list[int]:
    """The ranks ``exc`` (or an exception it came from) says it waited for, in order.

    Parameters
    ----------
    exc : BaseException
        The exception a rank failed with.

    Returns
    -------
    list of int
        ``SignalTimeoutError.peers`` or ``RemoteTimeoutError.peer`` of the first timeout in
        the chain that names any; empty when none does.
    """
    for e in timeouts_in(exc):
        peers = getattr(e, "peers", None)
        if peers is None and isinstance(getattr(e, "peer", None), int):
            peers = (e.peer,)  # type: ignore[attr-defined]
        named = [int(p) for p in peers or () if isinstance(p, int) and p >= 0]
        if named:
            return list(dict.fromkeys(named))
    return []


def timeouts_in(exc: BaseException) -> Iterator[TimeoutError]:
    """The timeouts among ``exc`` and the exceptions it came from (``__cause__``, else
    ``__context__``), nearest first.

    Parameters
    ----------
    exc : BaseException
        The exception a rank failed with.

    Yields
    ------
    TimeoutError
        Each timeout of the chain.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, TimeoutError):
            yield e
        e = e.__cause__ or e.__context__


def process_state(pid: int) -> str:
    """What process ``pid`` is doing, in words, from ``/proc`` (its main thread).

    Parameters
    ----------
    pid : int
        A process of this host.

    Returns
    -------
    str
        E.g. ``"stopped (SIGSTOP or another stop signal)"``, ``"sleeping in the kernel (wait
        channel: futex_wait_queue)"``; ``"gone"`` when the process no longer exists.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    state = stat[stat.rfind(")") + 2 :].split(" ", 1)[0]  # the name may hold spaces
    words = _STATES.get(state, f"state {state}")
    if state in ("S", "D"):
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        if wchan and wchan != "0":
            words += f" (wait channel: {wchan})"
    return words


def ask_for_stacks(pids: Iterable[int], stack_files: Sequence[Path], wait_s: float = 1.0) -> None:
    """Send ``SIGUSR1`` to each process (the launcher's ranks dump their Python stacks of
    every thread into their ``rank.<r>.stack`` file on it), then wait up to ``wait_s`` for
    the files to be written. A stopped process answers when it is continued, not now.

    Parameters
    ----------
    pids : iterable of int
        The rank processes (of this host) to ask.
    stack_files : sequence of Path
        Their stack files, waited for.
    wait_s : float
        The longest wait for the dumps.
    """
    sizes = {}
    for path in stack_files:
        try:
            sizes[path] = path.stat().st_size
        except OSError:
            sizes[path] = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            continue
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        grown = 0
        for path, size in sizes.items():
            with contextlib.suppress(OSError):
                grown += path.stat().st_size > size
        if grown == len(sizes):
            time.sleep(0.05)  # the dump is written in pieces: let it finish
            return
        time.sleep(0.01)


def stalled_ranks(waits: dict[int, list[int]], failed: set[int]) -> list[int]:
    """The ranks every wait leads to: waited for, not waiting themselves, not failed.

    Parameters
    ----------
    waits : dict
        Rank -> the ranks its timeout named (ranks that failed with such a timeout).
    failed : set of int
        Ranks that failed on their own (an error that is no such timeout, or a death).

    Returns
    -------
    list of int
        The stalled ranks, sorted; empty when every wait ends at a failed rank (then that
        failure is the root cause) or at nobody.
    """
    roots: set[int] = set()
    for start in waits:
        todo, seen = [start], {start}
        while todo:
            r = todo.pop()
            for w in waits.get(r, []):
                if w in seen:
                    continue
                seen.add(w)
                if w in waits:
                    todo.append(w)  # it timed out waiting too: follow it
                elif w not in failed:
                    roots.add(w)
    return sorted(roots)


# -- the flight recorder's view: who never arrived at the call the others are in ---------------

_COLLECTIVE = frozenset(OPS) - WAITS - {"unknown"}  # every rank makes them, in order


def read_rings(logs: Path, nranks: int) -> dict[int, FlightLog]:
    """Every rank's flight recorder ring in ``logs`` (``rank.<r>.flight``) that can be read.

    Parameters
    ----------
    logs : Path
        The job's log directory.
    nranks : int
        The job's ranks.

    Returns
    -------
    dict
        Rank -> its ring; ranks without a readable ring are left out.
    """
    rings = {}
    for r in range(nranks):
        with contextlib.suppress(OSError, ValueError):
            rings[r] = read_flight(logs / f"rank.{r}.flight")
    return rings


@dataclass(frozen=True)
class FlightVerdict:
    """What the rings say: the call most waiting ranks are in (``target``, None when no
    rank is in a recorded call), the ranks in it, and the ranks that never arrived there
    (``behind``): in no recorded call, or in an earlier one."""

    target: FlightRecord | None
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    elsewhere: dict[int, FlightRecord]  # ranks in another call than the target


def _key(rec: FlightRecord, log: FlightLog) -> tuple[int, int, str, int]:
    """The call ``rec`` is, the same on every rank in it: its communicator (stream and
    members), operation and number (waits: any number)."""
    members = log.members[rec.stream] if 0 <= rec.stream < len(log.members) else 0
    return (rec.stream, members, rec.op, rec.seq if rec.op in _COLLECTIVE else 0)


def flight_verdict(
    rings: dict[int, FlightLog],
    nranks: int,
    rank: int | None = None,
    finished: Collection[int] = (),
) -> FlightVerdict:
    """The call ``rank`` is in (by default the call the most ranks are in), and who never
    arrived at it.

    For a collective, the members of its communicator (the ranks whose ring gives its
    stream the same members) whose count of calls on that stream stops short of its
    number never arrived: they stalled before it, in their own code or in another call
    (``elsewhere``); a member whose count reached it is in it or went past it. For a wait
    (``wait_until``, ``set_lock``: no rank's number matches another's) the ranks in no
    recorded call are the ones the waits are for. A rank without a ring never arrived at
    anything; a rank that ``finished`` is behind nobody.

    Parameters
    ----------
    rings : dict
        Rank -> its ring (:func:`read_rings`).
    nranks : int
        The job's ranks.
    rank : int, optional
        The rank whose call is the target (a rank that timed out in it).
    finished : collection of int, optional
        Ranks that ended (their program returned).

    Returns
    -------
    FlightVerdict
        The target call, the ranks in it, and the ranks behind it.
    """
    pending = {r: log.pending() for r, log in rings.items()}
    groups: dict[tuple[int, int, str, int], list[int]] = {}
    for r, rec in pending.items():
        if rec is not None:
            groups.setdefault(_key(rec, rings[r]), []).append(r)
    mine = pending.get(rank) if rank is not None else None
    if mine is not None and rank is not None:
        key = _key(mine, rings[rank])
    elif rank is None and groups:
        key = max(groups, key=lambda k: (len(groups[k]), -min(groups[k])))
    else:
        return FlightVerdict(None, (), (), {})
    waiting = groups[key]
    target = next(rec for r in waiting if (rec := pending[r]) is not None)
    s, members = target.stream, key[1]
    behind, elsewhere = [], {}
    for r in range(nranks):
        log, rec = rings.get(r), pending.get(r)
        if r in waiting or r in finished:
            continue
        if rec is not None:
            elsewhere[r] = rec
        if log is None:
            behind.append(r)
        elif target.op in _COLLECTIVE:
            if s and log.members[s] != members:
                continue  # no member of that communicator
            if log.counters[s] < target.seq:  # (the counters outlive the records)
                behind.append(r)
        elif rec is None:
            behind.append(r)
    return FlightVerdict(target, tuple(waiting), tuple(behind), elsewhere)


def _ranks(rs: Iterable[int]) -> str:
    rs = sorted(rs)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    return "ranks " + ", ".join(str(r) for r in rs[:-1]) + f" and {rs[-1]}"


def flight_lines(
    rings: dict[int, FlightLog], nranks: int, now: float, finished: Collection[int] = ()
) -> list[str]:
    """The report's lines from the rings: who is in which call since when, and each rank's
    last completed and pending call.

    Parameters
    ----------
    rings : dict
        Rank -> its ring.
    nranks : int
        The job's ranks.
    now : float
        ``time.time()`` of the report (the "since" of pending calls).
    finished : collection of int, optional
        Ranks that ended (behind nobody).

    Returns
    -------
    list of str
        Unindented lines; empty when no rank has a ring.
    """
    if not rings:
        return []
    lines = []
    groups: dict[tuple[int, int, str, int], list[int]] = {}
    for r, ring in sorted(rings.items()):
        if (rec := ring.pending()) is not None:
            groups.setdefault(_key(rec, ring), []).append(r)
    for waiting in sorted(groups.values(), key=lambda g: (-len(g), g)):
        v = flight_verdict(rings, nranks, waiting[0], finished)
        assert v.target is not None
        since = now - min(p.t_start for w in waiting if (p := rings[w].pending()) is not None)
        head = f"{_ranks(v.waiting)} {'is' if len(v.waiting) == 1 else 'are'} in "
        head += f"{v.target.describe()} since {since:.1f} s"
        lasts = []
        for r in v.behind:
            done = rings[r].last_completed() if r in rings else None
            lasts.append(
                f"rank {r} last completed {done.describe()}"
                if done is not None
                else f"rank {r} completed no recorded call"
            )
        lines.append("; ".join([*lasts, head]))
    for r in range(nranks):
        log = rings.get(r)
        if log is None:
            lines.append(f"  rank {r}: no flight record (it never started, or not on this host)")
            continue
        done, rec = log.last_completed(), log.pending()
        words = f"last completed {done.describe()}" if done else "no call completed"
        if rec is not None and rec.state == "failed":
            words += f"; failed in {rec.describe()} after {rec.t_end - rec.t_start:.1f} s"
        elif rec is not None:
            words += f"; in {rec.describe()} since {now - rec.t_start:.1f} s"
        if rec is not None:
            if rec.nbytes:
                words += f" ({rec.nbytes} B {rec.dtype})".replace(" )", ")")
        else:
            words += "; in no recorded call (its own code)"
        lines.append(f"  rank {r}: {words}")
    return lines


def write_flight_json(
    logs: Path, rings: dict[int, FlightLog], nranks: int, verdict: FlightVerdict
) -> Path | None:
    """Write every rank's ring and the verdict to ``flight.json`` in ``logs``.

    Parameters
    ----------
    logs : Path
        The log directory.
    rings : dict
        Rank -> its ring.
    nranks : int
        The job's ranks.
    verdict : FlightVerdict
        :func:`flight_verdict` of the rings.

    Returns
    -------
    Path
        The file written.
    """
    import json

    doc = {
        "ranks": nranks,
        "target": verdict.target.as_dict() if verdict.target else None,
        "waiting": list(verdict.waiting),
        "never_arrived": list(verdict.behind),
        "rings": {
            str(r): {
                "pid": log.pid,
                "capacity": log.capacity,
                "recorded": log.recorded,
                "records": [rec.as_dict() for rec in log.records],
            }
            for r, log in sorted(rings.items())
        },
    }
    path = logs / "flight.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
    except OSError:  # (a full disk must not cost the report)
        return None
    return path
