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
from pathlib import Path
from typing import IO, Any

from .cleanup import remove_stale_segments
from .command import LaunchCommand
from .report import load_deaths, load_done, load_errors, load_starts, write_json_atomic
from .stall import ask_for_stacks, process_state, read_rings
from .verdict import JobResult, summarise

__all__ = ["JobResult", "OutputForwarder", "console_ranks", "run_job"]

_POLL_S = 0.02
_SETTLE_S = 2.0  # how long the clean-up waits for exiting ranks to unmap their segments


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


class _StallWatch:
    """Declares the job stalled when no rank has completed a recorded call (the flight
    recorder's rings, :mod:`shmem.flight`) for ``after_s`` seconds, counted from the job's
    start while no call has completed. It never does once every rank has finished, or while
    a rank's failure is being reported (its error or death ends the job anyway)."""

    def __init__(self, logs: Path, nranks: int, after_s: float) -> None:
        self.logs, self.nranks, self.after_s = logs, nranks, after_s
        self.last = time.time()  # the latest completion seen (the start, at first)
        self._next_look = 0.0

    def stalled(self) -> bool:
        now = time.time()
        if now < self._next_look:
            return False
        self._next_look = now + min(0.25, self.after_s / 4)
        failed = load_errors(self.logs) or any(not d.terminated for d in load_deaths(self.logs))
        if failed or len(load_done(self.logs)) >= self.nranks:
            return False
        for log in read_rings(self.logs, self.nranks).values():
            done = log.last_completed()
            if done is not None and done.t_end > self.last:
                self.last = done.t_end
        return now - self.last > self.after_s

    def inspect(self) -> None:
        """What every unfinished rank of this host is doing (``/proc``), into ``stall.json``,
        and its Python stacks (``SIGUSR1``, into its ``rank.<r>.stack``), before the job is
        ended."""
        host = socket.gethostname()
        finished = load_done(self.logs) | {e.rank for e in load_errors(self.logs)}
        starts = load_starts(self.logs)
        here = {r: s.pid for r, s in starts.items() if s.host == host and r not in finished}
        states = {str(r): process_state(pid) for r, pid in here.items()}
        for r in range(self.nranks):
            if r not in starts:
                states[str(r)] = "never started (no start record)"
            elif r not in here and r not in finished:
                states[str(r)] = f"on {starts[r].host} (not inspected from {host})"
        awake = {r: pid for r, pid in here.items() if not states[str(r)].startswith("stopped")}
        stacks = [self.logs / f"rank.{r}.stack" for r in awake]
        ask_for_stacks(awake.values(), stacks, wait_s=1.0)
        write_json_atomic(
            self.logs / "stall.json",
            {"after_s": self.after_s, "last_completed": self.last, "states": states},
        )


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
    stall_timeout_s: float | None = None,
) -> JobResult:
    """Run the job to its end (or deadline, or stall) and return its exit code and summary
    lines. ``stall_timeout_s``: end it when no rank has completed a recorded call for that
    long (:class:`_StallWatch`)."""
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
        stalled = None  # (the stall timeout, when it ended the job), once it did
        stall_watch = _StallWatch(logs, nranks, stall_timeout_s) if stall_timeout_s else None
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
                if stall_watch is not None and stall_watch.stalled():
                    stall_watch.inspect()
                    stalled = (stall_watch.after_s, time.time())
                    _kill_job(proc, logs, dump_stacks=False)
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
    result = summarise(logs, nranks, rc, timed_out, timeout_s, watch.died, verbose, stalled=stalled)
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
