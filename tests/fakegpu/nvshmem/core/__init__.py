"""A one-PE stand-in for ``nvshmem.core`` over the fake libcuda: it records the calls made and
refuses any that needs a second PE (tests/fakegpu/README.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

CALLS: list[str] = []
_state: dict[str, Any] = {"status": 0, "device": None}


class InitStatus:
    STATUS_NOT_INITIALIZED = 0
    STATUS_IS_BOOTSTRAPPED = 1
    STATUS_IS_INITIALIZED = 2
    STATUS_LIMITED_MPG = 3
    STATUS_FULL_MPG = 4


class SignalOp:
    SIGNAL_SET = 9
    SIGNAL_ADD = 10


class Teams:
    TEAM_WORLD = 0


class _Uid:
    def __init__(self) -> None:
        self._data = np.zeros(128, np.uint8)


class Version:
    libnvshmem_version = "0.0.0-fake"

    def __repr__(self) -> str:
        return "Version(\n  a multi-line repr, as nvshmem4py's\n)"


def get_unique_id(empty: bool = False) -> _Uid:
    CALLS.append("get_unique_id")
    return _Uid()


def init(
    device: Any = None,
    uid: Any = None,
    rank: Any = None,
    nranks: Any = None,
    mpi_comm: Any = None,
    initializer_method: str = "",
) -> None:
    CALLS.append("init")
    if initializer_method != "uid" or nranks != 1 or rank != 0 or uid is None or device is None:
        raise AssertionError(
            f"fake nvshmem: unexpected init({initializer_method}, {rank}, {nranks})"
        )
    _state["status"] = InitStatus.STATUS_IS_INITIALIZED
    _state["device"] = device


def init_status() -> int:
    return int(_state["status"])


def get_version() -> Version:
    return Version()


def buffer(size: int, release: bool = False, except_on_del: bool = True) -> Any:
    CALLS.append("buffer")
    dev = _state["device"]
    return dev.allocate(size, stream=dev.default_stream)


def free(buf: Any) -> None:
    CALLS.append("free")
    buf.close()


def barrier_all(stream: Any) -> None:
    CALLS.append("barrier_all")
    if stream is None:
        raise TypeError("fake nvshmem: barrier_all needs a stream")


def quiet(stream: Any = None) -> None:
    CALLS.append("quiet")


def finalize() -> None:
    CALLS.append("finalize")
    _state["status"] = InitStatus.STATUS_NOT_INITIALIZED


def _one_pe_only(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("fake nvshmem: this call needs a second PE")


get_peer_buffer = put = get = signal_op = _one_pe_only
