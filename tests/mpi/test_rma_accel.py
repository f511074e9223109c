"""The C put/signal binding (``shmem.backends.rma_accel``) degrades to the pure-Python path,
saying why, whenever the extension is missing or cannot be bound; it never fails a World."""

from __future__ import annotations

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
