"""The launcher's pure parts: argument parsing, command lines, GPU choice, report parsing."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from launch.cli import _split_target, parse_args
from launch.command import (
    OPENMPI_ENV,
    OPENMPI_SANDBOX_ENV,
    OPENMPI_SIMULATED_NODES_ENV,
    LaunchOptions,
    UsageError,
    build_command,
    detect_mpi_flavour,
    openmpi_environment,
    resolve_launcher,
)
from launch.gpu import GpuBindingError, choose_gpu
from launch.report import ErrorRecord, load_errors, parse_mpiexec_failures
from launch.supervisor import OutputForwarder, console_ranks

PY = "/venv/bin/python"
MPIEXEC = "/venv/bin/mpiexec"


def _build(
    opts: LaunchOptions,
    flavour: str = "mpich",
    launcher: str = "mpiexec",
    env: dict[str, str] | None = None,
) -> tuple[tuple[str, ...], dict[str, str]]:
    cmd = build_command(
        opts, python=PY, mpiexec=MPIEXEC, mpi_flavour=flavour, launcher=launcher, job_env=env or {}
    )
    return cmd.argv, cmd.env


def test_mpich_command() -> None:
    opts = LaunchOptions(nranks=4, target=("job.py", "--x", "1"), hostfile="hosts", timeout_s=60)
    argv, env = _build(opts, env={"SHMEM_CONFIG": "/c.toml", "A": "b"})
    assert argv == (
        MPIEXEC,
        "-n",
        "4",
        "-f",
        "hosts",
        "-genv",
        "A",
        "b",
        "-genv",
        "SHMEM_CONFIG",
        "/c.toml",
        PY,
        "-m",
        "launch.rank",
        "job.py",
        "--x",
        "1",
    )
    assert env["MPIEXEC_TIMEOUT"] == "90"  # Hydra's backstop, beyond our own deadline


def test_openmpi_command() -> None:
    opts = LaunchOptions(nranks=2, target=("-m", "pkg.mod", "-v"), hostfile="hosts")
    argv, env = _build(opts, flavour="openmpi", env={"X": "1"})
    assert argv == (
        MPIEXEC,
        "-n",
        "2",
        "--hostfile",
        "hosts",
        "-x",
        "X",
        PY,
        "-m",
        "launch.rank",
        "-m",
        "pkg.mod",
        "-v",
    )
    assert env["X"] == "1"
    # a hostfile is a cluster job: no sandbox transport setting (UCX one-sided stays on)
    assert not set(env) & set(OPENMPI_ENV)


def _sandbox(
    nranks: int,
    *,
    is_root: bool,
    local_cores: int,
    environ: dict[str, str],
    hostfile: str | None = None,
) -> dict[str, str]:
    opts = LaunchOptions(nranks=nranks, target=("a.py",), hostfile=hostfile)
    return openmpi_environment(opts, is_root=is_root, local_cores=local_cores, environ=environ)


def test_openmpi_settings_only_where_needed() -> None:
    # a laptop-style sandbox: as root, 4 ranks on 2 cores
    env = _sandbox(4, is_root=True, local_cores=2, environ={})
    assert env == OPENMPI_ENV
    # an ordinary user with a core per rank: no root pair, no oversubscription
    env = _sandbox(2, is_root=False, local_cores=8, environ={})
    assert env == {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_osc": "^ucx"}
    # inside a Slurm allocation or with a hostfile: never osc=^ucx, btl, oversubscribe
    for environ, hostfile in (({"SLURM_JOB_ID": "7"}, None), ({}, "hosts")):
        env = _sandbox(64, is_root=True, local_cores=2, environ=environ, hostfile=hostfile)
        assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    # the user's own settings win
    env = _sandbox(4, is_root=True, local_cores=2, environ={"OMPI_MCA_osc": "pt2pt"})
    assert "OMPI_MCA_osc" not in env


@pytest.mark.parametrize("split", ["rank", "2"])
def test_simulated_nodes_on_open_mpi_talk_over_tcp(split: str, tmp_path: Path) -> None:
    """Across simulated nodes Open MPI's sm transport emulates RMA and its targets grow
    (docs/reliability.md): the ranks use TCP on the loopback there, from the environment,
    --env or the config file; one node keeps the sandbox's transports, a cluster job and the
    user's own btl setting are left alone."""
    config = tmp_path / "job.toml"
    config.write_text(f'[heap]\nnode_split = "{split}"\n')
    opts = LaunchOptions(nranks=2, target=("a.py",), config=str(config))
    env = openmpi_environment(opts, is_root=False, local_cores=8, environ={})
    assert env == {**OPENMPI_SANDBOX_ENV, **OPENMPI_SIMULATED_NODES_ENV}
    env = _sandbox(4, is_root=False, local_cores=8, environ={"SHMEM_HEAP_NODE_SPLIT": split})
    assert env == {**OPENMPI_SANDBOX_ENV, **OPENMPI_SIMULATED_NODES_ENV}
    opts = LaunchOptions(nranks=2, target=("a.py",), env=(("SHMEM_HEAP_NODE_SPLIT", split),))
    env = openmpi_environment(opts, is_root=False, local_cores=8, environ={})
    assert env["OMPI_MCA_btl"] == "self,tcp" and env["OMPI_MCA_btl_tcp_if_include"] == "lo"
    for environ in ({"SHMEM_HEAP_NODE_SPLIT": "node"}, {}):
        assert _sandbox(2, is_root=False, local_cores=8, environ=environ) == OPENMPI_SANDBOX_ENV
    environ = {"SHMEM_HEAP_NODE_SPLIT": split, "SLURM_JOB_ID": "3"}
    assert _sandbox(2, is_root=False, local_cores=8, environ=environ) == {}
    environ = {"SHMEM_HEAP_NODE_SPLIT": split, "OMPI_MCA_btl": "self,sm"}
    assert "OMPI_MCA_btl" not in _sandbox(2, is_root=False, local_cores=8, environ=environ)


def test_build_command_applies_the_rule() -> None:
    opts = LaunchOptions(nranks=4, target=("a.py",))
    cmd = build_command(
        opts,
        python=PY,
        mpiexec=MPIEXEC,
        mpi_flavour="openmpi",
        launcher="mpiexec",
        job_env={},
        is_root=False,
        local_cores=16,
        environ={"PBS_JOBID": "1"},
    )
    assert not set(cmd.env) & set(OPENMPI_ENV)


def test_srun_command() -> None:
    argv, env = _build(LaunchOptions(nranks=8, target=("a.py",)), launcher="srun", env={"K": "v"})
    assert argv == (
        "srun",
        "-n",
        "8",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        PY,
        "-m",
        "launch.rank",
        "a.py",
    )
    assert env == {"K": "v"}
    with pytest.raises(UsageError, match="--hostfile does not apply to srun"):
        _build(LaunchOptions(nranks=2, target=("a.py",), hostfile="h"), launcher="srun")


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (LaunchOptions(nranks=0, target=("a.py",)), "invalid -n"),
        (LaunchOptions(nranks=2, target=()), "nothing to run"),
    ],
)
def test_build_rejects(opts: LaunchOptions, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        _build(opts)
    with pytest.raises(UsageError, match="invalid MPI"):
        _build(LaunchOptions(nranks=1, target=("a.py",)), flavour="lam")


def test_shell_line_quotes() -> None:
    cmd = build_command(
        LaunchOptions(nranks=1, target=("my job.py",)),
        python=PY,
        mpiexec=MPIEXEC,
        mpi_flavour="mpich",
        launcher="mpiexec",
        job_env={"V": "a b"},
    )
    assert cmd.shell().startswith("V='a b' /venv/bin/mpiexec -n 1 -genv V 'a b'")
    assert cmd.shell().endswith("launch.rank 'my job.py'")


def test_split_target() -> None:
    assert _split_target(["-n", "2", "--timeout", "5", "x.py", "-n", "9"]) == (
        ["-n", "2", "--timeout", "5"],
        ["x.py", "-n", "9"],
    )
    assert _split_target(["-n", "2", "--dry-run", "-m", "pytest", "-x"]) == (
        ["-n", "2", "--dry-run"],
        ["-m", "pytest", "-x"],
    )
    assert _split_target(["-n=2", "--", "-weird.py"]) == (["-n=2"], ["-weird.py"])


def test_parse_args() -> None:
    opts = parse_args(
        [
            "-n",
            "3",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--timeout",
            "9",
            "--console",
            "all",
            "-m",
            "mod",
            "arg",
        ]
    )
    assert opts.nranks == 3
    assert opts.env == (("A", "1"), ("B", "x=y"))
    assert opts.timeout_s == 9.0
    assert opts.target == ("-m", "mod", "arg")
    assert opts.console == "all"


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "2"],
        ["-n", "2", "--env", "1A=2", "x.py"],
        ["-n", "2", "--timeout", "0", "x.py"],
        ["-n", "2", "--stall-timeout", "-1", "x.py"],
        ["-n", "2", "--stall-timeout", "nan", "x.py"],
        ["x.py"],
        ["-n", "2", "--mpi", "lam", "x.py"],
    ],
)
def test_parse_args_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_the_stall_timeout_comes_from_the_option_or_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launch.cli import stall_timeout

    monkeypatch.delenv("SHMEM_CONFIG", raising=False)
    monkeypatch.delenv("SHMEM_FLIGHT_STALL_TIMEOUT_S", raising=False)
    assert stall_timeout(parse_args(["-n", "2", "x.py"])) is None  # default: never
    opts = parse_args(["-n", "2", "--stall-timeout", "7.5", "x.py"])
    assert opts.stall_timeout_s == 7.5 and stall_timeout(opts) == 7.5
    assert opts.target == ("x.py",)  # the option's value is not taken for the target
    cfg = tmp_path / "c.toml"
    cfg.write_text("[flight]\nstall_timeout_s = 30\n")
    assert stall_timeout(parse_args(["-n", "2", "--config", str(cfg), "x.py"])) == 30.0
    assert (
        stall_timeout(parse_args(["-n", "2", "--config", str(cfg), "--stall-timeout", "0", "x.py"]))
        is None
    )
    off = ["-n", "2", "--stall-timeout", "5", "--env", "SHMEM_FLIGHT_RECORDS=0", "x.py"]
    with pytest.raises(UsageError, match="needs the flight recorder"):  # as the ranks see it
        stall_timeout(parse_args(off))
    env = ["-n", "2", "--env", "SHMEM_FLIGHT_STALL_TIMEOUT_S=9", "x.py"]
    assert stall_timeout(parse_args(env)) == 9.0
    cfg.write_text("[flight]\nrecords = 0\nstall_timeout_s = 30\n")
    with pytest.raises(UsageError, match=r"stall timeout \(30 s\) needs the flight recorder"):
        stall_timeout(parse_args(["-n", "2", "--config", str(cfg), "x.py"]))


def test_detect_mpi_flavour() -> None:
    assert detect_mpi_flavour("HYDRA build details:\n    Version: 5.0.2") == "mpich"
    assert detect_mpi_flavour("mpiexec (Open MPI) 5.0.11") == "openmpi"
    assert detect_mpi_flavour("prterun (PRRTE) 3.0") == "openmpi"
    with pytest.raises(UsageError, match="pass --mpi"):
        detect_mpi_flavour("Intel(R) something")


def test_resolve_launcher() -> None:
    assert resolve_launcher("auto", {}, have_srun=True) == "mpiexec"
    assert resolve_launcher("auto", {"SLURM_JOB_ID": "7"}, have_srun=True) == "srun"
    assert resolve_launcher("auto", {"SLURM_JOB_ID": "7"}, have_srun=False) == "mpiexec"
    assert resolve_launcher("srun", {}, have_srun=False) == "srun"
    with pytest.raises(UsageError, match="invalid --launcher"):
        resolve_launcher("pbs", {}, have_srun=False)


def test_choose_gpu() -> None:
    assert choose_gpu(0, 4, 0, False) is None
    assert [choose_gpu(r, 4, 4, False) for r in range(4)] == [0, 1, 2, 3]
    assert [choose_gpu(r, 4, 1, True) for r in range(4)] == [0, 0, 0, 0]
    assert [choose_gpu(r, 4, 2, True) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(GpuBindingError, match="4 ranks on this node but only 1 GPU"):
        choose_gpu(0, 4, 1, False)


def test_console_ranks() -> None:
    assert console_ranks("0", 4) == {0}
    assert console_ranks("all", 3) == {0, 1, 2}
    assert console_ranks("none", 3) == set()
    assert console_ranks("0,2", 3) == {0, 2}
    for bad in ("5", "x", "0,-1"):
        with pytest.raises(UsageError, match="invalid --console"):
            console_ranks(bad, 3)


HYDRA_KILL = """
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 2679 RUNNING AT vm
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
"""
OMPI_KILL = (
    "prterun noticed that process rank 2 with PID 4242 on node n07 exited on\nsignal 9 (Killed)."
)


def test_parse_mpiexec_failures() -> None:
    assert parse_mpiexec_failures(HYDRA_KILL) == [(-1, 2679, "vm", "killed by signal 9")]
    assert parse_mpiexec_failures(OMPI_KILL) == [(2, 4242, "n07", "killed by signal 9")]
    assert parse_mpiexec_failures("all good") == []


def test_error_records_roundtrip_earliest_first(tmp_path: Path) -> None:
    late = ErrorRecord(2, 4, "h", 11, 200.0, 3, "SystemExit(3)", "tb2")
    early = ErrorRecord(1, 4, "h", 10, 100.0, 1, "ValueError: x", "tb1")
    late.write(tmp_path)
    early.write(tmp_path)
    (tmp_path / "rank.3.error.json").write_text("{half")  # torn or foreign: ignored
    assert load_errors(tmp_path) == [early, late]
    assert "rank 1 of 4 on h (pid 10)" in early.headline()


def test_forwarder_tags_whole_lines_only(tmp_path: Path) -> None:
    out = io.StringIO()
    fwd = OutputForwarder(tmp_path, {0, 1}, out, tag=True)
    (tmp_path / "rank.0.log").write_bytes(b"alpha\nbe")
    (tmp_path / "rank.1.log").write_bytes(b"one\n")
    fwd.poll()
    assert out.getvalue() == "[0] alpha\n[1] one\n"  # 'be' waits for its newline
    with (tmp_path / "rank.0.log").open("ab") as fh:
        fh.write(b"ta\ngam")
    fwd.poll()
    assert out.getvalue().endswith("[0] beta\n")
    fwd.poll(final=True)
    assert out.getvalue() == "[0] alpha\n[1] one\n[0] beta\n[0] gam\n"
