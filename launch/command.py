"""Building the job's command line: pure functions, no MPI, no processes.

:func:`build_command` turns resolved :class:`LaunchOptions` into an argv and the environment
variables the job needs, for MPICH Hydra ``mpiexec``, Open MPI ``mpiexec`` or Slurm ``srun``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from shmem.errors import LaunchUsageError

UsageError = LaunchUsageError  # the name launch has always used

__all__ = [
    "LAUNCHERS",
    "MPI_FLAVOURS",
    "OPENMPI_SANDBOX_ENV",
    "OPENMPI_SIMULATED_NODES_ENV",
    "SCHEDULER_VARIABLES",
    "LaunchCommand",
    "LaunchOptions",
    "UsageError",
    "build_command",
    "detect_mpi_flavour",
    "openmpi_environment",
    "resolve_launcher",
]

MPI_FLAVOURS = ("mpich", "openmpi")
LAUNCHERS = ("mpiexec", "srun")

# Open MPI settings, each applied only where it is needed (openmpi_environment):
# Open MPI refuses to run as root without these two.
OPENMPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# More ranks than the machine's cores: Open MPI refuses to place them otherwise.
OPENMPI_OVERSUBSCRIBE_ENV = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
# A one-machine sandbox: skip the slow OFI transport probe (about 1 s a launch) and the UCX
# one-sided component (an error line per window where no UCX device exists). Never on a
# cluster job: UCX one-sided is how the off-node RMA path moves data there.
OPENMPI_SANDBOX_ENV = {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_osc": "^ucx"}
OPENMPI_ENV = {**OPENMPI_ROOT_ENV, **OPENMPI_OVERSUBSCRIBE_ENV, **OPENMPI_SANDBOX_ENV}
# Nodes simulated on one machine (SHMEM_HEAP_NODE_SPLIT other than "node"): the ranks talk over
# TCP on the loopback, as between real nodes. Over the sm transport (no single-copy mechanism
# in a container) Open MPI 5.0.11 emulates one-sided operations with active messages, and a
# target keeps about 1 KiB for every Get or Put toward it beyond ~48 in flight while it is not
# in MPI: 530 MiB a round of the strided RMA test at 4 ranks (docs/reliability.md).
OPENMPI_SIMULATED_NODES_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"}
# Variables that mean "inside a batch scheduler's allocation": a real cluster job.
SCHEDULER_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")


def openmpi_environment(
    opts: LaunchOptions, *, is_root: bool, local_cores: int | None, environ: Mapping[str, str]
) -> dict[str, str]:
    """The Open MPI settings this job needs, and only those.

    * Running as root: :data:`OPENMPI_ROOT_ENV`.
    * One machine (no ``--hostfile`` and no scheduler allocation): oversubscription when
      ``nranks`` exceeds ``local_cores``, and :data:`OPENMPI_SANDBOX_ENV`; with nodes
      simulated (``[heap] node_split`` not ``node``: the config file, the environment or
      ``--env``), the TCP transport instead (:data:`OPENMPI_SIMULATED_NODES_ENV`).
    * A cluster job (a hostfile, or inside Slurm/PBS/LSF/Flux): no transport setting at all.

    A variable already set in ``environ`` is left to the user's value.
    """
    env: dict[str, str] = {}
    if is_root:
        env.update(OPENMPI_ROOT_ENV)
    cluster = bool(opts.hostfile) or any(environ.get(v) for v in SCHEDULER_VARIABLES)
    if not cluster:
        if local_cores is not None and opts.nranks > local_cores:
            env.update(OPENMPI_OVERSUBSCRIBE_ENV)
        env.update(OPENMPI_SANDBOX_ENV)
        if _simulated_nodes(opts, environ):
            env.update(OPENMPI_SIMULATED_NODES_ENV)
    return {k: v for k, v in env.items() if k not in environ}


def _simulated_nodes(opts: LaunchOptions, environ: Mapping[str, str]) -> bool:
    """Whether the ranks will split one machine into nodes (``[heap] node_split`` other than
    ``node``, as the ranks resolve it: the config file, the environment, ``--env``). An
    invalid value is the ranks' to report: no transport choice rests on it."""
    from shmem.config import load_config
    from shmem.errors import ConfigError

    try:
        cfg = load_config(opts.config, env={**environ, **dict(opts.env)})
    except (ConfigError, OSError):
        return False
    return cfg.heap.node_split != "node"


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for (after argument parsing)."""

    nranks: int
    target: tuple[str, ...]  # ("script.py", *args) or ("-m", "module", *args)
    config: str | None = None
    timeout_s: float | None = None
    log_dir: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    hostfile: str | None = None
    mpi: str = "auto"
    launcher: str = "auto"
    allow_gpu_sharing: bool = False
    console: str = "0"
    dry_run: bool = False
    verbose: bool = False
    mpiexec: str | None = None  # an explicit mpiexec (default: the one next to python)
    stall_timeout_s: float | None = None  # None: [flight] stall_timeout_s (0: never)


@dataclass(frozen=True)
class LaunchCommand:
    """The argv to run and the variables to add to the environment."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The command as one shell line, environment first (for ``--dry-run``)."""
        assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join([*assigns, *(shlex.quote(a) for a in self.argv)])


def detect_mpi_flavour(version_text: str) -> str:
    """``"mpich"`` or ``"openmpi"`` from ``mpiexec --version`` (or the MPI library version)."""
    text = version_text.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    raise UsageError(
        f"launch: cannot tell which MPI this is (got {version_text[:120]!r}; expected MPICH "
        "Hydra or Open MPI); pass --mpi mpich|openmpi"
    )


def resolve_launcher(requested: str, environ: Mapping[str, str], have_srun: bool) -> str:
    """``"mpiexec"`` or ``"srun"``. ``auto`` picks srun inside a Slurm allocation."""
    if requested in LAUNCHERS:
        return requested
    if requested != "auto":
        raise UsageError(
            f"launch: invalid --launcher (got {requested!r}; expected one of "
            f"{['auto', *LAUNCHERS]})"
        )
    in_allocation = bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))
    return "srun" if in_allocation and have_srun else "mpiexec"


def build_command(
    opts: LaunchOptions,
    *,
    python: str,
    mpiexec: str,
    mpi_flavour: str,
    launcher: str,
    job_env: Mapping[str, str],
    is_root: bool = False,
    local_cores: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchCommand:
    """The command that starts ``opts.nranks`` ranks of ``python -m launch.rank TARGET``.

    Parameters
    ----------
    opts : LaunchOptions
    python : str
        The interpreter every rank runs (the launcher's own).
    mpiexec : str
        The ``mpiexec`` next to that interpreter.
    mpi_flavour : {"mpich", "openmpi"}
    launcher : {"mpiexec", "srun"}
    job_env : mapping
        Variables every rank must see (forwarded explicitly, so remote nodes get them too).
    is_root, local_cores, environ
        Facts about the launching machine for :func:`openmpi_environment` (Open MPI only).
    """
    if opts.nranks < 1:
        raise UsageError(f"launch: invalid -n (got {opts.nranks}; expected >= 1)")
    if not opts.target or opts.target == ("-m",):
        raise UsageError("launch: nothing to run (expected script.py or -m module)")
    if mpi_flavour not in MPI_FLAVOURS:
        raise UsageError(f"launch: invalid MPI (got {mpi_flavour!r}; expected {MPI_FLAVOURS})")
    rank_cmd = (python, "-m", "launch.rank", *opts.target)
    env = dict(job_env)
    n = str(opts.nranks)
    if launcher == "srun":
        if opts.hostfile:
            raise UsageError(
                "launch: --hostfile does not apply to srun (Slurm places the ranks; use "
                "--launcher mpiexec to pass a hostfile)"
            )
        argv = ("srun", "-n", n, "--kill-on-bad-exit=1", "--export=ALL", *rank_cmd)
        return LaunchCommand(argv, env)
    if launcher != "mpiexec":
        raise UsageError(f"launch: invalid launcher (got {launcher!r}; expected {LAUNCHERS})")
    if mpi_flavour == "mpich":
        argv_list = [mpiexec, "-n", n]
        if opts.hostfile:
            argv_list += ["-f", opts.hostfile]
        for key in sorted(env):
            argv_list += ["-genv", key, env[key]]
        if opts.timeout_s:
            # Hydra's own backstop, in case the launcher itself is killed
            env["MPIEXEC_TIMEOUT"] = str(int(opts.timeout_s) + 30)
        return LaunchCommand((*argv_list, *rank_cmd), env)
    sandbox = openmpi_environment(
        opts, is_root=is_root, local_cores=local_cores, environ=environ or {}
    )
    env = {**sandbox, **env}
    argv_list = [mpiexec, "-n", n]
    if opts.hostfile:
        argv_list += ["--hostfile", opts.hostfile]
    for key in sorted(job_env):
        argv_list += ["-x", key]
    return LaunchCommand((*argv_list, *rank_cmd), env)
