"""Backend choice ("auto", SHMEM_BACKEND) and the nvshmem backend's pure parts (no GPU)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from shmem.backends import resolve_backend
from shmem.errors import BackendUnavailableError


def nvshmem_usable() -> bool:
    from shmem.backends import _nvshmem_status

    return _nvshmem_status() is None


def test_auto_without_nvshmem_is_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHMEM_BACKEND", raising=False)
    if nvshmem_usable():
        assert resolve_backend("auto")[0] == "nvshmem"
    else:
        name, why = resolve_backend("auto")
        assert name == "host" and why.startswith("auto: ")


def test_environment_pins_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHMEM_BACKEND", "host")
    assert resolve_backend("auto") == ("host", "requested")
    monkeypatch.setenv("SHMEM_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError, match="SHMEM_BACKEND"):
        resolve_backend("auto")
    monkeypatch.setenv("SHMEM_BACKEND", "nvshmem")
    if not nvshmem_usable():
        with pytest.raises(BackendUnavailableError, match="nvshmem"):
            resolve_backend("auto")
    monkeypatch.setenv("SHMEM_BACKEND", "cuda")
    assert resolve_backend("host") == ("host", "requested")  # an explicit choice wins


def test_nvshmem_module_imports_without_nvshmem() -> None:
    """The backend module is importable (and typed) without nvshmem4py or a GPU."""
    assert importlib.util.find_spec("shmem.backends.nvshmem") is not None
    from shmem.backends import nvshmem

    assert "barrier_all" in nvshmem.SAFE_IN_LIMITED_MPG
    for exits in ("barrier", "sync", "signal_wait", "reduce", "collective_on_buffer"):
        assert exits not in nvshmem.SAFE_IN_LIMITED_MPG


def test_limited_mpg_guard_refuses_unsafe_calls() -> None:
    from shmem.backends.nvshmem import NvshmemHeap
    from shmem.errors import NvshmemError

    heap = NvshmemHeap.__new__(NvshmemHeap)
    heap._nv = SimpleNamespace(barrier_all="ok", reduce="exits")
    made_current: list[int] = []
    heap._gpu = SimpleNamespace(current=lambda: made_current.append(1))  # type: ignore[assignment]
    heap.limited_mpg = True
    assert heap.nv("barrier_all") == "ok"
    assert made_current == [1]  # the World's GPU, before the call (issue 42, risk 3)
    with pytest.raises(NvshmemError, match="LIMITED_MPG"):
        heap.nv("reduce")
    heap.limited_mpg = False
    assert heap.nv("reduce") == "exits"


def test_nvshmem_environment_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from shmem.backends.nvshmem_env import environment as _environment

    for key in (
        "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
        "NVSHMEM_REMOTE_TRANSPORT",
        "NVSHMEM_DISABLE_NVLS",
        "NVSHMEM_DISABLE_NCCL",
    ):
        monkeypatch.delenv(key, raising=False)
    cfg = SimpleNamespace(
        bootstrap_ifname="", remote_transport="none", disable_nvls=True, disable_nccl=False
    )
    _environment(cfg, single_node=True)
    import os

    assert os.environ["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] == "lo"
    assert os.environ["NVSHMEM_REMOTE_TRANSPORT"] == "none"
    assert os.environ["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "NVSHMEM_DISABLE_NCCL" not in os.environ
    monkeypatch.setenv("NVSHMEM_REMOTE_TRANSPORT", "ibrc")  # the environment wins
    _environment(cfg, single_node=True)
    assert os.environ["NVSHMEM_REMOTE_TRANSPORT"] == "ibrc"
