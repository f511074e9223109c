"""The C put/signal binding (``shmem.backends.rma_accel``) degrades to the pure-Python path,
saying why, whenever the extension is missing or cannot be bound; it never fails a World."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import shmem
from shmem.backends import rma_accel

pytestmark = pytest.mark.mpi


@pytest.fixture
def fresh_binding() -> Iterator[None]:
    rma_accel._bound.cache_clear()
    try:
        yield
    finally:
        rma_accel._bound.cache_clear()  # the next caller binds the real one again


def test_without_the_extension_puts_and_signals_stay_in_python(
    fresh_binding: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "shmem._rmafast", None)  # import fails: not built
    monkeypatch.delattr(shmem, "_rmafast", raising=False)  # (set by an earlier import)
    assert rma_accel.status().startswith("pure Python: the C extension")
    win = MPI.Win.Create(np.zeros(8, np.uint8), 1, comm=MPI.COMM_SELF)
    try:
        assert rma_accel.putter(win, 8, np.dtype("uint8"), 1) is None
        assert rma_accel.signaller(win, [0], 1) is None
    finally:
        win.Free()


def test_a_binding_failure_degrades_and_says_why(
    fresh_binding: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(mod: Any) -> Any:
        raise AttributeError("module 'mpi4py.MPI' has no attribute '_sizeof'")

    monkeypatch.setattr(rma_accel, "_bind", broken)
    assert rma_accel.status() == (
        "pure Python: binding shmem._rmafast failed "
        "(AttributeError: module 'mpi4py.MPI' has no attribute '_sizeof')"
    )
    assert rma_accel._bound() is None  # cached: not retried for every buffer and pad


def test_the_binding_finds_mpi4pys_own_library(fresh_binding: None) -> None:
    try:
        importlib.import_module("shmem._rmafast")
    except ImportError:
        pytest.skip("the C extension is not built here")
    status = rma_accel.status()
    assert status.startswith("C: puts and signals through "), status
    width = MPI._sizeof(MPI.Win)
    assert f"({width}-byte handles)" in status


def _ring_requests(
    comm: MPI.Intracomm, send: np.ndarray[Any, Any], recv: np.ndarray[Any, Any]
) -> list[MPI.Prequest]:
    n, me = comm.Get_size(), comm.Get_rank()
    return [
        comm.Recv_init(recv, (me - 1) % n, 0x7A1),
        comm.Send_init(send, (me + 1) % n, 0x7A1),
    ]


@pytest.mark.parametrize("bound", [True, False], ids=["C", "python"])
def test_persistent_requests_start_and_complete_round_after_round(
    fresh_binding: None, monkeypatch: pytest.MonkeyPatch, bound: bool
) -> None:
    from collectives.signed import Persistent

    if not bound:
        monkeypatch.setitem(sys.modules, "shmem._rmafast", None)
        monkeypatch.delattr(shmem, "_rmafast", raising=False)
    elif rma_accel._bound() is None:
        pytest.skip(f"the C path is not bound here: {rma_accel.status()}")
    comm = MPI.COMM_WORLD.Dup()
    n, me = comm.Get_size(), comm.Get_rank()
    send, recv = np.zeros(1000, np.int64), np.zeros(1000, np.int64)
    reqs = _ring_requests(comm, send, recv)
    try:
        group = Persistent(reqs)
        assert (group.settle is None) is not bound
        for rnd in range(5):
            send[...] = rnd * 100 + me
            group.start()
            if group.settle is not None and rnd % 2:
                while not group.settle(4, 4):
                    pass
            else:
                while not group.Test():
                    pass
            assert (recv == rnd * 100 + (me - 1) % n).all(), rnd
            assert group.Test()  # complete requests stay complete until started again
            comm.Barrier()  # (the next round's send must not land before this check)
    finally:
        for req in reqs:
            req.Free()
        comm.Free()


def test_a_truncated_persistent_message_raises_mpis_error(fresh_binding: None) -> None:
    from collectives.signed import P2P_TRUNCATION_REPORTED, Persistent

    if rma_accel._bound() is None or not P2P_TRUNCATION_REPORTED:
        pytest.skip("the C path is not bound, or this MPI does not report truncation cleanly")
    comm = MPI.COMM_SELF.Dup()
    send, recv = np.arange(16, dtype=np.uint8), np.zeros(8, np.uint8)
    reqs = [comm.Recv_init(recv, 0, 3), comm.Send_init(send, 0, 3)]
    try:
        group = Persistent(reqs)
        assert group.settle is not None
        group.start()
        with pytest.raises(MPI.Exception) as info:
            while not group.settle(8, 8):
                pass
        assert info.value.Get_error_class() == MPI.ERR_TRUNCATE
    finally:
        for req in reqs:
            with contextlib.suppress(MPI.Exception):
                MPI.Request.Wait(req)  # (the send, still active)
            req.Free()
        comm.Free()
