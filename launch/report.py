"""Per-rank records in the log directory, and the root-cause summary.

Files (all written atomically: a temporary file, then ``os.replace``):

* ``rank.<r>.start.json``: rank, world size, host, pid, start time;
* ``rank.<r>.error.json``: an uncaught exception or non-zero exit (exit code, traceback);
* ``rank.<r>.done.json``: a clean exit;
* ``rank.<r>.died.json``: an end without a Python exception (a signal, ``os._exit``), written
  by the rank's monitor process the moment the rank process ends;
* ``rank.<r>.flight``: the rank's flight recorder ring, its last calls (:mod:`shmem.flight`);
* ``flight.json``: every rank's ring and the launcher's verdict, after a failure or stall;
* ``rank.<r>.stack``: Python stacks dumped on ``SIGUSR1`` (the launcher asks on timeout, a
  rank that timed out waiting for it asks before it aborts the job);
* ``rank.<r>.log``: the rank's stdout and stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "DeathRecord",
    "ErrorRecord",
    "StartRecord",
    "load_deaths",
    "load_errors",
    "load_starts",
    "parse_mpiexec_failures",
    "write_json_atomic",
]


def write_json_atomic(path: Path, payload: dict[str, object]) -> None:
    """Write JSON so that a reader sees the whole file or none of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class StartRecord:
    rank: int
    world_size: int
    host: str
    pid: int
    time: float

    def write(self, log_dir: Path) -> None:
        write_json_atomic(log_dir / f"rank.{self.rank}.start.json", asdict(self))


@dataclass(frozen=True)
class ErrorRecord:
    rank: int
    world_size: int
    host: str
    pid: int
    time: float
    exit_code: int
    exception: str
    traceback: str
    consequence_of: int = -1  # the failed peer this rank stopped because of (-1: none)
    waited_for: list[int] = field(default_factory=list)  # the ranks its timeout waited for
    # what each waited-for rank of this host was doing when this rank gave up (/proc)
    peer_states: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False  # the error is (or came from) a timeout
    # how waited_for was found: "" (the timeout named them) or "flight recorder" (the
    # ranks that never arrived at the call this one waited in)
    waited_how: str = ""

    def write(self, log_dir: Path) -> None:
        write_json_atomic(log_dir / f"rank.{self.rank}.error.json", asdict(self))

    def headline(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size} on {self.host} (pid {self.pid}) at "
            f"{_when(self.time)}: {self.exception} (exit code {self.exit_code})"
        )


def _when(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


@dataclass(frozen=True)
class DeathRecord:
    """A rank process that ended without a Python exception, as its monitor saw it."""

    rank: int
    world_size: int
    host: str
    pid: int
    time: float
    exit_code: int  # the process's own code, or 128 + N for signal N (the shell convention)
    signal: int  # 0 when it exited
    terminated: bool  # the launcher or mpiexec ended it (a consequence, not a cause)

    def write(self, log_dir: Path) -> None:
        write_json_atomic(log_dir / f"rank.{self.rank}.died.json", asdict(self))

    def how(self) -> str:
        if self.signal:
            import signal as _signal

            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = "unknown"
            return f"killed by signal {self.signal} ({name})"
        return f"exited with code {self.exit_code}"

    def headline(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size} on {self.host} (pid {self.pid}) at "
            f"{_when(self.time)}"
        )


@dataclass(frozen=True)
class ExitRecord:
    """A rank that ended the whole job on purpose (``shmem.global_exit(status)``)."""

    rank: int
    world_size: int
    host: str
    pid: int
    time: float
    status: int  # the exit status the job ends with
    where: str  # the caller's file:line

    def write(self, log_dir: Path) -> None:
        write_json_atomic(log_dir / f"rank.{self.rank}.exit.json", asdict(self))

    def headline(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size} on {self.host} (pid {self.pid}) called "
            f"global_exit({self.status}) at {_when(self.time)} ({self.where})"
        )


def _load(log_dir: Path, pattern: str) -> list[dict[str, object]]:
    out = []
    for path in sorted(log_dir.glob(pattern)):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a half-written or foreign file: ignore it
    return out


def load_errors(log_dir: Path) -> list[ErrorRecord]:
    """Error records, earliest first."""
    records = [ErrorRecord(**d) for d in _load(log_dir, "rank.*.error.json")]  # type: ignore[arg-type]
    return sorted(records, key=lambda r: (r.time, r.rank))


def load_deaths(log_dir: Path) -> list[DeathRecord]:
    """Death records, earliest first."""
    records = [DeathRecord(**d) for d in _load(log_dir, "rank.*.died.json")]  # type: ignore[arg-type]
    return sorted(records, key=lambda r: (r.time, r.rank))


def load_exits(log_dir: Path) -> list[ExitRecord]:
    """global_exit records, earliest first."""
    records = [ExitRecord(**d) for d in _load(log_dir, "rank.*.exit.json")]  # type: ignore[arg-type]
    return sorted(records, key=lambda r: (r.time, r.rank))


def load_starts(log_dir: Path) -> dict[int, StartRecord]:
    recs = [StartRecord(**d) for d in _load(log_dir, "rank.*.start.json")]  # type: ignore[arg-type]
    return {r.rank: r for r in recs}


def load_done(log_dir: Path) -> set[int]:
    return {int(d["rank"]) for d in _load(log_dir, "rank.*.done.json")}  # type: ignore[call-overload]


_HYDRA_RANK = re.compile(r"(?:RANK\s+(\d+)\s+)?PID\s+(\d+)\s+RUNNING AT\s+(\S+)")
_HYDRA_SIGNAL = re.compile(r"KILLED BY SIGNAL:\s*(\d+)")
_HYDRA_EXIT_STRING = re.compile(r"EXIT STRING:.*\(signal (\d+)\)")
_HYDRA_EXIT = re.compile(r"EXIT CODE:\s*(\d+)")
_OMPI_SIGNAL = re.compile(
    r"process rank (\d+) with PID (\d+) on node (\S+) exited on\s+signal (\d+)", re.S
)
_OMPI_EXIT = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited with status (\d+)")


def parse_mpiexec_failures(text: str) -> list[tuple[int, int, str, str]]:
    """``(rank, pid, host, what)`` for each rank that MPICH Hydra or Open MPI reports dead.

    Hydra may name only the pid: the rank is then -1 (map it with the start records).
    """
    out: list[tuple[int, int, str, str]] = []
    blocks = text.split("BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES")
    for block in blocks[1:]:
        m = _HYDRA_RANK.search(block)
        if m is None:
            continue
        sig = _HYDRA_SIGNAL.search(block) or _HYDRA_EXIT_STRING.search(block)
        code = _HYDRA_EXIT.search(block)
        if sig:
            what = f"killed by signal {sig.group(1)}"
        else:
            what = f"exit code {code.group(1)}" if code else "terminated"
        rank = int(m.group(1)) if m.group(1) is not None else -1
        out.append((rank, int(m.group(2)), m.group(3), what))
    for m in _OMPI_SIGNAL.finditer(text):
        out.append((int(m.group(1)), int(m.group(2)), m.group(3), f"killed by signal {m.group(4)}"))
    for m in _OMPI_EXIT.finditer(text):
        out.append((int(m.group(1)), int(m.group(2)), m.group(3), f"exit code {m.group(4)}"))
    return out
