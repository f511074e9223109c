"""CUDA devices through cuda.core: the driver handles, device queries, counts and the
runtime's kernel sources (the device third of the CUDA kind)."""

from __future__ import annotations

import functools
import importlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import CudaError, DeviceUnavailableError
from ..devices import Device, DeviceAttributes, MemoryInfo

if TYPE_CHECKING:
    from ..impl import DeviceImpl


KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"  # shmem/kernels
_THREADS = 256
_PEER_ALREADY_ENABLED = 704  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


def _cc() -> Any:
    return importlib.import_module("cuda.core")


def _drv() -> Any:
    return importlib.import_module("cuda.bindings.driver")


def _check(result: Any, call: str) -> Any:
    """Unpack a cuda.bindings ``(err, *values)`` tuple, raising on error."""
    err, *values = result
    if int(err) != 0:
        _, text = _drv().cuGetErrorString(err)
        raise CudaError(f"{call}: CUDA error {int(err)} ({text.decode() if text else '?'})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _driver_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def gpu_required() -> bool:
    """``SHMEM_REQUIRE_GPU=1``: a GPU run, where "no GPU" can only be a failure."""
    from ...config import env_value

    return env_value("SHMEM_REQUIRE_GPU") == "1"


@functools.cache
def device_count() -> int:
    """CUDA devices visible to this process; 0 without a driver or cuda.core (with
    ``SHMEM_REQUIRE_GPU=1``: :class:`DeviceUnavailableError` naming the cause instead)."""
    if not _driver_present():
        if gpu_required():
            raise DeviceUnavailableError(
                "SHMEM_REQUIRE_GPU=1: no NVIDIA driver here (/dev/nvidiactl and /dev/nvidia0 "
                "are missing)"
            )
        return 0
    try:
        count = len(_cc().Device.get_all_devices())
    except Exception as exc:  # no cuda.core, no driver, a broken install: no GPU
        if gpu_required():
            raise DeviceUnavailableError(
                f"SHMEM_REQUIRE_GPU=1: the CUDA probe failed ({type(exc).__name__}: {exc})"
            ) from exc
        return 0
    if count == 0 and gpu_required():
        raise DeviceUnavailableError("SHMEM_REQUIRE_GPU=1: the driver reports no CUDA device")
    return count


def kernel_sources() -> dict[str, str]:
    """The runtime's own CUDA C++ sources, by file name (compiled on first use)."""
    return {p.name: p.read_text() for p in sorted(KERNEL_DIR.glob("*.cu"))}


# -- devices ------------------------------------------------------------------------------------


class CudaDevice(Device):
    """A CUDA device, backed by ``cuda.core.Device``."""

    api = "cuda"
    _instances: dict[int, CudaDevice] = {}  # noqa: RUF012 - one per id, process-wide
    _lock = threading.Lock()

    def __init__(self, id: int) -> None:
        super().__init__(id)
        self._dev = _cc().Device(id)

    @classmethod
    def get(cls, device_id: int) -> CudaDevice:
        count = device_count()
        if not 0 <= device_id < count:
            raise DeviceUnavailableError(
                f"Accelerator({device_id}): no such CUDA device (got id {device_id}; this "
                f"process sees {count} device(s); without a GPU, driver or the 'gpu' extra "
                "it sees none)"
            )
        with cls._lock:
            if device_id not in cls._instances:
                cls._instances[device_id] = cls(device_id)
            return cls._instances[device_id]

    # The CUDA implementation builds on this module; shmem.device.cuda's face lends it.
    _impl: ClassVar[DeviceImpl | None] = None

    @classmethod
    def lend_impl(cls, impl: DeviceImpl) -> None:
        """Serve every CUDA device with ``impl`` (called once, by :mod:`shmem.device.cuda`)."""
        cls._impl = impl

    @property
    def impl(self) -> DeviceImpl:
        assert self._impl is not None, "shmem.device.cuda lends the implementation on import"
        return self._impl

    def current(self) -> Any:
        """Make this device current in this thread and return the cuda.core Device."""
        self._dev.set_current()
        return self._dev

    @property
    def cc_device(self) -> Any:
        return self._dev

    @property
    def name(self) -> str:
        return str(self._dev.name)

    @property
    def memory_info(self) -> MemoryInfo:
        self.current()
        free, total = _check(_drv().cuMemGetInfo(), "cuMemGetInfo")
        return MemoryInfo(free=int(free), total=int(total))

    @property
    def attributes(self) -> DeviceAttributes:
        props = self._dev.properties
        cc = self._dev.compute_capability
        return DeviceAttributes(
            multiprocessor_count=int(props.multiprocessor_count),
            compute_capability=(int(cc.major), int(cc.minor)),
            max_threads_per_block=int(props.max_threads_per_block),
        )

    @property
    def arch(self) -> str:
        """``"sm_90"`` for an H100."""
        return f"sm_{self._dev.arch}"

    @property
    def pci_bus_id(self) -> str:
        raw = _check(_drv().cuDeviceGetPCIBusId(32, self.id), "cuDeviceGetPCIBusId")
        return bytes(raw).split(b"\0", 1)[0].decode()

    @property
    def is_compatible(self) -> bool:
        cc = self._dev.compute_capability
        return (int(cc.major), int(cc.minor)) >= (7, 0)

    def can_access(self, peer: Device) -> bool:
        if peer.api != "cuda":
            return False
        return peer.id == self.id or bool(self._dev.can_access_peer(peer.id))

    def enable_peer_access(self, peer: Device) -> None:
        if peer == self:
            return
        if not self.can_access(peer):
            raise DeviceUnavailableError(
                f"Device.enable_peer_access: {self.label} cannot reach {peer.label} directly "
                "(no P2P path between them; copy through a DeviceContext instead)"
            )
        peer_dev = CudaDevice.get(peer.id)
        peer_cc = peer_dev.current()
        peer_ctx = peer_cc.context.handle
        # Buffers come from the peer's memory pool (cuMemAllocFromPoolAsync), which
        # cuCtxEnablePeerAccess does not map: the pool grants access itself.
        pool = peer_cc.memory_resource
        if hasattr(pool, "peer_accessible_by"):
            pool.peer_accessible_by.add(self.id)
        self.current()
        err, *_ = _drv().cuCtxEnablePeerAccess(peer_ctx, 0)
        if int(err) not in (0, _PEER_ALREADY_ENABLED):
            _check((err,), "cuCtxEnablePeerAccess")


def device_sync(device_id: int) -> None:
    """Wait for all work queued on the device by this process, on every stream
    (``cuCtxSynchronize`` on its primary context)."""
    CudaDevice.get(device_id).current()
    _check(_drv().cuCtxSynchronize(), "cuCtxSynchronize")
