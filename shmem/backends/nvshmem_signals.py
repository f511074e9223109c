"""The nvshmem backend's signal pad: flags in GPU memory, signalled and waited on by kernels
(``shmem/kernels/signals.cu``) with system-scope release/acquire and a deadline on the GPU
timer.

In a World with peers on other nodes every signal, to every peer, is NVSHMEM's
``signal_op``: a word that one peer adds to over the network and another with a GPU atomic
could lose an addition (network and GPU atomics are not atomic with each other), so one kind
of atomic touches each word."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import NvshmemError, SignalTimeoutError
from ..signals import SLOT_DTYPE, SignalPad

if TYPE_CHECKING:
    from .nvshmem import NvshmemHeap

__all__ = ["DeviceSignalPad"]

_CMP = {"eq": 0, "ne": 1, "gt": 2, "ge": 3, "lt": 4, "le": 5}
_MASK = (1 << 64) - 1


def _cuda_sync(heap: NvshmemHeap) -> None:
    from ..device import cuda as _cuda

    _cuda.device_sync(heap.device.id)


class DeviceSignalPad(SignalPad):
    """A :class:`~shmem.signals.SignalPad` whose flags live on the GPU heap.

    Same API and semantics; signals, reads and waits are kernels on the heap's stream, with
    system-scope release/acquire and a deadline on the GPU timer. The barrier is one kernel
    when every peer is reachable, else the pad's dissemination barrier over these signals.
    """

    def __init__(self, heap: NvshmemHeap, offset: int, slots: int, timeout_s: float) -> None:
        self._heap = heap
        self._gpu_heap = heap
        self.offset = offset
        self.slots = slots
        self.timeout_s = timeout_s
        self._epoch = 0
        self._size = heap.world_size
        self._spin_s = 0.0
        heap.memset(offset, self.nbytes_for(slots))
        self._pads: Any = None
        if not heap.remote_peers:  # (every rank agrees: one barrier algorithm for all)
            table = np.array(
                [
                    heap.peer_address(r, offset + slots * SLOT_DTYPE.itemsize)
                    for r in range(self._size)
                ],
                dtype=np.uint64,
            )
            self._pads = heap._gpu.current().allocate(table.nbytes, stream=heap.stream)
            heap.memcpy(int(self._pads.handle), int(table.ctypes.data), table.nbytes)
            heap.stream.sync()

    def _slot_offset(self, slot: int) -> int:
        return self.offset + slot * SLOT_DTYPE.itemsize

    def _raw_signal(
        self, rank: int, slot: int, value: int, op: str, timeout_s: float | None = None
    ) -> None:
        heap = self._gpu_heap
        # release: every write this process queued on the GPU (any stream: the World's
        # context, torch, cupy) completes before the flag
        _cuda_sync(heap)
        value &= (1 << 64) - 1
        # a GPU atomic only where no word is ever signalled over a network
        target = None if heap.remote_peers else heap.peer_address(rank, self._slot_offset(slot))
        if target is not None:
            heap.launch(
                "shmem_signal",
                np.uint64(target),
                np.uint64(value),
                np.int32(0 if op == "set" else 1),
            )
        else:
            nv = heap._nv
            heap.nv("signal_op")(
                heap._cc_buffer(heap.address(self._slot_offset(slot)), 8),
                value,
                nv.SignalOp.SIGNAL_SET if op == "set" else nv.SignalOp.SIGNAL_ADD,
                remote_pe=rank,
                stream=heap.stream,
            )
            heap.nv("quiet")(stream=heap.stream)
        heap.stream.sync()

    def read(self, slot: int) -> int:
        self._check_slot("read", slot)
        out = np.zeros(1, np.int64)
        heap = self._gpu_heap
        heap.memcpy(int(out.ctypes.data), heap.address(self._slot_offset(slot)), 8)
        heap.stream.sync()
        return int(out[0]) & _MASK  # unsigned words

    def _raw_wait(
        self,
        operation: str,
        slot: int,
        cmp: str,
        value: int,
        timeout: float | None,
        peers: tuple[int, ...],
        context: str = "",
    ) -> int:
        timeout_s = self.timeout_s if timeout is None else timeout
        if timeout_s < 0:
            raise NvshmemError(
                f"{operation}: invalid timeout (got {timeout_s}; expected >= 0 seconds)"
            )
        heap = self._gpu_heap
        heap.launch(
            "shmem_wait_until",
            np.uint64(heap.address(self._slot_offset(slot))),
            np.int32(_CMP[cmp]),
            np.uint64(value & _MASK),  # unsigned words, compared unsigned
            np.uint64(int(timeout_s * 1e9)),
            np.uint64(heap.result_ptr),
        )
        seen, ok = heap.result()
        seen &= _MASK
        if not ok:
            self._timeout(operation, slot, cmp, value, seen, timeout_s, peers, context)
        return seen

    def barrier(self, timeout: float | None = None) -> None:
        if self._pads is None:
            super().barrier(timeout)
            return
        heap = self._gpu_heap
        timeout_s = self.timeout_s if timeout is None else timeout
        self._epoch += 1
        heap.launch(
            "shmem_barrier",
            np.uint64(int(self._pads.handle)),
            np.int32(heap.rank),
            np.int32(heap.world_size),
            np.uint64(self._epoch),
            np.uint64(int(timeout_s * 1e9)),
            np.uint64(heap.result_ptr),
        )
        round_, last = heap.result()
        if round_ >= 0:
            self._epoch -= 1  # a retry resumes this barrier
            src = (heap.rank - (1 << round_)) % heap.world_size
            raise SignalTimeoutError(
                f"barrier: rank {heap.rank} timed out after {timeout_s:g} s in round {round_} "
                f"of barrier {self._epoch + 1} waiting for rank {src} (last value seen {last})",
                operation="barrier",
                slot=self.slots + round_,
                expected=f">= {self._epoch + 1}",
                last_value=last,
                peers=(src,),
            )

    def flags_view(self) -> Any:
        raise NvshmemError("flags_view: the nvshmem pad is GPU memory; use read(slot)")

    def close(self) -> None:
        if self._pads is not None:
            self._pads.close(self._gpu_heap.stream)
            self._pads = None
