"""Test harness: agreed verdicts and deadlines for MPI tests (see tests/README.md).

Under MPI (``--only-mpi`` or ``--with-mpi``) every phase (setup, call, teardown) of every test
marked ``mpi`` ends with a verdict exchange on a communicator duplicated at configure time:
each rank sends its outcome to rank 0, rank 0 sends back the worst one (failed > skipped >
passed) with the failing ranks' reports. So all ranks pass, skip or fail each test together,
and a failure on one rank cannot make the others run the next test out of step.

Deadlines: a rank that waits for the verdict longer than ``VERDICT_TIMEOUT_S`` (shorter when
the rank itself failed, since its peers are then likely stuck waiting on it) records an error
(under the launcher) naming the test and the missing ranks, and aborts the job. pytest-timeout
(``--timeout-method=thread``) covers a rank stuck inside a test.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CI_CONFIG = ROOT / "configs" / "ci.toml"

VERDICT_TIMEOUT_S = float(os.environ.get("SHMEM_TEST_VERDICT_TIMEOUT_S", "150"))
FAILED_RANK_TIMEOUT_S = float(os.environ.get("SHMEM_TEST_FAILED_RANK_TIMEOUT_S", "20"))
_TAG_UP, _TAG_DOWN = 7301, 7302
_RANK_OF = {"passed": 0, "skipped": 1, "failed": 2}


class _Mpi:
    comm: Any = None


@pytest.hookimpl(tryfirst=True)  # before junitxml's, which reads xmlpath
def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("only_mpi", False) or config.getoption("with_mpi", False):
        from mpi4py import MPI

        _Mpi.comm = MPI.COMM_WORLD.Dup()  # eagerly: never created inside a failing test
        if _Mpi.comm.Get_rank() != 0 and getattr(config.option, "xmlpath", None):
            # rank 0 reports the agreed verdicts: one junit XML per job, each test once
            config.option.xmlpath = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection imported (torch alone is hundreds of thousands of objects):
    the tests that call ``gc.collect()`` to check what they freed then pay for their own
    objects only (test_dlpack's 1344 collections took 147 s after torch was imported, 20 s
    before)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Meet the other ranks once every report is written, then exit.

    With failures every rank exits non-zero and the launcher aborts the job on the first
    exit; without this meeting, that could cut rank 0's final summary short.
    """
    if _Mpi.comm is not None:
        sys.stdout.flush()
        req = _Mpi.comm.Ibarrier()
        deadline = time.monotonic() + VERDICT_TIMEOUT_S
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
        _Mpi.comm = None


def _abort(message: str) -> None:
    from mpi4py import MPI

    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    log_dir = os.environ.get("SHMEM_LAUNCH_LOG_DIR")
    if log_dir:
        from launch.report import ErrorRecord

        comm = MPI.COMM_WORLD
        ErrorRecord(
            comm.Get_rank(),
            comm.Get_size(),
            socket.gethostname(),
            os.getpid(),
            time.time(),
            1,
            "test harness: verdict not agreed",
            message,
        ).write(Path(log_dir))
    MPI.COMM_WORLD.Abort(1)


def _wait_message(comm: Any, source: int, tag: int, deadline: float) -> bool:
    while not comm.iprobe(source=source, tag=tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _agree(nodeid: str, when: str, outcome: str, text: str) -> tuple[str, list[int], str]:
    """Exchange outcomes; return (worst outcome, failing ranks, rank 0's combined text)."""
    comm = _Mpi.comm
    rank, size = comm.Get_rank(), comm.Get_size()
    limit = FAILED_RANK_TIMEOUT_S if outcome == "failed" else VERDICT_TIMEOUT_S
    deadline = time.monotonic() + limit
    req = comm.isend((outcome, text), dest=0, tag=_TAG_UP)
    if rank == 0:
        results: dict[int, tuple[str, str]] = {}
        for r in range(size):
            if not _wait_message(comm, r, _TAG_UP, deadline):
                missing = [q for q in range(size) if q not in results and q >= r]
                _abort(
                    f"test harness: {nodeid} ({when}): rank(s) {missing} did not reach the "
                    f"verdict within {limit:g} s (rank 0's outcome: {outcome})\n{text}"
                )
            results[r] = comm.recv(source=r, tag=_TAG_UP)
        worst = max((o for o, _ in results.values()), key=_RANK_OF.__getitem__)
        failing = [r for r, (o, _) in sorted(results.items()) if o == "failed"]
        combined = "\n".join(f"---- rank {r} of {size} ----\n{results[r][1]}" for r in failing)
        verdict = (worst, failing, combined)
        reqs = [comm.isend(verdict, dest=r, tag=_TAG_DOWN) for r in range(1, size)]
        for q in reqs:
            q.wait()
    else:
        if not _wait_message(comm, 0, _TAG_DOWN, deadline):
            _abort(
                f"test harness: {nodeid} ({when}): rank {rank} got no verdict from rank 0 within "
                f"{limit:g} s (this rank's outcome: {outcome})\n{text}"
            )
        verdict = comm.recv(source=0, tag=_TAG_DOWN)
    req.wait()
    return verdict


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if _Mpi.comm is None or item.get_closest_marker("mpi") is None:
        return
    text = str(report.longreprtext) if report.outcome == "failed" else ""
    worst, failing, combined = _agree(item.nodeid, report.when, report.outcome, text)
    if worst == report.outcome:
        if worst == "failed" and _Mpi.comm.Get_rank() == 0:
            report.longrepr = f"failed on rank(s) {failing}\n{combined}"
        return
    if worst == "failed":
        report.outcome = "failed"
        report.longrepr = (
            f"failed on rank(s) {failing}\n{combined}"
            if _Mpi.comm.Get_rank() == 0
            else f"failed on rank(s) {failing} (this rank passed; see rank 0's report)"
        )
    elif worst == "skipped" and report.outcome == "passed":
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            "Skipped: skipped on another rank",
        )


def mpi_world_size() -> int:
    """The job's size when running under MPI, else 1."""
    return 1 if _Mpi.comm is None else int(_Mpi.comm.Get_size())


@pytest.fixture
def world() -> Iterator[Any]:
    """A World on COMM_WORLD with configs/ci.toml (plus SHMEM_* from the environment)."""
    import shmem

    w = shmem.init(CI_CONFIG)
    try:
        yield w
    finally:
        if not w.finalized:
            w.finalize()
