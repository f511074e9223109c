"""Devices: ``shmem.CPU()`` and ``shmem.Accelerator(id)`` (the seed ``max.driver`` devices).

A :class:`Device` names where memory lives and code runs. The host device needs nothing; CUDA
devices are reached through cuda.core, imported only when one is asked for, so
``import shmem`` never needs CUDA.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import ArgumentError, DeviceUnavailableError

if TYPE_CHECKING:
    from .impl import DeviceImpl

__all__ = ["CPU", "Accelerator", "Device", "DeviceAttributes", "MemoryInfo"]

APIS = ("cpu", "cuda")

# Each kind's implementation (shmem.device.host, shmem.device.cuda) builds on contexts and
# buffers, which build on this module: shmem.device's face lends them here on import.
_KINDS: dict[str, Callable[[], Any]] = {}


def lend_kind(api: str, load: Callable[[], Any]) -> None:
    """Name the module that implements devices of ``api``: ``load()`` imports and returns it
    (called by :mod:`shmem.device` on import; CUDA then loads on first use only).

    Parameters
    ----------
    api : str
        ``"cpu"`` or ``"cuda"``.
    load : callable
        Returns the kind's module (``HOST`` for the host; ``device_count`` and
        ``CudaDevice`` for CUDA).
    """
    _KINDS[api] = load


def _kind(api: str) -> Any:
    return _KINDS[api]()


@dataclass(frozen=True)
class MemoryInfo:
    """Free and total bytes of a device's memory.

    Parameters
    ----------
    free : int
        Bytes available for new allocations now.
    total : int
        Bytes the device has in all.
    """

    free: int
    total: int

    def __iter__(self) -> Iterator[int]:
        """``free, total = info`` (the seed's tuple)."""
        return iter((self.free, self.total))


@dataclass(frozen=True)
class DeviceAttributes:
    """What a device offers: ``cores`` on the host; multiprocessor count and compute
    capability (``(major, minor)``) on a GPU.

    Parameters
    ----------
    cores : int or None
        CPU cores this process may run on (the host); ``None`` on a GPU.
    multiprocessor_count : int or None
        Streaming multiprocessors (a GPU); ``None`` on the host.
    compute_capability : tuple of (int, int) or None
        ``(major, minor)`` (a GPU); ``None`` on the host.
    max_threads_per_block : int or None
        The most threads one block may have (a GPU); ``None`` on the host.
    """

    cores: int | None = None
    multiprocessor_count: int | None = None
    compute_capability: tuple[int, int] | None = None
    max_threads_per_block: int | None = None


class Device:
    """A device: ``api`` is ``"cpu"`` or ``"cuda"``, ``id`` its index for that API.

    Devices compare equal by ``(api, id)`` and are hashable. Make them with :func:`CPU` and
    :func:`Accelerator`.

    Parameters
    ----------
    id : int, default 0
        The device's index among its API's devices.
    """

    api: str = "cpu"

    def __init__(self, id: int = 0) -> None:
        self.id = id

    # -- identity -----------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and (self.api, self.id) == (other.api, other.id)

    def __hash__(self) -> int:
        return hash((self.api, self.id))

    def __repr__(self) -> str:
        return f"Device(api={self.api!r}, id={self.id})"

    @property
    def label(self) -> str:
        """``"cpu:0"``, ``"cuda:1"``."""
        return f"{self.api}:{self.id}"

    @property
    def is_host(self) -> bool:
        return self.api == "cpu"

    # -- what subclasses provide --------------------------------------------------------------

    @property
    def impl(self) -> DeviceImpl:
        """The device kind's implementation (memory, copies, streams), one per kind."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def memory_info(self) -> MemoryInfo:
        raise NotImplementedError

    @property
    def attributes(self) -> DeviceAttributes:
        raise NotImplementedError

    @property
    def is_compatible(self) -> bool:
        """Whether this project can run work on the device."""
        raise NotImplementedError

    def can_access(self, peer: Device) -> bool:
        """Whether memory on ``peer`` can be loaded and stored from this device directly.

        Parameters
        ----------
        peer : Device
            The device whose memory would be accessed.

        Returns
        -------
        bool
            True when this device can load and store ``peer``'s memory without a copy.

        Raises
        ------
        NotImplementedError
            On the base class; each device kind answers for itself.
        """
        raise NotImplementedError

    def enable_peer_access(self, peer: Device) -> None:
        """Allow this device to access ``peer``'s memory directly (a no-op when it already can).

        Parameters
        ----------
        peer : Device
            The device whose memory this device should reach.

        Raises
        ------
        DeviceUnavailableError
            When the hardware cannot reach ``peer`` directly.
        NotImplementedError
            On the base class; each device kind implements it.
        """
        raise NotImplementedError

    @staticmethod
    def count(api: str = "cuda") -> int:
        """How many devices of ``api`` this process sees (``"cpu"``: always 1).

        Parameters
        ----------
        api : str, default "cuda"
            ``"cpu"`` or ``"cuda"``.

        Returns
        -------
        int
            The number of devices (0 when CUDA has no driver or no device).

        Raises
        ------
        ArgumentError
            When ``api`` is neither ``"cpu"`` nor ``"cuda"``.
        DeviceUnavailableError
            With ``SHMEM_REQUIRE_GPU=1``, when the CUDA probe finds no driver or fails.
        """
        if api == "cpu":
            return 1
        if api == "cuda":
            return int(_kind("cuda").device_count())
        raise ArgumentError(
            f"Device.count: unknown api (got {api!r}; expected one of {list(APIS)})"
        )


def _meminfo() -> MemoryInfo:
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(free=pages, total=pages)
    total = values.get("MemTotal", 0)
    return MemoryInfo(free=values.get("MemAvailable", values.get("MemFree", total)), total=total)


@functools.cache
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CPUDevice(Device):
    """The host: memory is ordinary (or pinned) host memory, kernels are Python callables."""

    api = "cpu"

    @property
    def impl(self) -> DeviceImpl:
        return cast("DeviceImpl", _kind("cpu").HOST)

    @property
    def name(self) -> str:
        return _cpu_name()

    @property
    def memory_info(self) -> MemoryInfo:
        return _meminfo()

    @property
    def attributes(self) -> DeviceAttributes:
        return DeviceAttributes(cores=_cores())

    @property
    def is_compatible(self) -> bool:
        return True

    def can_access(self, peer: Device) -> bool:
        return peer.api == "cpu"

    def enable_peer_access(self, peer: Device) -> None:
        if not self.can_access(peer):
            raise DeviceUnavailableError(
                f"Device.enable_peer_access: the host cannot load or store {peer.label} memory "
                "directly (expected a cpu device; copy through a DeviceContext instead)"
            )


def CPU(id: int = 0) -> Device:
    """The host device (``id`` must be 0).

    Parameters
    ----------
    id : int, default 0
        The host's index; only 0 exists.

    Returns
    -------
    Device
        The process's single host device.

    Raises
    ------
    ArgumentError
        When ``id`` is not 0.
    """
    if id != 0:
        raise ArgumentError(f"CPU: invalid id (got {id!r}; expected 0)")
    return _HOST


_HOST = CPUDevice(0)


def Accelerator(id: int = 0, api: str = "cuda") -> Device:
    """A GPU (``api="cuda"``).

    Parameters
    ----------
    id : int, default 0
        The GPU's CUDA ordinal (as this process sees it, after ``CUDA_VISIBLE_DEVICES``).
    api : str, default "cuda"
        The accelerator API; only ``"cuda"`` exists.

    Returns
    -------
    Device
        The GPU, one object per ordinal.

    Raises
    ------
    ArgumentError
        When ``api`` is not ``"cuda"`` or ``id`` is not an int >= 0.
    DeviceUnavailableError
        No CUDA driver, cuda.core missing, or no device ``id``.
    """
    if api != "cuda":
        raise ArgumentError(f"Accelerator: unknown api (got {api!r}; expected 'cuda')")
    if isinstance(id, bool) or not isinstance(id, int) or id < 0:
        raise ArgumentError(f"Accelerator: invalid id (got {id!r}; expected an int >= 0)")
    return cast(Device, _kind("cuda").CudaDevice.get(id))


def as_device(device: Any, where: str) -> Device:
    """``None`` -> the host, a :class:`Device` as is, ``"cpu"``/``"cuda:1"`` parsed."""
    if device is None:
        return _HOST
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        api, _, idx = device.partition(":")
        try:
            num = int(idx) if idx else 0
        except ValueError:
            num = -1
        if api == "cpu" and num == 0:
            return _HOST
        if api == "cuda" and num >= 0:
            return Accelerator(num)
    raise ArgumentError(
        f"{where}: invalid device (got {device!r}; expected a Device, 'cpu' or 'cuda:N')"
    )
