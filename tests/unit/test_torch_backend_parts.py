"""The symheap backend's parts that need no MPI (issue 31): tensors as numpy views, torch's
reduce ops, the ordered progress queue, and the launcher's rendezvous variables."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from collectives.torch_backend._progress import ProgressQueue
from collectives.torch_backend._tensors import (
    Staged,
    as_array,
    check_tensors,
    factor_of,
    op_name,
)
from launch.cli import rendezvous_environment
from launch.command import LaunchOptions
from shmem.errors import CollectiveArgumentError, OpError


def test_tensors_are_numpy_views_of_the_same_memory() -> None:
    for dtype, np_dtype in (
        (torch.float32, np.float32),
        (torch.bfloat16, ml_dtypes.bfloat16),
        (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
        (torch.complex64, np.complex64),
        (torch.bool, np.bool_),
        (torch.uint16, np.uint16),
    ):
        t = torch.zeros(6, dtype=dtype)
        a = as_array(t)
        assert a.dtype == np.dtype(np_dtype) and a.ctypes.data == t.data_ptr()
        a[2] = 1
        assert bool(t[2] != 0)


def test_staged_copies_non_contiguous_tensors_and_writes_back() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    view = base.t()
    st = Staged(view)
    assert st.copy is not None and np.array_equal(st.array, view.numpy())
    st.array[...] = -1
    st.writeback()
    assert torch.equal(base, torch.full((3, 4), -1.0))
    conj = torch.tensor([1 + 2j]).conj()  # a lazily conjugated view reads its value
    assert Staged(conj).array[0] == 1 - 2j
    out = Staged(torch.empty(4)[::2], read=False)  # an output only: nothing read
    assert out.array.shape == (2,)
    assert Staged(torch.ones(3)).copy is None  # contiguous: zero-copy


def test_bad_tensors_and_ops_are_named() -> None:
    with pytest.raises(CollectiveArgumentError, match=r"w: tensor 1 is not a torch.Tensor"):
        check_tensors("w", [torch.ones(1), np.ones(1)])  # type: ignore[list-item]
    with pytest.raises(CollectiveArgumentError, match="layout"):
        check_tensors("w", [torch.ones(2).to_sparse()])
    with pytest.raises(CollectiveArgumentError, match="is on meta"):
        check_tensors("w", [torch.ones(2, device="meta")])
    with pytest.raises(CollectiveArgumentError, match=r"has dtype torch\.float8_e4m3fnuz"):
        check_tensors("w", [torch.zeros(2, dtype=torch.float8_e4m3fnuz)])
    assert op_name("w", dist.ReduceOp.MAX) == "max"
    assert op_name("w", dist.ReduceOp.PRODUCT) == "prod"
    premul = torch._C._distributed_c10d._make_nccl_premul_sum(2.5)
    assert op_name("w", premul) == "sum" and factor_of(premul) == 2.5
    assert factor_of(dist.ReduceOp.SUM) is None
    with pytest.raises(OpError, match="w: unsupported reduce op"):
        op_name("w", "median")


def test_the_queue_runs_calls_in_issue_order() -> None:
    q = ProgressQueue("t")
    seen: list[int] = []
    gate = threading.Event()

    def call(i: int, wait: bool = False) -> Any:
        def run() -> int:
            if wait:
                gate.wait(5)
            seen.append(i)
            return i

        return run

    works = [q.submit(call(0, wait=True), background=True)]
    works += [q.submit(call(i)) for i in range(1, 5)]  # queued behind: not inline
    assert seen == []
    gate.set()
    for w in works:
        w.wait()
    assert seen == [0, 1, 2, 3, 4]
    assert [w.get_future().value() for w in works] == [0, 1, 2, 3, 4]
    inline = q.submit(call(5))  # idle queue: runs at once on this thread
    assert seen[-1] == 5 and inline.is_completed()
    q.close()
    with pytest.raises(RuntimeError, match="shut down"):
        q.submit(call(6))


def test_a_failed_call_raises_in_wait_with_its_type() -> None:
    q = ProgressQueue("t")

    def boom() -> None:
        time.sleep(0.01)
        raise CollectiveArgumentError("x: bad (got 1; expected 2)")

    w = q.submit(boom, background=True)
    with pytest.raises(CollectiveArgumentError, match="x: bad"):
        w.wait()
    assert isinstance(w.exception(), CollectiveArgumentError) and not w.is_success()
    with pytest.raises(CollectiveArgumentError, match="x: bad"):
        q.submit(boom)  # inline: raised at once
    q.close()


def test_rendezvous_variables(tmp_path: Path) -> None:
    opts = LaunchOptions(nranks=2, target=("x.py",))
    env = rendezvous_environment(opts, {})
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
    hosts = tmp_path / "hosts"
    hosts.write_text("# nodes\n\nnode7:4\nnode8:4\n")
    opts = LaunchOptions(nranks=2, target=("x.py",), hostfile=str(hosts))
    assert rendezvous_environment(opts, {})["MASTER_ADDR"] == "node7"
    hosts.write_text("n1 slots=4\n")
    assert rendezvous_environment(opts, {})["MASTER_ADDR"] == "n1"
    assert rendezvous_environment(opts, {"MASTER_ADDR": "a", "MASTER_PORT": "1"}) == {}


def test_the_store_port_is_outside_the_kernels_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The MPI library's own sockets (kernel-chosen ports) can never take rank 0's store port
    between the launcher's choice and torch's bind (CI saw EADDRINUSE with a kernel-chosen one)."""
    import socket

    from launch import cli

    low, high = cli._ephemeral_range()
    assert 1024 <= low <= high <= 65535

    # no /proc: the BSDs' and macOS's sysctls, else the union of Linux's and IANA's ranges
    def sysctl(out: str) -> Any:  # (the tier starts no process: a stand-in's answer)
        return lambda *a, **k: types.SimpleNamespace(returncode=0, stdout=out, stderr="")

    with monkeypatch.context() as m:
        m.setattr("launch.cli.subprocess.run", sysctl("10000\n65535\n"))  # FreeBSD's
        assert cli._ephemeral_range("/nonexistent") == (10000, 65535)
        m.setattr("launch.cli.subprocess.run", sysctl("unknown oid\n"))
        assert cli._ephemeral_range("/nonexistent") == (32768, 65535)
        m.setattr("launch.cli.subprocess.run", sysctl(""))  # (no answer at all)
        assert cli._ephemeral_range("/nonexistent") == (32768, 65535)
        m.setattr(cli, "_ephemeral_range", lambda: (10000, 65535))
        assert all(1024 <= cli.free_port() < 10000 for _ in range(5))  # (below FreeBSD's)
    ports = {cli.free_port() for _ in range(20)}
    assert all(not low <= p <= high and p >= 10000 for p in ports), ports
    monkeypatch.setattr(cli, "_ephemeral_range", lambda: (10000, 65534))  # leaves only 65535
    with socket.socket() as held:
        try:
            held.bind(("", 65535))
        except OSError:
            pytest.skip("port 65535 is in use here")
        held.listen()
        port = cli.free_port()
        assert port != 65535 and 0 < port < 65536  # the kernel's choice once no draw binds
    assert cli.free_port() == 65535


def test_a_callback_that_waits_for_a_queued_call_does_not_deadlock() -> None:
    """torch's PowerSGD hook waits, inside a future's callback (the worker's thread), for
    a call it just issued: the waiter runs the queue's calls itself, in order."""
    q = ProgressQueue("t")
    seen: list[str] = []
    gate = threading.Event()

    def first() -> str:
        gate.wait(5)
        seen.append("first")
        return "first"

    def note(what: str) -> Any:
        return lambda: seen.append(what) or what  # type: ignore[func-returns-value]

    def then(fut: Any) -> str:
        q.submit(note("queued-behind"), background=True)
        inner = q.submit(note("inner"), background=True)
        inner.wait()  # on the worker's thread
        return str(inner.get_future().value())

    chained = q.submit(first, background=True).get_future().then(then)
    gate.set()
    assert chained.wait() == "inner"
    assert seen == ["first", "queued-behind", "inner"]
    q.close()


def test_close_waits_for_a_running_call_and_never_overlaps_two() -> None:
    q = ProgressQueue("t")
    running = threading.Event()
    release = threading.Event()
    active: list[int] = []
    overlap: list[bool] = []

    def call(i: int) -> Any:
        def run() -> int:
            overlap.append(bool(active))
            active.append(i)
            if i == 0:
                running.set()
                release.wait(5)
            active.remove(i)
            return i

        return run

    t = threading.Thread(target=lambda: q.submit(call(0)))  # inline, on another thread
    t.start()
    assert running.wait(5)
    later = q.submit(call(1))  # queued behind it
    closer = threading.Thread(target=q.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive()  # close() waits for the running call
    release.set()
    closer.join(5)
    t.join(5)
    later.wait()
    assert overlap == [False, False] and not closer.is_alive()
