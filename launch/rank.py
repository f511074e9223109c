"""``python -m launch.rank (script.py | -m module | -c code) [args...]``: one rank of a job.

Runs the target as ``__main__``. An uncaught exception (in the main thread or any other) or a
non-zero ``SystemExit`` writes an error record into the log directory, prints the traceback
headed ``rank r of N on host``, and aborts the whole job with ``MPI_Abort``, so no rank is
left waiting forever in a collective or in ``MPI_Finalize``.

Under the launcher (``SHMEM_LAUNCH_LOG_DIR`` set) the rank's stdout and stderr go to
``rank.<r>.log`` in that directory, ``SIGUSR1`` dumps its Python stacks to ``rank.<r>.stack``,
a fatal signal dumps them into the log (``faulthandler``), and the rank is bound to a GPU from
its node-local rank. ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are set
as torchrun sets them (where the user has not), for torch's ``env://`` init.

The monitor
-----------
Under the launcher the process mpiexec starts forks at once: the child is the rank (it
initialises MPI and runs the program), the parent only waits for it. When the child ends
without a Python exception (a signal, ``os._exit``) the parent writes ``rank.<r>.died.json``
with the exact status, stamped the moment ``waitpid`` returns, so the launcher names the rank
that died first, never one that mpiexec killed after it; then it exits with the child's own
code (128 + N for signal N). The child dies with the parent (``PR_SET_PDEATHSIG``), so
mpiexec's clean-up still ends it.

A rank failing with an error that has a ``failed_rank`` (``PeerFailedError``: a peer failed
first) is a consequence: its record names that peer, and it waits up to
``_CONSEQUENCE_GRACE_S`` for the peer's own record before aborting, so the peer's exception
and exit code, not the consequence, end up as the root cause.

A rank failing with a timeout that names the ranks it waited for (``SignalTimeoutError.peers``)
records them, and before aborting looks at those of its host: their state from ``/proc`` and
their Python stacks (``SIGUSR1``, up to ``_STACK_WAIT_S``), so the launcher can name the rank
everyone waited for and say what it was doing (:mod:`launch.stall`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from .gpu import choose_gpu, visible_gpus
from .report import (
    DeathRecord,
    ErrorRecord,
    ExitRecord,
    StartRecord,
    load_done,
    load_starts,
    write_json_atomic,
)
from .stall import (
    ask_for_stacks,
    flight_verdict,
    process_state,
    read_rings,
    timeouts_in,
    waited_for,
)

ENV_LOG_DIR = "SHMEM_LAUNCH_LOG_DIR"
ENV_GPU = "SHMEM_LAUNCH_GPU"

log = logging.getLogger("launch.rank")

_failing = threading.Lock()
_CONSEQUENCE_GRACE_S = 5.0  # how long a consequence waits for its cause's record
_STACK_WAIT_S = 1.0  # how long a rank that timed out waits for the stalled rank's stack dump
_CHAIN_GRACE_S = 1.0  # how long it waits for the waited-for rank's own record (if it has one)


class _Rank:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.rank = MPI.COMM_WORLD.Get_rank()
        self.size = MPI.COMM_WORLD.Get_size()
        self.host = socket.gethostname()
        env_dir = os.environ.get(ENV_LOG_DIR)
        self.log_dir = Path(env_dir) if env_dir else None

    def redirect_output(self) -> None:
        if self.log_dir is None:
            return
        path = self.log_dir / f"rank.{self.rank}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        stack = open(self.log_dir / f"rank.{self.rank}.stack", "w")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
        faulthandler.enable(file=sys.stderr, all_threads=True)  # fatal signals: into the log
        StartRecord(self.rank, self.size, self.host, os.getpid(), time.time()).write(self.log_dir)

    def fail(self, exc: BaseException, exit_code: int) -> NoReturn:
        """Record ``exc``, print it, and abort the job (never returns)."""
        with _failing:  # one failing thread records; any other waits for the abort
            tb = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc)))
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if isinstance(exc, SystemExit):
                what = f"SystemExit({int(exc.code) if isinstance(exc.code, int) else exc.code!r})"
            cause = self._cause_of(exc)
            waited = waited_for(exc) if cause < 0 else []
            timed_out = next(timeouts_in(exc), None) is not None
            inferred = not waited and cause < 0 and timed_out
            if inferred:  # a timeout that names nobody: whom the flight recorder says
                waited = self._never_arrived()
            rec = ErrorRecord(
                self.rank,
                self.size,
                self.host,
                os.getpid(),
                time.time(),
                exit_code,
                what,
                tb,
                cause,
                waited,
                self._look_at(waited),
                timed_out,
                "flight recorder" if inferred and waited else "",
            )
            if self.log_dir is not None:
                with contextlib.suppress(OSError):
                    rec.write(self.log_dir)
            sys.stderr.write(f"rank {self.rank} of {self.size} on {self.host}: {tb}")
            sys.stderr.flush()
            sys.stdout.flush()
            if cause >= 0 and self.log_dir is not None:
                self._await_cause(cause)
            elif waited and self.log_dir is not None:
                # a rank waited for may be waiting itself (a barrier's rounds, a chain of
                # ranks): let it record whom, so the launcher follows the chain to its end
                self._await_records(waited, _CHAIN_GRACE_S)
            self.MPI.COMM_WORLD.Abort(exit_code)
        os._exit(exit_code)  # pragma: no cover - Abort does not return

    def _cause_of(self, exc: BaseException) -> int:
        """The rank whose failure ``exc`` reports (``failed_rank``, or a ``failed_pid`` that
        is one of this job's rank processes), else -1."""
        cause = getattr(exc, "failed_rank", -1)
        pid = getattr(exc, "failed_pid", -1)
        unnamed = not isinstance(cause, int) or cause < 0
        if unnamed and isinstance(pid, int) and pid > 0 and self.log_dir is not None:
            starts = load_starts(self.log_dir).values()
            cause = next((s.rank for s in starts if s.pid == pid), -1)
        return cause if isinstance(cause, int) and 0 <= cause < self.size else -1

    def _look_at(self, ranks: list[int]) -> dict[str, str]:
        """What each of ``ranks`` on this host is doing (``/proc``), and its Python stacks
        dumped into its ``rank.<r>.stack`` (asked with SIGUSR1), before this rank's abort
        ends it: a rank this one timed out waiting for."""
        if not ranks or self.log_dir is None:
            return {}
        starts = load_starts(self.log_dir)
        here = {r: starts[r].pid for r in ranks if r in starts and starts[r].host == self.host}
        states = {str(r): process_state(pid) for r, pid in here.items()}
        awake = {r: pid for r, pid in here.items() if not states[str(r)].startswith("stopped")}
        mine: dict[int, int] = {}
        for r, pid in awake.items():  # one dump each; the state as seen before any dump
            first, states[str(r)] = self._first_to_ask(r, states[str(r)])
            if first:
                mine[r] = pid
        stacks = [self.log_dir / f"rank.{r}.stack" for r in awake]
        ask_for_stacks(mine.values(), stacks, wait_s=_STACK_WAIT_S)
        for r in ranks:
            if r not in starts:
                states[str(r)] = "never started (no start record)"
            elif r not in here:
                states[str(r)] = f"on {starts[r].host} (not inspected from {self.host})"
        return states

    def _never_arrived(self) -> list[int]:
        """The ranks the flight recorder says never arrived at the call this rank and the
        others wait in (the rings of this host's ranks: the others are not read here)."""
        if self.log_dir is None:
            return []
        with contextlib.suppress(Exception):
            rings = read_rings(self.log_dir, self.size)
            done = load_done(self.log_dir)
            behind = flight_verdict(rings, self.size, self.rank, finished=done).behind
            return [r for r in behind if r != self.rank]
        return []

    def _first_to_ask(self, rank: int, state: str) -> tuple[bool, str]:
        """Whether this rank is the first to ask ``rank`` for its stacks, and the state to
        report for it. The first asker leaves the state it read in a marker file before its
        ``SIGUSR1``; a later asker reports that one, not its own reading (``rank`` may be
        running its stack dump by then, which ``/proc`` shows as busy on a CPU)."""
        assert self.log_dir is not None
        marker = self.log_dir / f"rank.{rank}.stack.asked"
        draft = self.log_dir / f".rank.{rank}.stack.asked.{self.rank}"
        try:
            draft.write_text(state)
            os.link(draft, marker)  # atomic and exclusive: the marker has its content at once
        except FileExistsError:
            with contextlib.suppress(OSError):
                state = marker.read_text() or state
            return False, state
        except OSError:
            return False, state
        finally:
            with contextlib.suppress(OSError):
                draft.unlink()
        return True, state

    def _await_cause(self, cause: int) -> None:
        """Give the failed peer time to record its own error before this rank aborts the
        job (its abort would kill the peer mid-report)."""
        self._await_records([cause], _CONSEQUENCE_GRACE_S)

    def _await_records(self, ranks: list[int], grace_s: float) -> None:
        """Wait up to ``grace_s`` until each of ``ranks`` has recorded how it ended."""
        assert self.log_dir is not None
        kinds = ("error", "died", "done")
        progress = _heap_progress()
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            if all(
                any((self.log_dir / f"rank.{r}.{k}.json").exists() for k in kinds) for r in ranks
            ):
                return
            # the failed peer may still be telling this rank (a one-sided atomic off the
            # node): serve it, or it waits on us while we wait on its record
            with contextlib.suppress(Exception):
                progress()
            time.sleep(0.001)

    def global_exit(self, status: int, where: str) -> None:
        """shmem.global_exit's hook: record who ended the job (then it aborts)."""
        if self.log_dir is not None:
            ExitRecord(
                self.rank, self.size, self.host, os.getpid(), time.time(), status, where
            ).write(self.log_dir)

    def done(self, exit_code: int) -> None:
        if self.log_dir is not None:
            write_json_atomic(
                self.log_dir / f"rank.{self.rank}.done.json",
                {"rank": self.rank, "exit_code": exit_code, "time": time.time()},
            )

    def open_flight(self) -> None:
        """This rank's flight recorder, a ring file the launcher reads (:mod:`shmem.flight`),
        in place before the program runs (so its first calls, ``init`` too, are in it)."""
        from shmem import flight
        from shmem.config import load_config

        if self.log_dir is None:
            return
        path = self.log_dir / f"rank.{self.rank}.flight"
        records = load_config().flight.records
        try:
            ring = flight.FlightRecorder(records, path, rank=self.rank, world_size=self.size)
        except OSError as exc:  # the job runs on; its reports lack this rank's calls
            log.warning("rank %d: no flight recorder file (%s)", self.rank, exc)
            return
        flight.install(ring)

    def configure_logging(self) -> None:
        from shmem.config import load_config

        cfg = load_config()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s [{self.rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
            )
        )
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(cfg.log.level)

    def torch_environment(self, local_rank: int, local_size: int) -> None:
        """What torch's ``env://`` init reads, as torchrun sets it (the user's values win;
        ``MASTER_ADDR`` and ``MASTER_PORT`` come from the launcher)."""
        for key, value in (
            ("RANK", self.rank),
            ("WORLD_SIZE", self.size),
            ("LOCAL_RANK", local_rank),
            ("LOCAL_WORLD_SIZE", local_size),
        ):
            os.environ.setdefault(key, str(value))

    def bind_gpu(self) -> None:
        from shmem.config import load_config

        node = self.MPI.COMM_WORLD.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        local_rank, local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.torch_environment(local_rank, local_size)
        gpus = visible_gpus()
        allow = load_config().device.allow_gpu_sharing
        gpu = choose_gpu(local_rank, local_size, len(gpus), allow)
        if gpu is None:
            log.info(
                "rank %d (local %d/%d) -> CPU (no GPU visible)", self.rank, local_rank, local_size
            )
            return
        os.environ[ENV_GPU] = str(gpu)
        log.info(
            "rank %d (local %d/%d) -> GPU %d (%s)",
            self.rank,
            local_rank,
            local_size,
            gpu,
            gpus[gpu].pci_bus_id,
        )


def _user_frames(exc: BaseException) -> TracebackType | None:
    """The traceback without this module's and runpy's frames on top."""
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    return tb or exc.__traceback__


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        if exc.code == 0:
            return 0
        return (exc.code & 0xFF) or 1  # an exit status is one byte; 256 must still fail
    return 1  # sys.exit("message")


def _usage() -> NoReturn:
    sys.stderr.write("usage: python -m launch.rank (script.py | -m module | -c code) [args...]\n")
    raise SystemExit(2)


def _heap_progress() -> Any:
    """The open World's one-sided progress (a no-op without one)."""
    if "shmem" not in sys.modules:
        return lambda: None
    try:
        import shmem

        return shmem.get_world().heap.progress
    except Exception:
        return lambda: None


def _die_with_parent() -> None:
    """The rank process ends when its monitor does (mpiexec's clean-up kills the monitor)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _env_rank() -> int:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return -1


def _monitor(child: int, log_dir: Path) -> NoReturn:
    """The parent: wait for the rank process, record how it ended, exit with its code."""
    terminated: list[int] = []

    def forward(signum: int, frame: object) -> None:
        terminated.append(signum)
        with contextlib.suppress(OSError):
            os.kill(child, signum)

    for forwarded in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(forwarded, forward)
    signal.signal(signal.SIGUSR1, lambda s, f: os.kill(child, signal.SIGUSR1))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:  # pragma: no cover - reaped elsewhere: nothing to report
            os._exit(1)
    seen = time.time()
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else 0
    code = 128 + sig if sig else code
    if code != 0:
        start = next((s for s in load_starts(log_dir).values() if s.pid == child), None)
        rank = start.rank if start is not None else _env_rank()
        recorded = any(
            (log_dir / f"rank.{rank}.{kind}.json").exists() for kind in ("error", "done", "exit")
        )
        if rank >= 0 and not recorded:
            size = (
                start.world_size if start is not None else int(os.environ.get("PMI_SIZE", "0") or 0)
            )
            with contextlib.suppress(OSError):
                DeathRecord(
                    rank, size, socket.gethostname(), child, seen, code, sig, bool(terminated)
                ).write(log_dir)
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        _usage()
    log_dir = os.environ.get(ENV_LOG_DIR)
    if log_dir and hasattr(os, "fork"):
        parent = os.getpid()
        child = os.fork()
        if child:
            _monitor(child, Path(log_dir))
        _die_with_parent()
        if os.getppid() != parent:  # the monitor is already gone
            os._exit(1)
    rank = _Rank()
    rank.redirect_output()
    from shmem.job import on_global_exit  # (shmem is imported for the config anyway)

    on_global_exit(rank.global_exit)

    def thread_hook(hook_args: threading.ExceptHookArgs) -> None:
        if issubclass(hook_args.exc_type, SystemExit):
            return  # as in plain Python, SystemExit ends only its own thread
        exc = hook_args.exc_value or hook_args.exc_type()
        rank.fail(exc, 1)

    threading.excepthook = thread_hook

    def sys_hook(t: type[BaseException], e: BaseException, tb: TracebackType | None) -> None:
        rank.fail(e, 1)

    sys.excepthook = sys_hook
    code = 0
    try:
        rank.configure_logging()
        rank.open_flight()
        rank.bind_gpu()
        run(args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code:
            rank.fail(exc, code)
    except KeyboardInterrupt as exc:
        rank.fail(exc, 130)
    except BaseException as exc:
        rank.fail(exc, 1)
    rank.done(code)
    return code


def run(args: list[str]) -> Any:
    """Run ``script.py``, ``-m module`` or ``-c code`` as ``__main__`` with ``sys.argv`` set."""
    if args[0] == "-m":
        if len(args) < 2:
            _usage()
        sys.argv = [args[1], *args[2:]]
        return runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    if args[0] == "-c":
        if len(args) < 2:
            _usage()
        sys.argv = ["-c", *args[2:]]
        code = compile(args[1], "<string>", "exec")
        exec(code, {"__name__": "__main__"})  # the user's own -c program
        return None
    sys.argv = list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    return runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    sys.exit(main())
