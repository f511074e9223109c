"""What the launcher says when a job ends: the root cause of a failure (the rank that failed
first with its own error or end, or the rank everyone waited for when the others timed out
waiting), the ranks that stopped because of it, and the exit code the job ends with."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from shmem.flight import FlightLog

from .report import (
    DeathRecord,
    ErrorRecord,
    load_deaths,
    load_done,
    load_errors,
    load_exits,
    load_starts,
    parse_mpiexec_failures,
)
from .stall import flight_lines, flight_verdict, read_rings, stalled_ranks, write_flight_json

__all__ = ["STALL_EXIT", "TIMEOUT_EXIT", "JobResult", "root_cause", "summarise"]

TIMEOUT_EXIT = 124  # the launcher's --timeout ended the job (as timeout(1) says it)
STALL_EXIT = 125  # --stall-timeout: no rank completed a recorded call for that long
# a death is stamped when its monitor wakes: on a loaded node that can be after a peer
# recorded the error the death caused, so deaths get this much head start
_DEATH_LATENCY_S = 0.05
_STACK_LINES = 60  # of a stalled rank's stack dump, in the report


@dataclass
class JobResult:
    """How a job ended: its exit code, whether the launcher's deadline ended it, and the
    summary lines printed for it."""

    exit_code: int
    timed_out: bool
    summary: list[str] = field(default_factory=list)


def root_cause(
    logs: Path, errors: list[ErrorRecord], deaths: list[DeathRecord], rc: int
) -> JobResult:
    """The rank that failed first, with its own error or end, and the ranks that stopped
    because of it. Causes are errors that are not consequences of a peer's failure and
    deaths the launcher did not inflict; the earliest cause is the root cause. A timeout
    that names the ranks it waited for is a consequence of them: when the waits lead to a
    rank that did not fail (it stalled), that rank is the root cause."""
    nranks = max([e.world_size for e in errors] + [d.world_size for d in deaths] + [0])
    rings = read_rings(logs, nranks)
    waits = {e.rank: e.waited_for for e in errors if e.consequence_of < 0 and e.waited_for}
    done = load_done(logs)
    for e in errors:  # a timeout that named nobody: whoever never arrived at its call
        if e.consequence_of < 0 and e.timed_out and not e.waited_for:
            v = flight_verdict(rings, nranks, e.rank, finished=done)
            behind = [r for r in v.behind if r != e.rank]
            if behind:
                waits[e.rank] = behind
    own = [e for e in errors if e.consequence_of < 0 and e.rank not in waits]
    dead = [d for d in deaths if not d.terminated]
    stalled = stalled_ranks(waits, {e.rank for e in own} | {d.rank for d in dead})
    if stalled and not own and not dead:
        result = _stall_report(logs, errors, deaths, stalled, waits, rc)
        result.summary += _flight_section(logs, rings, nranks)
        return result
    causes: list[ErrorRecord | DeathRecord] = [*own, *dead]
    if not causes:
        causes = [e for e in errors if e.consequence_of < 0]
    every: list[ErrorRecord | DeathRecord] = [*errors, *deaths]

    def when(r: ErrorRecord | DeathRecord) -> tuple[float, int]:
        # a death is stamped when its monitor wakes, which on a loaded node can be after a
        # peer already recorded the error the death caused (an IPC import from the dead
        # rank, a failed exchange): deaths get that much head start
        return (r.time - (_DEATH_LATENCY_S if isinstance(r, DeathRecord) else 0.0), r.rank)

    root = min(causes or every, key=when)
    lines: list[str] = []
    if isinstance(root, ErrorRecord):
        lines.append(f"launch: job failed; root cause: {root.headline()}")
        lines.extend("  " + ln for ln in root.traceback.rstrip().splitlines())
        code = root.exit_code or rc or 1
    else:
        lines.append(
            f"launch: job failed; root cause: {root.headline()} died first: {root.how()} "
            "(no Python exception was recorded)"
        )
        lines.extend("  " + ln for ln in _fatal_report(logs / f"rank.{root.rank}.log"))
        code = root.exit_code
    lines += _others(errors, deaths, root)
    lines += _flight_section(logs, rings, nranks)
    return JobResult(code, False, lines)


def _flight_section(logs: Path, rings: dict[int, FlightLog], nranks: int) -> list[str]:
    """The report's flight recorder lines, and ``flight.json`` written (none without rings)."""
    if not rings:
        return []
    done = load_done(logs)
    lines = flight_lines(rings, nranks, time.time(), done)
    path = write_flight_json(logs, rings, nranks, flight_verdict(rings, nranks, finished=done))
    where = "flight.json in the log directory, which --log-dir keeps" if path else "no file"
    return [
        f"  flight recorder (each rank's last calls; all of them in {where}):",
        *("    " + ln.strip() for ln in lines),
    ]


def _others(errors: list[ErrorRecord], deaths: list[DeathRecord], root: object) -> list[str]:
    """The report's lines for the ranks that failed after the root cause."""
    lines = []
    for e in errors:
        if e is root:
            continue
        if e.consequence_of >= 0:
            lines.append(f"  stopped because of rank {e.consequence_of}: {e.headline()}")
        elif e.waited_for:
            whom = ", ".join(str(w) for w in e.waited_for)
            lines.append(f"  timed out waiting for rank {whom}: {e.headline()}")
        else:
            lines.append(f"  also failed: {e.headline()}")
    for d in deaths:
        if d is not root and not d.terminated:
            lines.append(f"  also died: {d.headline()}: {d.how()}")
    return lines


def _stall_report(
    logs: Path,
    errors: list[ErrorRecord],
    deaths: list[DeathRecord],
    stalled: list[int],
    waits: dict[int, list[int]],
    rc: int,
) -> JobResult:
    """The root cause when ranks timed out waiting for ranks that did not fail: each stalled
    rank, who waited for it, what it was doing (its state, its Python stacks)."""
    starts = load_starts(logs)
    # the ranks whose waits the flight recorder found (their timeout named nobody)
    inferred = {e.rank for e in errors if e.waited_how or (e.rank in waits and not e.waited_for)}
    errors = [replace(e, waited_for=waits[e.rank]) if e.rank in waits else e for e in errors]
    waiting = sorted((e for e in errors if e.waited_for), key=lambda e: (e.time, e.rank))
    nranks = waiting[0].world_size
    lines: list[str] = []
    for i, r in enumerate(stalled):
        s = starts.get(r)
        who = f"rank {r} of {nranks}" + (f" on {s.host} (pid {s.pid})" if s else "")
        by = ", ".join(str(w) for w in sorted(e.rank for e in waiting if r in e.waited_for))
        head = "launch: job failed; root cause:" if i == 0 else "  also stalled:"
        how = ""
        if all(e.rank in inferred for e in waiting if r in e.waited_for):
            how = " (it never arrived at their call, says the flight recorder)"
        lines.append(f"{head} {who} stalled: rank(s) {by} timed out waiting for it{how}")
        state = next((e.peer_states[str(r)] for e in waiting if str(r) in e.peer_states), "")
        lines.append(f"  what rank {r} was doing: {state or 'not inspected'}")
        stack = logs / f"rank.{r}.stack"
        dump = stack.read_text(errors="replace").strip() if stack.exists() else ""
        if dump:
            lines.append(f"  its Python stacks (rank.{r}.stack):")
            lines.extend("    " + ln for ln in dump.splitlines()[:_STACK_LINES])
    lines += _others(errors, deaths, None)
    return JobResult(waiting[0].exit_code or rc or 1, False, lines)


def _stall_stands(logs: Path, errors: list[ErrorRecord], at: float) -> bool:
    """Whether the stall declared at ``at`` is the job's end: no rank failed on its own
    before (that failure is the root cause). The ranks the launcher then ended are no
    failure (under Open MPI their monitors do not see its signal: their deaths look like
    their own)."""
    own_deaths = (d for d in load_deaths(logs) if d.time < at and not d.terminated)
    return not any(e.time < at for e in errors) and not any(own_deaths)


def _stall_timeout_report(logs: Path, nranks: int, after_s: float) -> JobResult:
    """The report of a job the stall timeout ended: the ranks that never arrived at the
    call the others wait in (the flight recorder), what each rank was doing (``stall.json``)
    and the stacks of the ranks behind (or of every rank when none is behind)."""
    rings = read_rings(logs, nranks)
    v = flight_verdict(rings, nranks, finished=load_done(logs))
    starts = load_starts(logs)
    try:
        states: dict[str, str] = json.loads((logs / "stall.json").read_text())["states"]
    except (OSError, ValueError, KeyError):
        states = {}
    head = f"launch: job stalled: no rank completed a recorded call for {after_s:g} s"
    head += f" (--stall-timeout {after_s:g})"
    lines: list[str] = []
    if v.behind and v.target is not None:
        r = v.behind[0]
        s = starts.get(r)
        where = f" on {s.host} (pid {s.pid})" if s else ""
        others = ", ".join(str(w) for w in v.waiting)
        lines.append(
            f"{head}; root cause: rank {r} of {nranks}{where} stalled: it never arrived at "
            f"{v.target.describe()}, which rank(s) {others} wait in"
        )
        shown = list(v.behind)
        for extra in v.behind[1:]:
            lines.append(f"  also never arrived: rank {extra}")
    else:
        why = (
            "no rank is in a recorded call (every rank is in its own code)"
            if v.target is None
            else f"every rank is in {v.target.describe()} (or past it)"
        )
        lines.append(f"{head}; no rank is behind the others: {why}")
        shown = list(range(nranks))
    for r in range(nranks):
        state = states.get(str(r), "not inspected")
        if r in v.waiting and v.target is not None:  # (a busy wait is no endless loop)
            state = f"waiting in {v.target.describe()}: {state.split(' (busy')[0]}"
        if r in shown or str(r) in states:
            lines.append(f"  what rank {r} was doing: {state}")
        stack = logs / f"rank.{r}.stack"
        dump = stack.read_text(errors="replace").strip() if stack.exists() else ""
        if r in shown and dump:
            lines.append(f"  its Python stacks (rank.{r}.stack):")
            lines.extend("    " + ln for ln in dump.splitlines()[:_STACK_LINES])
    lines += _flight_section(logs, rings, nranks)
    return JobResult(STALL_EXIT, False, lines)


def _fatal_report(log: Path, limit: int = 40) -> list[str]:
    """faulthandler's report of a fatal signal in a rank's log (empty when none)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    at = text.rfind("Fatal Python error")
    return text[at:].strip().splitlines()[:limit] if at >= 0 else []


def summarise(
    logs: Path,
    nranks: int,
    rc: int,
    timed_out: bool,
    timeout_s: float | None,
    died: dict[int, float],
    verbose: bool,
    stalled: tuple[float, float] | None = None,
) -> JobResult:
    """The job's exit code and summary lines, from the records in ``logs``: the root cause
    of a failure, the ranks still running at the deadline (``timed_out``), or the stalled
    job's report (``stalled``: the stall timeout and when it ended the job)."""
    errors = load_errors(logs)
    if stalled is not None and _stall_stands(logs, errors, stalled[1]):
        return _stall_timeout_report(logs, nranks, stalled[0])
    starts = load_starts(logs)
    done = load_done(logs)
    mpiexec_text = (logs / "mpiexec.log").read_text(errors="replace")
    lines: list[str] = []
    if timed_out:
        running = [r for r in range(nranks) if r not in done and r not in {e.rank for e in errors}]
        head = f"launch: job timed out after {timeout_s:g} s; rank(s) still running: {running}"
        v = flight_verdict(read_rings(logs, nranks), nranks, finished=done)
        if v.behind and v.target is not None:  # the flight recorder knows who held them up
            others = ", ".join(str(w) for w in v.waiting)
            head += (
                f"; root cause: rank(s) {', '.join(str(b) for b in v.behind)} never arrived at "
                f"{v.target.describe()}, which rank(s) {others} wait in"
            )
        lines.append(head)
        for r in running:
            s = starts.get(r)
            where = f" on {s.host} (pid {s.pid})" if s else " (never started)"
            lines.append(f"  rank {r}{where}")
            stack = logs / f"rank.{r}.stack"
            if stack.exists() and stack.stat().st_size:
                dump = stack.read_text(errors="replace").strip().splitlines()
                lines.extend("    " + ln for ln in dump[:40])
        lines += _flight_section(logs, read_rings(logs, nranks), nranks)
        return JobResult(TIMEOUT_EXIT, True, lines)
    exits = load_exits(logs)
    if exits:  # ended on purpose: whatever the other ranks recorded is a consequence
        first = exits[0]
        if first.status == 0:
            return JobResult(0, False, [f"launch: job ended: {first.headline()}"])
        return JobResult(
            first.status, False, [f"launch: job ended by global_exit: {first.headline()}"]
        )
    deaths = load_deaths(logs)
    if errors or deaths:
        return root_cause(logs, errors, deaths, rc)
    if rc != 0:
        by_pid = {s.pid: s for s in starts.values()}
        reported = [
            (r if r >= 0 else (by_pid[pid].rank if pid in by_pid else -1), pid, host, how)
            for r, pid, host, how in parse_mpiexec_failures(mpiexec_text)
        ]
        done_or_failed = done | {e.rank for e in errors}
        watched = sorted((t, r) for r, t in died.items() if r not in done_or_failed)
        earliest = [r for t, r in watched if t - watched[0][0] < 0.002] if watched else []
        named = [r for r, _, _, _ in reported if r >= 0]
        if len(earliest) > 1 and named and named[0] in earliest:
            earliest = [named[0]]  # a tie within 2 ms: mpiexec's report decides
        if earliest:
            r = earliest[0]
            s = starts[r]
            how = next((w for rr, _, _, w in reported if rr == r), None)
            how = how or f"mpiexec exit code {rc}"
            lines.append(
                f"launch: job failed; root cause: rank {r} of {nranks} on {s.host} "
                f"(pid {s.pid}) died first: {how} (no Python exception was recorded)"
            )
        elif named:
            r, pid, host, how = next(x for x in reported if x[0] >= 0)
            # the pid watcher saw no death (the rank died before it was watched, on a loaded
            # machine): mpiexec's first bad termination is the evidence, in the same words
            lines.append(
                f"launch: job failed; root cause: rank {r} of {nranks} on {host} (pid {pid}) "
                f"died first: {how} (as mpiexec reports; no Python exception was recorded)"
            )
        else:
            lines.append(f"launch: job failed: mpiexec exited with code {rc}; its output:")
            lines.extend("  " + ln for ln in mpiexec_text.strip().splitlines()[-20:])
        return JobResult(rc, False, lines)
    missing = [r for r in range(nranks) if r not in done]
    if missing:
        lines.append(f"launch: warning: rank(s) {missing} exited without a completion record")
    if verbose and mpiexec_text.strip():
        lines.append("launch: mpiexec output:")
        lines.extend("  " + ln for ln in mpiexec_text.strip().splitlines())
    return JobResult(0, False, lines)
