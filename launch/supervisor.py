"""Running a job: output forwarding, the deadline, rank-death detection and the summary."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .cleanup import remove_stale_segments
from .command import LaunchCommand
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

__all__ = ["JobResult", "OutputForwarder", "console_ranks", "run_job"]

TIMEOUT_EXIT = 124
_POLL_S = 0.02
_SETTLE_S = 2.0  # how long the clean-up waits for exiting ranks to unmap their segments
_DEATH_LATENCY_S = 0.05


def console_ranks(spec: str, nranks: int) -> set[int]:
    """Which ranks reach the console: ``"0"``, ``"all"``, ``"none"`` or ``"0,2,3"``."""
    if spec == "all":
        return set(range(nranks))
    if spec == "none":
        return set()
    try:
        ranks = {int(p) for p in spec.split(",") if p.strip()}
    except ValueError:
        ranks = {-1}
    if any(not 0 <= r < nranks for r in ranks):
        from .command import UsageError

        raise UsageError(
            f"launch: invalid --console (got {spec!r}; expected all, none, or ranks in "
            f"0..{nranks - 1} separated by commas)"
        )
    return ranks


class OutputForwarder:
    """Follows ``rank.<r>.log`` files and writes their complete lines to ``out``.

    Lines are tagged ``[r] `` when ``tag`` is true. A line is only written once its newline
    has arrived (or at the final drain), so tags never land mid-line.
    """

    def __init__(self, log_dir: Path, ranks: set[int], out: IO[str], tag: bool) -> None:
        self._log_dir = log_dir
        self._ranks = sorted(ranks)
        self._out = out
        self._tag = tag
        self._pos = dict.fromkeys(self._ranks, 0)
        self._partial = dict.fromkeys(self._ranks, b"")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="launch-output", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _emit(self, rank: int, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace")
        self._out.write(f"[{rank}] {text}\n" if self._tag else f"{text}\n")

    def poll(self, final: bool = False) -> None:
        for r in self._ranks:
            path = self._log_dir / f"rank.{r}.log"
            try:
                with path.open("rb") as fh:
                    fh.seek(self._pos[r])
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            if not chunk and not (final and self._partial[r]):
                continue
            self._pos[r] += len(chunk)
            data = self._partial[r] + chunk
            *lines, rest = data.split(b"\n")
            for line in lines:
                self._emit(r, line)
            if final and rest:
                self._emit(r, rest)
                rest = b""
            self._partial[r] = rest
        self._out.flush()

    def _loop(self) -> None:
        while not self._stop.wait(_POLL_S):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll(final=True)


@dataclass
class JobResult:
    exit_code: int
    timed_out: bool
    summary: list[str] = field(default_factory=list)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0): check its state
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class _DeathWatch:
    """Records when each local rank process exits without a done or error record.

    A thread waits on Linux pidfds (``os.pidfd_open`` + ``select.poll``), so each exit is
    seen as it happens: the first rank to die is told apart from the ranks mpiexec kills in
    its clean-up a moment later. Without pidfds it falls back to polling ``kill(pid, 0)``.
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._host = socket.gethostname()
        self.died: dict[int, float] = {}
        self._fds: dict[int, int] = {}  # fd -> rank
        self._watched: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="launch-deaths", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def _refresh(self, poller: select.poll) -> None:
        for rank, start in load_starts(self._log_dir).items():
            if rank in self._watched or start.host != self._host:
                continue
            self._watched.add(rank)
            try:
                fd = os.pidfd_open(start.pid)
            except (AttributeError, OSError):
                if not _pid_alive(start.pid):
                    self.died.setdefault(rank, time.monotonic())
                continue
            self._fds[fd] = rank
            poller.register(fd, select.POLLIN)

    def _loop(self) -> None:
        poller = select.poll()
        last_refresh = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_refresh > 0.05:
                self._refresh(poller)
                last_refresh = now
            for fd, _ in poller.poll(20):
                seen = time.monotonic()
                poller.unregister(fd)
                self.died.setdefault(self._fds[fd], seen)


def _kill_job(proc: subprocess.Popen[bytes], log_dir: Path, dump_stacks: bool) -> None:
    host = socket.gethostname()
    finished = load_done(log_dir) | {e.rank for e in load_errors(log_dir)}
    # ranks that already exited are skipped: their pid may belong to another process now
    pids = [s.pid for r, s in load_starts(log_dir).items() if s.host == host and r not in finished]
    if dump_stacks:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)
    for sig, grace in ((signal.SIGTERM, 1.5), (signal.SIGKILL, 0.0)):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(_POLL_S)
        if proc.poll() is not None and not any(_pid_alive(p) for p in pids):
            break


def _remove_segments(logs: Path, job_started: float) -> tuple[int, int]:
    """Remove the MPI segments the job's dead ranks left: ``(files, bytes)``. Ranks still
    exiting when mpiexec has gone still map theirs: those are looked at again while any
    of this host's ranks is alive, for at most ``_SETTLE_S``."""
    host = socket.gethostname()
    pids = [s.pid for s in load_starts(logs).values() if s.host == host]
    return remove_stale_segments(
        job_started, settle_s=_SETTLE_S, exiting=lambda: any(_pid_alive(p) for p in pids)
    )


class _Terminated(BaseException):
    """The launcher received SIGTERM or SIGHUP while its job runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated(signum)


def _catch_termination() -> dict[int, Any]:
    """Turn SIGTERM and SIGHUP into :class:`_Terminated` (main thread only); the previous
    handlers, to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}


def run_job(
    cmd: LaunchCommand,
    *,
    nranks: int,
    log_dir: str | None,
    timeout_s: float | None,
    console: set[int],
    out: IO[str] | None = None,
    verbose: bool = False,
) -> JobResult:
    """Run the job to its end (or deadline) and return its exit code and summary lines."""
    out = sys.stdout if out is None else out
    keep_logs = log_dir is not None
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="launch-"))
    logs.mkdir(parents=True, exist_ok=True)
    for stale in logs.glob("rank.*"):
        stale.unlink()
    env = {**os.environ, **cmd.env, "SHMEM_LAUNCH_LOG_DIR": str(logs.resolve())}
    env.setdefault("PYTHONUNBUFFERED", "1")
    forwarder = OutputForwarder(logs, console, out, tag=len(console) > 1)
    mpiexec_log = logs / "mpiexec.log"
    start = time.monotonic()
    job_started = time.time()
    with mpiexec_log.open("wb") as mlog:
        proc = subprocess.Popen(
            cmd.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=mlog,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        forwarder.start()
        watch = _DeathWatch(logs)
        watch.start()
        timed_out = False
        terminated = 0  # the signal that stopped the launcher, if one did
        # mpiexec runs in its own session: a launcher stopped by SIGTERM (``timeout``) or
        # SIGHUP (a closed terminal) must take the job down itself, or it is orphaned
        previous = _catch_termination()
        try:
            while proc.poll() is None:
                time.sleep(_POLL_S)
                if timeout_s and time.monotonic() - start > timeout_s:
                    timed_out = True
                    _kill_job(proc, logs, dump_stacks=True)
                    break
        except KeyboardInterrupt:
            _kill_job(proc, logs, dump_stacks=False)
            terminated = signal.SIGINT
        except _Terminated as stop:
            _kill_job(proc, logs, dump_stacks=False)
            terminated = stop.signum
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if proc.poll() is None:
                _kill_job(proc, logs, dump_stacks=False)
            proc.wait()
            watch.stop()
            forwarder.stop()
    if terminated:  # the killed ranks never unlinked their MPI shared memory either
        _remove_segments(logs, job_started)
        if not keep_logs:
            shutil.rmtree(logs, ignore_errors=True)
        if terminated == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + terminated)  # the shell's code for a signal
    rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    result = _summarise(logs, nranks, rc, timed_out, timeout_s, watch, verbose)
    if result.exit_code != 0:  # dead ranks never unlinked their MPI shared memory
        removed, freed = _remove_segments(logs, job_started)
        if removed:
            result.summary.append(
                f"launch: removed {removed} shared-memory segment(s) ({freed / 2**20:.1f} MiB) "
                "that failed ranks left in /dev/shm"
            )
    if not keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    return result


def _root_cause(
    logs: Path, errors: list[ErrorRecord], deaths: list[DeathRecord], rc: int
) -> JobResult:
    """The rank that failed first, with its own error or end, and the ranks that stopped
    because of it. Causes are errors that are not consequences of a peer's failure and
    deaths the launcher did not inflict; the earliest cause is the root cause."""
    causes: list[ErrorRecord | DeathRecord] = [e for e in errors if e.consequence_of < 0]
    causes += [d for d in deaths if not d.terminated]
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
    for e in errors:
        if e is root:
            continue
        if e.consequence_of >= 0:
            lines.append(f"  stopped because of rank {e.consequence_of}: {e.headline()}")
        else:
            lines.append(f"  also failed: {e.headline()}")
    for d in deaths:
        if d is not root and not d.terminated:
            lines.append(f"  also died: {d.headline()}: {d.how()}")
    return JobResult(code, False, lines)


def _fatal_report(log: Path, limit: int = 40) -> list[str]:
    """faulthandler's report of a fatal signal in a rank's log (empty when none)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    at = text.rfind("Fatal Python error")
    return text[at:].strip().splitlines()[:limit] if at >= 0 else []


def _summarise(
    logs: Path,
    nranks: int,
    rc: int,
    timed_out: bool,
    timeout_s: float | None,
    watch: _DeathWatch,
    verbose: bool,
) -> JobResult:
    errors = load_errors(logs)
    starts = load_starts(logs)
    done = load_done(logs)
    mpiexec_text = (logs / "mpiexec.log").read_text(errors="replace")
    lines: list[str] = []
    if timed_out:
        running = [r for r in range(nranks) if r not in done and r not in {e.rank for e in errors}]
        lines.append(
            f"launch: job timed out after {timeout_s:g} s; rank(s) still running: {running}"
        )
        for r in running:
            s = starts.get(r)
            where = f" on {s.host} (pid {s.pid})" if s else " (never started)"
            lines.append(f"  rank {r}{where}")
            stack = logs / f"rank.{r}.stack"
            if stack.exists() and stack.stat().st_size:
                dump = stack.read_text(errors="replace").strip().splitlines()
                lines.extend("    " + ln for ln in dump[:40])
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
        return _root_cause(logs, errors, deaths, rc)
    if rc != 0:
        by_pid = {s.pid: s for s in starts.values()}
        reported = [
            (r if r >= 0 else (by_pid[pid].rank if pid in by_pid else -1), pid, host, how)
            for r, pid, host, how in parse_mpiexec_failures(mpiexec_text)
        ]
        done_or_failed = done | {e.rank for e in errors}
        watched = sorted((t, r) for r, t in watch.died.items() if r not in done_or_failed)
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
