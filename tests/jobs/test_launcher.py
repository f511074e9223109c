"""The real launcher on real jobs: fault injection, timeouts, output tagging, dry runs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs

JOBS = Path(__file__).resolve().parent / "jobs"
ROOT = Path(__file__).resolve().parents[2]


def launch(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [sys.executable, "-m", "launch", *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )
    return proc, time.time()


def _event_time(path: Path) -> float:
    return float(path.read_text())


@pytest.mark.parametrize(
    ("mode", "code", "cause"),
    [
        (
            "raise",
            1,
            r"root cause: rank 1 of 3 on \S+ \(pid \d+\) at [\d:.]+: ValueError: injected failure",
        ),
        ("exit3", 3, r"root cause: rank 1 of 3 .*SystemExit\(3\) \(exit code 3\)"),
        ("thread", 1, r"root cause: rank 1 of 3 .*RuntimeError: injected failure in a thread"),
        (
            "kill",
            137,
            r"root cause: rank 1 of 3 on \S+ \(pid \d+\) at [\d:.]+ died first: killed by "
            r"signal 9 "
            r"\(SIGKILL\)",
        ),
        ("oexit7", 7, r"root cause: rank 1 of 3 .*died first: exited with code 7"),
        ("segv", 139, r"root cause: rank 1 of 3 .*killed by signal 11 \(SIGSEGV\)"),
        ("peer", 5, r"root cause: rank 1 of 3 .*SystemExit\(5\) \(exit code 5\)"),
    ],
)
def test_a_failing_rank_ends_the_job_and_is_named(
    tmp_path: Path, mode: str, code: int, cause: str
) -> None:
    event = tmp_path / "event"
    proc, end = launch("-n", "3", "--timeout", "60", str(JOBS / "faulty.py"), mode, str(event))
    assert proc.returncode == code, proc.stderr
    assert re.search(cause, proc.stderr), proc.stderr
    assert end - _event_time(event) < 5.0, "the job ends within 5 s of the failure"
    if mode in ("raise", "thread", "segv"):
        assert "faulty.py" in proc.stderr  # the user's frame is in the traceback
    if mode == "segv":  # faulthandler's report of the fatal signal, in the root cause
        assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr
    if mode == "peer":  # the peers that stopped because of it are consequences
        assert re.search(r"stopped because of rank 1: rank [02] .*PeerFailedError", proc.stderr)


@pytest.mark.parametrize("split", ["node", "rank"])
@pytest.mark.parametrize("status", [0, 6])
def test_global_exit_ends_every_rank_with_its_status(
    tmp_path: Path, status: int, split: str
) -> None:
    """shmem.global_exit(status) on one rank ends the job at once, the others blocked in a
    barrier; the launcher exits with that status and says who called it, from where."""
    event = tmp_path / "event"
    proc, end = launch(
        "-n", "3", "--timeout", "60", "--env", f"SHMEM_HEAP_NODE_SPLIT={split}",
        str(JOBS / "faulty.py"), f"gexit{status}", str(event),
    )  # fmt: skip
    assert proc.returncode == status, proc.stderr
    said = (
        r"rank 1 of 3 on \S+ \(pid \d+\) called global_exit\({}\) at [\d:.]+ \(\S*faulty.py:\d+\)"
    )
    assert re.search(said.format(status), proc.stderr), proc.stderr
    assert ("job ended by global_exit" in proc.stderr) == (status != 0), proc.stderr
    assert "root cause" not in proc.stderr and "NOT ENDED" not in proc.stdout
    assert end - _event_time(event) < 5.0, "the job ends within 5 s"


def test_a_hanging_rank_is_killed_at_the_deadline(tmp_path: Path) -> None:
    event = tmp_path / "event"
    proc, end = launch("-n", "3", "--timeout", "4", str(JOBS / "faulty.py"), "hang", str(event))
    assert proc.returncode == 124
    assert "job timed out after 4 s; rank(s) still running: [0, 1, 2]" in proc.stderr
    assert "in main" in proc.stderr and "faulty.py" in proc.stderr  # stacks were dumped
    assert end - _event_time(event) < 4 + 5.0


def test_system_exit_zero_in_a_thread_is_clean(tmp_path: Path) -> None:
    proc, _ = launch("-n", "2", str(JOBS / "faulty.py"), "thread_exit0", str(tmp_path / "e"))
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 finished" in proc.stdout


def test_a_clean_job_exits_zero(tmp_path: Path) -> None:
    proc, _ = launch("-n", "2", str(JOBS / "faulty.py"), "ok", str(tmp_path / "e"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "rank 0 finished"  # rank 0 only, untagged
    assert "rank 1 finished" not in proc.stdout


def test_interleaved_output_is_tagged_as_whole_lines(tmp_path: Path) -> None:
    proc, _ = launch(
        "-n", "4", "--console", "all", "--log-dir", str(tmp_path), str(JOBS / "chatty.py")
    )
    assert proc.returncode == 0, proc.stderr
    seen: dict[int, list[str]] = {r: [] for r in range(4)}
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"\[(\d)\] (.*)", line)
        assert m, f"untagged or mid-line tag: {line!r}"
        if "INFO" in m.group(2):
            continue
        seen[int(m.group(1))].append(m.group(2))
    for r in range(4):
        expected = [f"rank {r} line {i}" for i in range(200)] + [
            f"rank {r} last line without newline"
        ]
        assert seen[r] == expected
        log = (tmp_path / f"rank.{r}.log").read_text()
        assert f"\nrank {r} line 199\n" in log  # log files hold the rank's own, untagged lines
        assert not any(ln.startswith(f"[{r}] rank") for ln in log.splitlines())


def test_config_errors_stop_before_launch(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[heap]\nsize = 1\n")
    proc, _ = launch("-n", "2", "--config", str(bad), str(JOBS / "faulty.py"), "ok", "x")
    assert proc.returncode == 2
    assert "bad.toml: unknown key 'size' in [heap]" in proc.stderr


RANK_CMD = r"\S*python\S* -m launch.rank job.py a$"


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (
            ["--mpi", "mpich"],  # explicit: the suite runs on Open MPI too
            # (MASTER_ADDR/PORT: what torch's env:// init reads, for the symheap backend)
            r"/mpiexec -n 2 -genv MASTER_ADDR 127\.0\.0\.1 -genv MASTER_PORT \d+ "
            r"-genv SHMEM_CONFIG \S+/configs/ci.toml " + RANK_CMD,
        ),
        (
            ["--mpi", "openmpi"],
            r"OMPI_ALLOW_RUN_AS_ROOT=1 .*/mpiexec -n 2 -x MASTER_ADDR -x MASTER_PORT "
            r"-x SHMEM_CONFIG " + RANK_CMD,
        ),
        (
            ["--launcher", "srun"],
            r"^MASTER_ADDR=\S+ MASTER_PORT=\d+ SHMEM_CONFIG=\S+ srun -n 2 --kill-on-bad-exit=1 "
            r"--export=ALL " + RANK_CMD,
        ),
    ],
    ids=["mpich", "openmpi", "srun"],
)
def test_dry_run_command_lines(args: list[str], pattern: str) -> None:
    proc, _ = launch("-n", "2", "--config", "configs/ci.toml", *args, "--dry-run", "job.py", "a")
    assert proc.returncode == 0, proc.stderr
    assert re.search(pattern, proc.stdout.strip()), proc.stdout


def test_a_failed_job_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    """Ranks killed mid-job never unlink their MPI segments: the launcher removes them."""
    from launch.cleanup import SHM_DIR, stale_segments

    if not SHM_DIR.is_dir():
        pytest.skip("no /dev/shm")
    started = time.time()
    before = {p.name for p in SHM_DIR.iterdir()}
    proc, _ = launch(
        "-n", "3", "--timeout", "60", str(JOBS / "faulty.py"), "kill", str(tmp_path / "e")
    )
    assert proc.returncode == 137, proc.stderr
    left = [p for p in stale_segments(started) if p.name not in before]
    assert not left, f"segments left in /dev/shm: {left}\n{proc.stderr}"


@pytest.mark.parametrize("split", ["node", "rank"])
def test_a_failure_inside_attention_is_its_own_root_cause(tmp_path: Path, split: str) -> None:
    """Issue 15, point 1: the peers stop with PeerFailedError at once; the failing rank's
    own exit code and exception are the root cause, on the shared and the RMA path (where
    the peers must keep serving the failing rank's one-sided abort while they wait)."""
    import os

    event = tmp_path / "event"
    cmd = [sys.executable, "-m", "launch", "-n", "3", "--timeout", "60"]
    cmd += [str(ROOT / "scripts" / "fault_job.py"), "exit", "backward", "main", str(event)]
    env = {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split, "SHMEM_BACKEND": "host"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
    )
    end = time.time()
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert re.search(r"root cause: rank 1 of 3 .*SystemExit\(5\)", proc.stderr), proc.stderr
    # the peers are listed as consequences when they raised before rank 1's abort ended
    # them, which depends on timing: either way none of them is the root cause
    assert end - _event_time(event) < 3.0, "no rank waited out its grace period"


@pytest.mark.parametrize("split", ["node", "rank"])
def test_views_kept_across_finalize_do_not_crash(split: str) -> None:
    import os

    cmd = [sys.executable, "-m", "launch", "-n", "2", "--timeout", "60"]
    cmd += [str(JOBS / "stale_view.py")]
    env = {**os.environ, "SHMEM_HEAP_NODE_SPLIT": split}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stale views ok" in proc.stdout


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_terminated_launcher_takes_its_job_down(tmp_path: Path, sig: str) -> None:
    """``timeout`` (SIGTERM) or a closed terminal (SIGHUP) stopping ``python -m launch`` ends
    the whole job: mpiexec runs in its own session, so before, it and the ranks were left
    running, orphaned (a hanging rank spun for hours after its launcher was gone)."""
    import os
    import signal

    from launch.cleanup import SHM_DIR, stale_segments

    started = time.time()
    before = {p.name for p in SHM_DIR.iterdir()} if SHM_DIR.is_dir() else set()
    event = tmp_path / "event"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "-n", "2", "--timeout", "60",
         str(JOBS / "faulty.py"), "hang", str(event)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 30
    while not event.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert event.exists(), "the ranks did not start"
    os.kill(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + getattr(signal, sig), (proc.returncode, err[-2000:])
    # nothing of the job is left: no process still runs the job's script
    end = time.time() + 10
    while time.time() < end:
        left = []
        for status in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                cmdline = status.read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if str(event).encode() in cmdline:
                left.append(cmdline.decode(errors="replace"))
        if not left:
            break
        time.sleep(0.2)
    assert not left, left
    # nor its shared memory: the killed ranks never unlinked their MPI segments
    leaked = [p for p in stale_segments(started) if p.name not in before]
    assert not leaked, f"segments left in /dev/shm: {leaked}\n{err[-2000:]}"
