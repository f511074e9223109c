"""The symmetric-heap protocol every backend implements.

A heap is one slab per rank, the same size on every rank. Offsets are bytes from the start
of the slab, identical on every rank for the same allocation. Peer access is load/store where
the peer is reachable (``peer_view``) and one-sided ``put_bytes``/``get_bytes``/atomics
otherwise. ``fence`` is a full memory barrier: stores before it are visible to a peer that
observes anything written after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .device.devices import Device

__all__ = ["ATOMIC_DTYPES", "FLOAT_ATOMIC_DTYPES", "DeviceSymmetricHeap", "SymmetricHeap"]

ATOMIC_DTYPES = frozenset(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64))
FLOAT_ATOMIC_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64))
"""Dtypes OpenSHMEM's fetch, set and swap accept besides the integer ones."""


class SymmetricHeap(Protocol):
    """What World, SHMEMBuffer and SignalPad need from a backend."""

    name: str
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    host_size: int
    """Ranks of the job on this machine (``local_size`` but for simulated nodes): waits do
    not spin where they outnumber its cores."""
    node: int
    num_nodes: int
    nbytes: int
    max_alignment: int
    """The largest alignment an allocation can ask for: every rank's slab starts on it."""

    @property
    def device_memory(self) -> bool:
        """Whether the slab is GPU memory (buffers are device Buffers, not numpy views)."""
        ...

    @property
    def release_fence_needed(self) -> bool:
        """Whether :meth:`fence` must separate data stores from the flag store that publishes
        them for a node-local peer (False where the hardware orders stores, as x86-64)."""
        ...

    def is_local(self, rank: int) -> bool:
        """Whether ``rank``'s slab is load/store reachable from this process."""
        ...

    def local_view(self, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]: ...

    def peer_view(
        self, rank: int, offset: int, nbytes: int
    ) -> np.ndarray[Any, np.dtype[np.uint8]] | None: ...

    def rma_target(self, rank: int, offset: int) -> tuple[Any, int] | None:
        """``(MPI window, displacement)`` of heap byte ``offset`` on ``rank`` where a blocking
        put may go straight to MPI (``Put`` + ``Flush``: a rank off this node on the host
        backend), else None (load/store reachable, or device memory)."""
        ...

    def rma_putter(self, nbytes: int, dtype: np.dtype[Any]) -> Any:
        """A ``shmem._rmafast.Putter`` for a buffer of ``nbytes`` of ``dtype`` (its ranks are
        enabled with :meth:`rma_target`'s displacements), or None where puts stay in Python."""
        ...

    def rma_signaller(self, offset: int, slots: int) -> Any:
        """A ``shmem._rmafast.Signaller`` for a signal pad of ``slots`` at heap byte
        ``offset`` (its ranks off this node), or None where signals stay in Python."""
        ...

    def rma_barrier(self, offset: int, slots: int, signaller: Any) -> Any:
        """A ``shmem._rmafast.Barrier`` for the dissemination barrier of the signal pad at heap
        byte ``offset`` (its round words after its ``slots`` user slots; ``signaller``: the
        pad's Signaller of every slot, for the rounds off the node), or None."""
        ...

    def rma_spinner(self) -> Any:
        """``spin(address, cmp, value, spins) -> int | None``: loads of a word of this rank's slab
        in C with the transport's progress between them (``shmem._rmafast.spin``), or None
        where waits poll in Python."""
        ...

    def wait_started(self, req: Any, rank: int, what: str, timeout_s: float | None) -> None:
        """Poll an operation on ``rank`` started by a fast path until it completes, within
        ``timeout_s`` (the heap's deadline when None): ``RemoteTimeoutError`` after."""
        ...

    def complete_signals(self, timeout_s: float | None = None) -> None:
        """Complete the signal this process sent last to a rank off the node, if MPI has not
        yet (a signal returns once started; every later operation through MPI completes it
        first): ``RemoteTimeoutError`` past ``timeout_s`` (the heap's deadline when None)."""
        ...

    def address(self, offset: int) -> int:
        """The virtual address of byte ``offset`` of this rank's slab."""
        ...

    def put_bytes(self, rank: int, offset: int, src: np.ndarray[Any, Any]) -> None:
        """Copy ``src`` into ``rank``'s slab; complete at the target on return."""
        ...

    def get_bytes(self, rank: int, offset: int, dst: np.ndarray[Any, Any]) -> None:
        """Copy from ``rank``'s slab into ``dst``; complete on return."""
        ...

    def atomic_fetch_op(
        self,
        rank: int,
        offset: int,
        value: int,
        dtype: np.dtype[Any],
        op: str,
        timeout_s: float | None = None,
    ) -> int:
        """Atomically apply ``op`` (``"add"``, ``"set"``, ``"fetch"`` (read only), ``"and"``,
        ``"or"``, ``"xor"``) and return the old value; raise
        ``RemoteTimeoutError`` when an off-node peer does not serve it within ``timeout_s``."""
        ...

    def atomic_compare_swap(
        self, rank: int, offset: int, compare: int, value: int, dtype: np.dtype[Any]
    ) -> int:
        """Atomically store ``value`` if the current value equals ``compare``; return the old."""
        ...

    def fence(self) -> None: ...

    def progress(self) -> None:
        """Let the transport serve one-sided operations aimed at this rank."""
        ...

    def close(self, collective: bool = True) -> None: ...


class DeviceSymmetricHeap(SymmetricHeap, Protocol):
    """What callers use of a heap whose slab is GPU memory (``device_memory`` True): device
    addresses instead of host views, and copies on the heap's stream."""

    @property
    def device(self) -> Device:
        """This rank's GPU."""
        ...

    @property
    def stream(self) -> Any:
        """The heap's cuda.core stream (its copies and memsets are ordered on it)."""
        ...

    @property
    def gpu(self) -> Any:
        """This rank's CUDA device object (``.current()`` gives cuda.core's, ``.attributes``)."""
        ...

    def peer_address(self, rank: int, offset: int) -> int | None:
        """The device address of byte ``offset`` of ``rank``'s slab, or None off the node."""
        ...

    def put_device(self, rank: int, offset: int, src_ptr: int, nbytes: int) -> None: ...

    def get_device(self, rank: int, offset: int, dst_ptr: int, nbytes: int) -> None: ...

    def memset(self, offset: int, nbytes: int, value: int = 0) -> None: ...

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a copy of ``nbytes`` between addresses on the heap's stream."""
        ...
