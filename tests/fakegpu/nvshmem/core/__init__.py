"""A stand-in for ``nvshmem.core`` over the fake libcuda (tests/fakegpu/README.md). It records
the calls made. At one PE the heap is device memory of the fake; at several (the ranks of one
job on one machine) each PE's part of a buffer is a memfd that every PE maps, so peer pointers
(``get_peer_buffer``) reach it as NVSHMEM's do within a node; the barrier is MPI's. PEs
sharing a device (``FAKE_GPUS=1`` in the fake libcuda: the lent machine's one GPU) get
NVSHMEM's LIMITED_MPG mode, where a host collective exits the process as NVSHMEM's does. Calls that
move data through NVSHMEM itself (``put``, ``get``, ``signal_op``: peers not reachable by
load/store) are refused: every PE here is reachable.

Like NVSHMEM it refuses a heap beyond ``NVSHMEM_SYMMETRIC_SIZE`` (1 GiB unset, read at
``init``), calls made while another GPU is current (NVSHMEM runs them on the current context),
and, like nvshmem4py, reports a buffer garbage-collected without ``free``: "freed implicitly",
raised where ``except_on_del`` is true (the default), logged otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import weakref
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
    uid = _Uid()
    if not empty:
        uid._data[:16] = np.frombuffer(os.urandom(16), np.uint8)
    return uid


def init(
    device: Any = None,
    uid: Any = None,
    rank: Any = None,
    nranks: Any = None,
    mpi_comm: Any = None,
    initializer_method: str = "",
) -> None:
    CALLS.append("init")
    if (
        initializer_method != "uid"
        or not isinstance(nranks, int)
        or not isinstance(rank, int)
        or not 0 <= rank < nranks
        or uid is None
        or device is None
    ):
        raise AssertionError(
            f"fake nvshmem: unexpected init({initializer_method}, {rank}, {nranks})"
        )
    if nranks > 1 and not uid._data[:16].any():
        raise AssertionError("fake nvshmem: the unique id did not reach this PE")
    status = InitStatus.STATUS_IS_INITIALIZED
    if nranks > 1:  # PEs sharing a GPU without MPS: NVSHMEM's LIMITED_MPG mode
        from mpi4py import MPI

        devices = MPI.COMM_WORLD.allgather(int(device.device_id))
        if len(set(devices)) < len(devices):
            status = InitStatus.STATUS_LIMITED_MPG
    _state.update(
        status=status,
        device=device,
        rank=rank,
        nranks=nranks,
        maps=[],
        symmetric=_symmetric_size(),
        allocated=0,
    )


def _symmetric_size() -> int:
    """``NVSHMEM_SYMMETRIC_SIZE`` as NVSHMEM reads it (a number, one scale letter)."""
    import re

    text = os.environ.get("NVSHMEM_SYMMETRIC_SIZE", "")
    if not text:
        return 1 << 30
    m = re.fullmatch(r"(\d+\.?\d*|\.\d+)([kKmMgGtT]?).*", text.strip())
    if m is None:
        raise AssertionError(f"fake nvshmem: NVSHMEM_SYMMETRIC_SIZE={text!r} is invalid")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(float(m.group(1)) * scale[m.group(2).lower()] + 0.999)


def _on_its_device(name: str) -> None:
    """NVSHMEM runs a host call on the current context: refuse one made while another GPU
    (or none) is current."""
    dev = _state["device"]
    current = ctypes.c_int(-1)
    ctypes.CDLL("libcuda.so.1").cuCtxGetDevice(ctypes.byref(current))
    if current.value != int(dev.device_id):
        raise AssertionError(
            f"fake nvshmem: {name} called with device {current.value} current; this PE's "
            f"device is {int(dev.device_id)} (NVSHMEM would run it on the wrong context)"
        )


def _implicitly_freed(handle: int, raise_: bool) -> None:
    """What nvshmem4py's NvshmemResource.deallocate does for a buffer never freed."""
    if handle not in _state.get("live", {}):
        return
    if raise_:
        raise RuntimeError(f"nvshmem4py: Buffer {handle:#x} freed implicitly.")
    logging.getLogger("nvshmem").error("Buffer %#x freed implicitly.", handle)


def init_status() -> int:
    return int(_state["status"])


def get_version() -> Version:
    return Version()


def _map(path: str | None, size: int) -> Any:
    """A file mapped here (``None``: a new memfd of ``size`` bytes, kept open as this PE's
    part) as a cuda.core Buffer (the fake's device memory is host memory); ``(buffer, fd)``."""
    from cuda.core import Buffer

    if path is None:
        fd = os.memfd_create("fake-nvshmem", os.MFD_CLOEXEC)  # peers open it through /proc
        os.ftruncate(fd, size)
    else:
        fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    if path is not None:
        os.close(fd)
        fd = -1
    address = ctypes.addressof(ctypes.c_char.from_buffer(m))
    _state["maps"].append((m, address, size))
    # device memory to the fake driver: copies to and from it may run later (FAKE_ASYNC=1)
    ctypes.CDLL("libcuda.so.1").fakegpu_track(
        ctypes.c_uint64(address), ctypes.c_size_t(size), ctypes.c_int(-3)
    )
    return Buffer.from_handle(address, size), fd


def buffer(size: int, release: bool = False, except_on_del: bool = True) -> Any:
    """A symmetric buffer (collective: every PE in the same order, as NVSHMEM's). At several
    PEs each part is a memfd that peers open through /proc/<pid>/fd: nothing in /dev/shm,
    nothing left behind by a PE that dies."""
    CALLS.append("buffer")
    _on_its_device("buffer")
    if _state["allocated"] + size > _state["symmetric"]:
        raise RuntimeError(  # nvshmem4py's NvshmemError when nvshmem_malloc returns NULL
            f"fake nvshmem: nvshmem_malloc({size}) failed: the symmetric heap holds "
            f"{_state['symmetric']} bytes (NVSHMEM_SYMMETRIC_SIZE), {_state['allocated']} in use"
        )
    _state["allocated"] += size
    buf = _allocate(size)
    _state.setdefault("live", {})[int(buf.handle)] = size
    weakref.finalize(buf, _implicitly_freed, int(buf.handle), except_on_del)
    return buf


def _allocate(size: int) -> Any:
    dev = _state["device"]
    if _state["nranks"] == 1:
        return dev.allocate(size, stream=dev.default_stream)
    from mpi4py import MPI

    buf, fd = _map(None, size)
    parts = MPI.COMM_WORLD.allgather((os.getpid(), fd, size))
    if len({p[2] for p in parts}) != 1:
        raise AssertionError(f"fake nvshmem: buffer sizes differ between PEs: {parts}")
    _state.setdefault("buffers", {})[int(buf.handle)] = (fd, parts)
    return buf


def get_peer_buffer(buf: Any, pe: int) -> Any:
    CALLS.append("get_peer_buffer")
    known = _state.get("buffers", {}).get(int(buf.handle))
    if known is None or not 0 <= pe < _state["nranks"] or pe == _state["rank"]:
        raise AssertionError(f"fake nvshmem: get_peer_buffer of PE {pe}")
    pid, fd, size = known[1][pe]
    return _map(f"/proc/{pid}/fd/{fd}", size)[0]


def _collective() -> None:
    """``free`` and ``finalize`` are collective in NVSHMEM: a rank that skips one hangs the
    others there, here too."""
    if _state.get("nranks", 1) > 1:
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


def free(buf: Any) -> None:
    CALLS.append("free")
    _on_its_device("free")
    _collective()
    _state["allocated"] -= _state.get("live", {}).pop(int(buf.handle), 0)
    known = _state.get("buffers", {}).pop(int(buf.handle), None)
    if known is not None:  # (peers that mapped it keep their mapping)
        os.close(known[0])
    buf.close()


def barrier_all(stream: Any) -> None:
    CALLS.append("barrier_all")
    _on_its_device("barrier_all")
    if stream is None:
        raise TypeError("fake nvshmem: barrier_all needs a stream")
    if _state.get("nranks", 1) > 1:
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


def quiet(stream: Any = None) -> None:
    CALLS.append("quiet")
    _on_its_device("quiet")


def finalize() -> None:
    CALLS.append("finalize")
    _on_its_device("finalize")
    _collective()
    _state["status"] = InitStatus.STATUS_NOT_INITIALIZED
    if _state.get("nranks", 1) > 1:
        driver = ctypes.CDLL("libcuda.so.1")
        for m, address, size in _state["maps"]:
            driver.fakegpu_untrack(ctypes.c_uint64(address), ctypes.c_size_t(size))
            with contextlib.suppress(BufferError):  # a view still exported: the OS unmaps
                m.close()


def collective_on_buffer(*args: Any, **kwargs: Any) -> Any:
    """NVSHMEM's host collectives: not emulated; in LIMITED_MPG mode NVSHMEM exits the
    process (``exit(-1)``, no exception), and so does this stand-in."""
    if _state["status"] == InitStatus.STATUS_LIMITED_MPG:
        print("fake nvshmem: collective_on_buffer in LIMITED_MPG mode: exit(-1)", flush=True)
        os._exit(255)
    raise AssertionError("fake nvshmem: NVSHMEM's own collectives are not emulated")


def _load_store_only(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("fake nvshmem: every PE here is reachable by load/store")


put = get = signal_op = _load_store_only
