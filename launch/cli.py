"""Command-line interface of ``python -m launch`` (also the ``shmem-launch`` script)."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .command import (
    LAUNCHERS,
    MPI_FLAVOURS,
    SCHEDULER_VARIABLES,
    LaunchOptions,
    UsageError,
    build_command,
    detect_mpi_flavour,
    resolve_launcher,
)
from .supervisor import console_ranks, run_job

__all__ = ["main", "parse_args"]

USAGE = (
    "python -m launch -n N [--config FILE] [--timeout S] [--stall-timeout S] [--log-dir DIR] "
    "[--env K=V]... "
    "[--hostfile F] [--mpi auto|mpich|openmpi] [--launcher auto|mpiexec|srun] "
    "[--allow-gpu-sharing] [--console 0|all|none|R,R] [--dry-run] (script.py | -m module) "
    "[args...]"
)
# options that take a value (so the target's start can be found without argparse's guesswork)
_VALUED = {
    "-n",
    "--np",
    "--config",
    "--timeout",
    "--stall-timeout",
    "--log-dir",
    "--env",
    "--hostfile",
    "--mpi",
    "--launcher",
    "--console",
    "--mpiexec",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch",
        usage=USAGE,
        description="Run an MPI job that never hangs when a rank fails, and say which rank "
        "failed and why.",
    )
    p.add_argument("-n", "--np", dest="nranks", type=int, required=True, help="number of ranks")
    p.add_argument("--config", help="TOML configuration for every rank (sets SHMEM_CONFIG)")
    p.add_argument("--timeout", type=float, help="kill the job after S seconds (exit code 124)")
    p.add_argument(
        "--stall-timeout",
        type=float,
        metavar="S",
        help="end the job when no rank has completed a collective or synchronisation call "
        "for S seconds, naming the rank the others wait for (exit code 125; default: "
        "[flight] stall_timeout_s, 0 = never)",
    )
    p.add_argument("--log-dir", help="keep one log file per rank and the error records here")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable on every rank (repeatable)",
    )
    p.add_argument("--hostfile", help="hosts for mpiexec")
    p.add_argument("--mpi", default="auto", choices=["auto", *MPI_FLAVOURS])
    p.add_argument("--launcher", default="auto", choices=["auto", *LAUNCHERS])
    p.add_argument("--mpiexec", help="mpiexec to use (default: the one next to this Python)")
    p.add_argument(
        "--allow-gpu-sharing",
        action="store_true",
        help="allow more ranks per node than GPUs (needed on a one-GPU machine)",
    )
    p.add_argument(
        "--console",
        default="0",
        help="ranks whose output reaches the console: 0 (default), all, none, or "
        "a list like 0,2; lines are tagged [r] when several ranks are shown",
    )
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("--verbose", action="store_true", help="also print mpiexec's own output")
    return p


def _split_target(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split launcher options from the target (``script.py ...`` or ``-m module ...``)."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "-m":
            return argv[:i], argv[i:]
        if not tok.startswith("-") or tok == "-":
            return argv[:i], argv[i:]
        if tok == "--":
            return argv[:i], argv[i + 1 :]
        i += 2 if tok in _VALUED else 1
    return argv, []


def parse_args(argv: list[str]) -> LaunchOptions:
    """Parse the command line into :class:`LaunchOptions` (raises ``SystemExit`` on errors)."""
    own, target = _split_target(argv)
    parser = _parser()
    ns = parser.parse_args(own)
    if not target or target == ["-m"]:
        parser.error("nothing to run (expected script.py or -m module after the options)")
    env: list[tuple[str, str]] = []
    for item in ns.env:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            parser.error(f"--env: invalid assignment (got {item!r}; expected NAME=VALUE)")
        env.append((key, value))
    if ns.timeout is not None and ns.timeout <= 0:
        parser.error(f"--timeout: invalid (got {ns.timeout}; expected seconds > 0)")
    if ns.stall_timeout is not None and not ns.stall_timeout >= 0:
        parser.error(
            f"--stall-timeout: invalid (got {ns.stall_timeout}; expected seconds > 0, or 0: never)"
        )
    return LaunchOptions(
        nranks=ns.nranks,
        target=tuple(target),
        config=ns.config,
        timeout_s=ns.timeout,
        log_dir=ns.log_dir,
        env=tuple(env),
        hostfile=ns.hostfile,
        mpi=ns.mpi,
        launcher=ns.launcher,
        allow_gpu_sharing=ns.allow_gpu_sharing,
        console=ns.console,
        dry_run=ns.dry_run,
        verbose=ns.verbose,
        mpiexec=ns.mpiexec,
        stall_timeout_s=ns.stall_timeout,
    )


def default_mpiexec() -> str:
    """The ``mpiexec`` next to this interpreter (``sys.prefix/bin``), never one from PATH."""
    return str(Path(sys.executable).parent / "mpiexec")


def job_environment(opts: LaunchOptions) -> dict[str, str]:
    """Variables every rank gets: the config file, GPU sharing, NVSHMEM settings, --env."""
    from shmem.config import load_config

    env: dict[str, str] = {}
    if opts.config:
        env["SHMEM_CONFIG"] = str(Path(opts.config).resolve())
    cfg = load_config(opts.config)  # validates the file before any rank starts
    for key, value in cfg.nvshmem.environment().items():
        env.setdefault(key, os.environ.get(key, value))
    if opts.allow_gpu_sharing:
        env["SHMEM_DEVICE_ALLOW_GPU_SHARING"] = "1"
    env.update(rendezvous_environment(opts, os.environ))
    env.update(dict(opts.env))
    return env


def rendezvous_environment(opts: LaunchOptions, environ: Mapping[str, str]) -> dict[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` for torch's ``env://`` init (rank 0 serves its
    store there), unless the user set them: rank 0's host (this machine, or the hostfile's
    first host) and a port free here. The ranks set ``RANK`` and the rest themselves."""
    env: dict[str, str] = {}
    if "MASTER_ADDR" not in environ:
        env["MASTER_ADDR"] = _first_host(opts.hostfile) or (
            socket.gethostname()
            if any(environ.get(v) for v in SCHEDULER_VARIABLES)
            else "127.0.0.1"
        )
    if "MASTER_PORT" not in environ:
        env["MASTER_PORT"] = str(free_port())
    return env


def free_port(tries: int = 64) -> int:
    """A TCP port free here and outside the kernel's ephemeral range, for rank 0's store.

    A port the kernel handed out (``bind(("", 0))``) is free when asked but back in the pool
    at once: the MPI library's and mpiexec's own sockets, made before torch's store binds it,
    can be given the same port (``EADDRINUSE`` in ``init_process_group``). The kernel never
    hands out a port outside ``ip_local_port_range``, so one of those that binds now stays
    free unless some other program asks for it by number. Falls back to the kernel's choice
    where no such port binds in ``tries`` draws."""
    low, high = _ephemeral_range()
    pool = [p for p in range(10000, 65536) if not low <= p <= high]
    pool = pool or [p for p in range(1024, 10000) if not low <= p <= high]  # (FreeBSD's range)
    draw = random.SystemRandom()
    for _ in range(tries if pool else 0):
        port = draw.choice(pool)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range: Linux's ``path``, else the BSDs' and macOS's
    ``net.inet.ip.portrange`` sysctls (FreeBSD's default 10000-65535, macOS's 49152-65535);
    where neither can be read, the union of Linux's default (32768-60999) and IANA's
    (49152-65535, Windows')."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path(path).read_text().split()
        return int(low), int(high)
    with contextlib.suppress(OSError, ValueError, IndexError, subprocess.SubprocessError):
        names = ["net.inet.ip.portrange.first", "net.inet.ip.portrange.last"]
        got = subprocess.run(
            ["sysctl", "-n", *names], capture_output=True, text=True, timeout=5, check=True
        ).stdout.split()
        first, last = int(got[0]), int(got[1])
        if 0 < first <= last <= 65535:
            return first, last
    return 32768, 65535


def _first_host(hostfile: str | None) -> str | None:
    """The first host a hostfile names (MPICH's ``host:n`` and Open MPI's ``host slots=n``)."""
    if not hostfile:
        return None
    with contextlib.suppress(OSError):
        for line in Path(hostfile).read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                return words[0].split(":", 1)[0]
    return None


def stall_timeout(opts: LaunchOptions) -> float | None:
    """The stall timeout in seconds (``--stall-timeout``, else ``[flight] stall_timeout_s``
    of the job's configuration), or None for none; it needs the flight recorder on."""
    from shmem.config import load_config

    cfg = load_config(opts.config, env={**os.environ, **dict(opts.env)})  # as the ranks see it
    seconds = cfg.flight.stall_timeout_s if opts.stall_timeout_s is None else opts.stall_timeout_s
    if seconds and not cfg.flight.records:
        raise UsageError(
            f"launch: a stall timeout ({seconds:g} s) needs the flight recorder, which "
            "[flight] records = 0 turns off (expected records > 0, or no stall timeout)"
        )
    return seconds or None


def resolve(opts: LaunchOptions) -> tuple[str, str, str]:
    """(mpiexec path, MPI flavour, launcher) for this machine."""
    launcher = resolve_launcher(opts.launcher, os.environ, shutil.which("srun") is not None)
    mpiexec = opts.mpiexec or default_mpiexec()
    if launcher == "srun":
        return mpiexec, opts.mpi if opts.mpi != "auto" else "mpich", launcher
    if not os.path.exists(mpiexec):
        raise UsageError(
            f"launch: no mpiexec at {mpiexec} (expected the one installed next to this Python "
            "by 'pip install mpich'; or pass --mpiexec PATH)"
        )
    flavour = opts.mpi
    if flavour == "auto":
        try:
            text = subprocess.run(
                [mpiexec, "--version"], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"launch: cannot run {mpiexec} --version ({exc})") from None
        flavour = detect_mpi_flavour(text.stdout + text.stderr)
    return mpiexec, flavour, launcher


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the job's exit code (124 on timeout, 125 on a stall, 2 on usage
    errors)."""
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        mpiexec, flavour, launcher = resolve(opts)
        cmd = build_command(
            opts,
            python=sys.executable,
            mpiexec=mpiexec,
            mpi_flavour=flavour,
            launcher=launcher,
            job_env=job_environment(opts),
            is_root=os.geteuid() == 0,
            local_cores=len(os.sched_getaffinity(0)),
            environ=os.environ,
        )
        console = console_ranks(opts.console, opts.nranks)
        stall_s = stall_timeout(opts)
    except (UsageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if opts.dry_run:
        print(cmd.shell())
        return 0
    result = run_job(
        cmd,
        nranks=opts.nranks,
        log_dir=opts.log_dir,
        timeout_s=opts.timeout_s,
        console=console,
        verbose=opts.verbose,
        stall_timeout_s=stall_s,
    )
    for line in result.summary:
        print(line, file=sys.stderr)
    sys.stderr.flush()
    return result.exit_code
