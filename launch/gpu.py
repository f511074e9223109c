"""GPU discovery and binding for ranks: which device a rank uses, from its local rank."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shmem.errors import GpuBindingError

__all__ = ["GpuBindingError", "GpuInfo", "choose_gpu", "visible_gpus"]


@dataclass(frozen=True)
class GpuInfo:
    index: int
    pci_bus_id: str


def choose_gpu(local_rank: int, local_size: int, num_gpus: int, allow_sharing: bool) -> int | None:
    """The GPU index for ``local_rank`` of ``local_size`` ranks on a node with ``num_gpus``.

    None when the node has no GPU. Ranks share GPUs round-robin only when allowed.
    """
    if num_gpus <= 0:
        return None
    if local_size > num_gpus and not allow_sharing:
        raise GpuBindingError(
            f"launch.rank: {local_size} ranks on this node but only {num_gpus} GPU(s) (expected "
            "at most one rank per GPU; pass --allow-gpu-sharing or set [device] "
            "allow_gpu_sharing = true to share)"
        )
    return local_rank % num_gpus


def visible_gpus() -> list[GpuInfo]:
    """The CUDA devices this process can see, with PCI bus ids; [] without a driver.

    Never raises: no device node, no ``cuda.bindings``, or a driver error all mean none.
    """
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")):
        return []
    try:
        from cuda.bindings import driver
    except ImportError:
        return []
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return []
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0:
            return []
        gpus = []
        for i in range(int(count)):
            err, dev = driver.cuDeviceGet(i)
            err2, bus = driver.cuDeviceGetPCIBusId(32, dev)
            bus_id = bus.split(b"\0", 1)[0].decode() if int(err) == 0 and int(err2) == 0 else "?"
            gpus.append(GpuInfo(i, bus_id))
        return gpus
    except Exception:  # a broken driver install must not stop a CPU job
        return []
