"""Per-rank records in the log directory, and the root-cause summary.

Files (all written atomically: a temporary file, then ``os.replace``):

* ``rank.<r>.start.json``: rank, world size, host, pid, start time;
* ``rank.<r>.error.json``: an uncaught exception or non-zero exit (exit code, traceback);
* ``rank.<r>.done.json``: a clean exit;
* ``rank.<r>.stack``: Python stacks dumped on ``SIGUSR1`` (the launcher asks on timeout);
* ``rank.<r>.log``: the rank's stdout and stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "ErrorRecord",
    "StartRecord",
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

    def write(self, log_dir: Path) -> None:
        write_json_atomic(log_dir / f"rank.{self.rank}.error.json", asdict(self))

    def headline(self) -> str:
        when = (
            time.strftime("%H:%M:%S", time.localtime(self.time))
            + f".{int(self.time * 1000) % 1000:03d}"
        )
        return (
            f"rank {self.rank} of {self.world_size} on {self.host} (pid {self.pid}) at {when}: "
            f"{self.exception} (exit code {self.exit_code})"
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
