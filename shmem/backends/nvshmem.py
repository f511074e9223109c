"""The NVSHMEM symmetric heap on GPUs, through nvshmem4py (the only module importing nvshmem).

* **Init.** Rank 0 makes a unique id, which is broadcast over mpi4py. Each rank binds its GPU
  from ``local_rank`` (``local_rank % visible devices``, so a launcher that sets
  ``CUDA_VISIBLE_DEVICES`` per rank works too), makes it current, and calls
  ``nvshmem.core.init(..., initializer_method="uid")``.
* **The heap.** One ``nvshmem.core.buffer`` per rank is the heap slab, sub-allocated by the
  World's arena exactly like the host heap. Offsets are therefore the same on every rank.
* **Peers.** ``peer_address`` comes from ``get_peer_buffer`` (``nvshmem_ptr``): a pointer
  this GPU can load and store, for peers on the same node (P2P/NVLink) and for other ranks
  on the same GPU. It is None for unreachable peers (other nodes), whose data moves with
  ``nvshmem`` put/get on the stream. Their local side must be memory NVSHMEM knows (its
  heap, or registered), so data from anywhere else passes through a 4 MiB staging buffer on
  the symmetric heap, made by every rank when any rank has such a peer.
* **Signals, waits and barriers.** These are small kernels (``shmem/kernels/signals.cu``)
  using system-scope release/acquire on peer pointers; in a World with peers on other nodes
  every signal is NVSHMEM's ``signal_op`` instead (one kind of atomic per word). Every wait
  is bounded by a deadline on the GPU's global timer, and a timeout raises
  ``SignalTimeoutError`` on the host.
* **Several ranks on one GPU without MPS** give ``init_status() == LIMITED_MPG``. In that
  mode NVSHMEM's team barriers, ``signal_wait`` on a stream, its collectives and team
  creation call ``exit(-1)``. This module never calls them (:data:`SAFE_IN_LIMITED_MPG`
  lists what it uses, and :meth:`NvshmemHeap.nv` refuses anything else in that mode).
  Spin-waits across processes on one GPU progress by time-slicing: correct, but slow.

What nvshmem4py itself cannot do here, and so is not done: host-initiated atomics on
unreachable peers. ``atomic_*`` needs a peer pointer, so it works within a node; across
nodes it raises.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import BackendUnavailableError, NvshmemError
from .nvshmem_env import environment, symmetric_size

__all__ = ["SAFE_IN_LIMITED_MPG", "NvshmemHeap"]

log = logging.getLogger(__name__)

SAFE_IN_LIMITED_MPG = frozenset(
    {
        "get_unique_id",
        "init",
        "init_status",
        "get_version",
        "buffer",
        "free",
        "get_peer_buffer",
        "barrier_all",
        "put",
        "get",
        "quiet",
        "signal_op",
        "finalize",
    }
)
_KERNELS = "shmem/kernels/signals.cu"
_STAGE_NBYTES = 4 << 20  # staging on the symmetric heap for peers on other nodes
_ATOMIC_OPS = {"add": 0, "set": 1, "cas": 2}
_MODES = {
    0: "not initialised",
    1: "bootstrapped",
    2: "initialised",
    3: "LIMITED_MPG",
    4: "FULL_MPG",
}


def _nodes(comm: Any, node_comm: Any) -> tuple[int, int]:
    """(this rank's node index, node count): nodes numbered by their lowest world rank."""
    leaders = comm.allgather(node_comm.allreduce(comm.Get_rank(), op=_mpi_min()))
    order = sorted(set(leaders))
    return order.index(leaders[comm.Get_rank()]), len(order)


def _mpi_min() -> Any:
    from mpi4py import MPI

    return MPI.MIN


class NvshmemHeap:
    """One NVSHMEM slab per rank on its GPU; see the module docstring."""

    name = "nvshmem"
    device_memory = True
    release_fence_needed = True  # flags are raised by kernels with release semantics

    def __init__(self, comm: Any, node_comm: Any, config: Any) -> None:
        """Start NVSHMEM on this rank's GPU, collectively.

        Long because NVSHMEM starts in one collective sequence that every rank runs in step:
        the device, rank 0's unique id broadcast, init, the symmetric slab, the barrier that
        fixes the mode, and the peer pointers of the node.
        """
        try:
            import nvshmem.core as nv
        except ImportError as exc:
            raise BackendUnavailableError(
                f"init: backend 'nvshmem' needs nvshmem4py (pip install '.[gpu]'): {exc}"
            ) from None
        from ..device import cuda as _cuda
        from ..device.devices import Accelerator

        self._nv = nv
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.local_rank, self.local_size = node_comm.Get_rank(), node_comm.Get_size()
        from .nodes import host_size

        self.host_size = host_size(comm, node_comm)
        self.node, self.num_nodes = _nodes(comm, node_comm)
        self.nbytes = int(config.heap.nbytes)
        self.timeout_s = float(config.signal.timeout_s)
        count = _cuda.device_count()
        if count == 0:
            raise BackendUnavailableError("init: backend 'nvshmem' found no CUDA device")
        self.device = Accelerator(self.local_rank % count)
        self._gpu = _cuda.CudaDevice.get(self.device.id)
        cc_dev = self._gpu.current()
        environment(config.nvshmem, self.num_nodes == 1)
        self.symmetric_nbytes = symmetric_size(self.nbytes)
        uid = nv.get_unique_id(empty=self.rank != 0)
        comm.Bcast(uid._data.view(np.int8), root=0)
        nv.init(
            device=cc_dev,
            uid=uid,
            rank=self.rank,
            nranks=self.world_size,
            initializer_method="uid",
        )
        from cuda.core import StreamOptions

        # blocking, like cudaStreamCreate: ordered after the legacy default stream, where
        # torch/cupy (DLPack) and buffers made without a context do their work
        self.stream = cc_dev.create_stream(options=StreamOptions(nonblocking=False))
        # except_on_del=False: a slab left to the garbage collector after a local teardown
        # (close(collective=False)) is logged by nvshmem4py, not raised from a finalizer
        self._slab = nv.buffer(self.nbytes, except_on_del=False)
        self.base = int(self._slab.handle)
        # the slab's own alignment (NVSHMEM's heap is aligned far beyond a page), up to a page
        self.max_alignment = min(self.base & -self.base, 4096) if self.base else 4096
        nv.barrier_all(self.stream)  # the mode is final once the heap exists
        self.stream.sync()
        status = int(nv.init_status())
        self.mode = _MODES.get(status, str(status))
        self.limited_mpg = status == int(nv.InitStatus.STATUS_LIMITED_MPG)
        version = nv.get_version()
        self.version = str(getattr(version, "libnvshmem_version", version))
        self._peer_buffers: list[Any] = []
        self._peer_base: list[int | None] = []
        for r in range(self.world_size):
            if r == self.rank:  # get_peer_buffer on oneself would leak the slab (nvshmem4py)
                self._peer_base.append(self.base)
                continue
            try:
                pb = nv.get_peer_buffer(self._slab, r)
            except Exception as exc:  # not reachable: put/get through NVSHMEM
                if self.num_nodes == 1:  # every peer of one node should be: say why not
                    log.warning(
                        "nvshmem: rank %d cannot map rank %d's heap on this node (%s: %s); "
                        "it is reached through NVSHMEM put/get",
                        self.rank,
                        r,
                        type(exc).__name__,
                        exc,
                    )
                self._peer_base.append(None)
                continue
            self._peer_buffers.append(pb)
            self._peer_base.append(int(pb.handle))
        # Peers this GPU cannot map (other nodes) are reached by NVSHMEM put/get/signal over
        # the network. Decided for the whole World, so that every rank agrees (collective):
        # - their local side must be memory NVSHMEM knows: a staging buffer on the symmetric
        #   heap (out of SYMMETRIC_RESERVE), which data from elsewhere passes through;
        # - every signal goes through NVSHMEM, to every peer: a network atomic and a GPU
        #   atomic on one word are not atomic with each other (DeviceSignalPad).
        self.remote_peers: bool = max(comm.allgather(any(b is None for b in self._peer_base)))
        self._stage: Any = None
        if self.remote_peers:
            self._stage = nv.buffer(_STAGE_NBYTES, except_on_del=False)
        self._result = self._gpu.current().allocate(16, stream=self.stream)
        self._pinned = np.zeros(2, np.int64)
        self._closed = False
        log.info(
            "nvshmem %s: rank %d/%d on GPU %d (%s), mode %s, %d of %d peers reachable",
            self.version,
            self.rank,
            self.world_size,
            self.device.id,
            self._gpu.name,
            self.mode,
            sum(p is not None for p in self._peer_base),
            self.world_size,
        )

    # -- the NVSHMEM API, guarded ------------------------------------------------------------

    def nv(self, name: str) -> Any:
        """``nvshmem.core.<name>``, refused in LIMITED_MPG mode unless it is safe there."""
        if self.limited_mpg and name not in SAFE_IN_LIMITED_MPG:
            raise NvshmemError(
                f"nvshmem.core.{name} is not safe with several ranks per GPU (LIMITED_MPG: "
                "NVSHMEM would exit the process); start the MPS daemon or use one rank per GPU"
            )
        self._gpu.current()  # NVSHMEM runs host calls on the current context: this GPU's
        return getattr(self._nv, name)

    # -- addresses ---------------------------------------------------------------------------

    def is_local(self, rank: int) -> bool:
        return self._peer_base[rank] is not None

    def address(self, offset: int) -> int:
        return self.base + offset

    def peer_address(self, rank: int, offset: int) -> int | None:
        base = self._peer_base[rank]
        return None if base is None else base + offset

    def local_view(self, offset: int, nbytes: int) -> Any:
        raise NvshmemError(
            "the nvshmem heap is GPU memory: use SHMEMBuffer.local() (a device Buffer), "
            "not a host view"
        )

    def peer_view(self, rank: int, offset: int, nbytes: int) -> None:
        return None  # never host-addressable

    def rma_target(self, rank: int, offset: int) -> None:
        return None  # device memory: nvshmem moves it

    def rma_putter(self, nbytes: int, dtype: np.dtype[Any]) -> None:
        return None

    def rma_signaller(self, offset: int, slots: int) -> None:
        return None

    def rma_barrier(self, offset: int, slots: int, signaller: Any) -> None:
        return None

    def rma_spinner(self) -> None:
        return None

    def wait_started(self, req: Any, rank: int, what: str, timeout_s: float | None) -> None:
        raise NotImplementedError("NvshmemHeap starts no host RMA requests")  # pragma: no cover

    def complete_signals(self, timeout_s: float | None = None) -> None:
        return None  # (device signals complete in the kernels' and the stream's order)

    # -- data movement -----------------------------------------------------------------------

    def _cc_buffer(self, ptr: int, nbytes: int) -> Any:
        from cuda.core import Buffer

        return Buffer.from_handle(ptr, nbytes)

    @property
    def gpu(self) -> Any:
        """This rank's CUDA device (``shmem`` Device; ``.current()`` gives cuda.core's)."""
        return self._gpu

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a copy of ``nbytes`` between addresses on the heap's stream."""
        from ..device import cuda as _cuda

        self._gpu.current()  # the stream is this GPU's: another one may be current here
        _cuda.memcpy_async(dst, src, nbytes, self.stream)

    def _nvshmem_knows(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` is in this rank's slab or staging buffer: memory a
        network transport can read and write (anything else passes through the stage)."""
        for start, size in ((self.base, self.nbytes), (self._stage_base(), _STAGE_NBYTES)):
            if start and start <= ptr and ptr + nbytes <= start + size:
                return True
        return False

    def _stage_base(self) -> int:
        return 0 if self._stage is None else int(self._stage.handle)

    def put_device(self, rank: int, offset: int, src_ptr: int, nbytes: int) -> None:
        """Copy ``nbytes`` of device, pinned or host memory at ``src_ptr`` into ``rank``'s
        slab: a copy to a peer this GPU maps, else NVSHMEM puts (through the stage when the
        source is not memory NVSHMEM knows)."""
        if nbytes == 0:
            return
        target = self.peer_address(rank, offset)
        if target is not None:
            self.memcpy(target, src_ptr, nbytes)
        elif self._nvshmem_knows(src_ptr, nbytes):
            self._put(rank, offset, src_ptr, nbytes)
        else:
            stage = self._stage_base()
            for at in range(0, nbytes, _STAGE_NBYTES):
                n = min(_STAGE_NBYTES, nbytes - at)
                self.memcpy(stage, src_ptr + at, n)  # stream order: then the put reads it
                self._put(rank, offset + at, stage, n)
        self.stream.sync()

    def get_device(self, rank: int, offset: int, dst_ptr: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``rank``'s slab into device, pinned or host memory at
        ``dst_ptr`` (through the stage, as :meth:`put_device`)."""
        if nbytes == 0:
            return
        source = self.peer_address(rank, offset)
        if source is not None:
            self.memcpy(dst_ptr, source, nbytes)
        elif self._nvshmem_knows(dst_ptr, nbytes):
            self._get(rank, offset, dst_ptr, nbytes)
        else:
            stage = self._stage_base()
            for at in range(0, nbytes, _STAGE_NBYTES):
                n = min(_STAGE_NBYTES, nbytes - at)
                self._get(rank, offset + at, stage, n)
                self.memcpy(dst_ptr + at, stage, n)
        self.stream.sync()

    def _put(self, rank: int, offset: int, src_ptr: int, nbytes: int) -> None:
        if self._stage is None:  # only a World with remote peers reaches here
            raise NvshmemError(f"put to rank {rank}: not reachable and no staging buffer")
        self.nv("put")(
            self._cc_buffer(self.base + offset, nbytes),
            self._cc_buffer(src_ptr, nbytes),
            remote_pe=rank,
            stream=self.stream,
        )
        self.nv("quiet")(stream=self.stream)

    def _get(self, rank: int, offset: int, dst_ptr: int, nbytes: int) -> None:
        if self._stage is None:
            raise NvshmemError(f"get from rank {rank}: not reachable and no staging buffer")
        self.nv("get")(
            self._cc_buffer(dst_ptr, nbytes),
            self._cc_buffer(self.base + offset, nbytes),
            remote_pe=rank,
            stream=self.stream,
        )

    def put_bytes(self, rank: int, offset: int, src: np.ndarray[Any, Any]) -> None:
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        self.put_device(rank, offset, int(data.ctypes.data), data.nbytes)  # UVA: host memory

    def get_bytes(self, rank: int, offset: int, dst: np.ndarray[Any, Any]) -> None:
        raw = dst.reshape(-1).view(np.uint8)
        self.get_device(rank, offset, int(raw.ctypes.data), raw.nbytes)

    def memset(self, offset: int, nbytes: int, value: int = 0) -> None:
        from ..device import cuda as _cuda

        self._gpu.current()
        _cuda.memset_async(self.base + offset, value, nbytes, self.stream)
        self.stream.sync()

    # -- kernels -------------------------------------------------------------------------------

    def launch(self, name: str, *args: Any) -> None:
        from ..device import cuda as _cuda

        self._gpu.current()
        _cuda.launch(self.stream, _cuda.kernel(self.device.id, _KERNELS, name), 1, 32, *args)

    def result(self) -> tuple[int, int]:
        """The two int64 a kernel wrote to the result slot (synchronises the stream)."""
        self.memcpy(int(self._pinned.ctypes.data), int(self._result.handle), 16)
        self.stream.sync()
        return int(self._pinned[0]), int(self._pinned[1])

    @property
    def result_ptr(self) -> int:
        return int(self._result.handle)

    def _atomic(self, rank: int, offset: int, op: str, value: int, compare: int, dtype: Any) -> int:
        target = self.peer_address(rank, offset)
        if target is None:
            raise NvshmemError(
                f"atomics on rank {rank}: it is not reachable by load/store from rank "
                f"{self.rank} (another node); host-initiated NVSHMEM atomics are not "
                "available through nvshmem4py"
            )
        width = np.dtype(dtype).itemsize
        mask = (1 << (8 * width)) - 1
        self.launch(
            "shmem_atomic",
            np.uint64(target),
            np.int32(width),
            np.int32(_ATOMIC_OPS[op]),
            np.uint64(int(value) & mask),
            np.uint64(int(compare) & mask),
            np.uint64(self.result_ptr),
        )
        old = self.result()[0] & mask
        if np.dtype(dtype).kind == "i" and old >> (8 * width - 1):
            old -= 1 << (8 * width)
        return int(old)

    def atomic_fetch_op(
        self,
        rank: int,
        offset: int,
        value: int,
        dtype: np.dtype[Any],
        op: str,
        timeout_s: float | None = None,
    ) -> int:
        if op == "fetch":  # an atomic read is a fetch-add of zero
            return self._atomic(rank, offset, "add", 0, 0, dtype)
        if op not in _ATOMIC_OPS:
            raise NvshmemError(
                f"atomic_fetch_op: op {op!r} is not implemented on the nvshmem backend yet "
                "(got it on a GPU heap; expected 'add', 'set' or 'fetch', or use a host World)"
            )
        return self._atomic(rank, offset, op, value, 0, dtype)

    def atomic_compare_swap(
        self, rank: int, offset: int, compare: int, value: int, dtype: np.dtype[Any]
    ) -> int:
        return self._atomic(rank, offset, "cas", value, compare, dtype)

    def fence(self) -> None:
        self.stream.sync()

    def progress(self) -> None:
        pass

    def barrier_all(self) -> None:
        self.nv("barrier_all")(self.stream)
        self.stream.sync()

    def close(self, collective: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if not collective and self.world_size > 1:
            # peers may be gone and NVSHMEM's free and finalize are collective (they would
            # hang here): release what is this rank's alone; the slab stays with NVSHMEM
            self._release_local()
            return
        self._release_local(sync=collective)
        try:  # every PE in step, or one PE alone: nobody to wait for
            if self._stage is not None:
                self.nv("free")(self._stage)
                self._stage = None
            self.nv("free")(self._slab)
            self.nv("finalize")()
            self.stream.close()
        except Exception as exc:
            if collective:
                raise
            log.warning(
                "nvshmem: teardown of the one PE after an error: %s: %s", type(exc).__name__, exc
            )

    def _release_local(self, sync: bool = False) -> None:
        """Free this rank's own device memory (the result words) and drop the peer mappings;
        after an error (``sync`` false) a failure here is only logged."""
        try:
            self._gpu.current()
            if sync:
                self.stream.sync()
            self._result.close(self.stream)
        except Exception as exc:
            if sync:
                raise
            log.warning(
                "nvshmem: local teardown of rank %d: %s: %s", self.rank, type(exc).__name__, exc
            )
        self._peer_buffers.clear()
