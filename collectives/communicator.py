"""Communicator: scratch symmetric memory, flags and argument checks shared by the collectives.

Synchronisation on a node is pull-style: every rank owns a small array of int64 flags in the
symmetric heap and raises them to the call's sequence number at fixed points (``READY``: my
input is readable; ``SHARD``: my reduced shard is in my scratch; ``DONE``: I have finished
reading peers' memory for this call). Peers poll those flags through zero-copy peer views,
with a deadline. Sequence numbers only grow, so flags are never reset.

Scratch reuse rule: before a rank writes its scratch for call ``s`` it waits until every
node-local peer has posted ``DONE >= s - 1`` (they finished reading it). A rank whose input is
the caller's own SHMEMBuffer (zero-copy) waits for every peer's ``DONE`` of this call before
returning, so the caller may overwrite the input at once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from shmem import SUPPORTED_DTYPES, SHMEMBuffer, SignalPad, World
from shmem.dtypes import as_dtype, dtype_name
from shmem.errors import CollectiveArgumentError, ShmemStateError, SignalTimeoutError
from shmem.signals import poll_until, spin_seconds
from shmem.world import compare_across_ranks

from .ops import accumulate_dtype, check_op
from .schedule import ALGORITHMS, AlgorithmTable

__all__ = ["CommStats", "Communicator"]

log = logging.getLogger(__name__)

_SUPPORTED = frozenset(SUPPORTED_DTYPES.values())
READY, SHARD, DONE, SRC = 0, 1, 2, 3  # SRC: heap offset where my input is readable
_NUM_FLAGS = 8
_BARRIER_SLOTS = 4


@dataclass
class CommStats:
    """Counters: calls made, bytes of inputs copied into scratch (0 on the zero-copy path),
    scratch growths, and calls per algorithm."""

    calls: int = 0
    staged_bytes: int = 0
    scratch_growths: int = 0
    algorithms: dict[str, int] | None = None

    def count(self, algorithm: str) -> None:
        if self.algorithms is None:
            self.algorithms = {}
        self.algorithms[algorithm] = self.algorithms.get(algorithm, 0) + 1


class Operand:
    """A collective's input or output: the flat local array, and the SHMEMBuffer if any."""

    def __init__(self, obj: Any, where: str, name: str) -> None:
        if type(obj) is np.ndarray and obj.ndim == 1 and obj.flags.c_contiguous:
            self.shmem: SHMEMBuffer | None = None
            self.array: np.ndarray[Any, Any] = obj
        elif isinstance(obj, SHMEMBuffer):
            self.shmem = obj
            self.array = obj.local().reshape(-1)
        elif isinstance(obj, np.ndarray):
            self.shmem = None
            if not obj.flags.c_contiguous:
                raise CollectiveArgumentError(
                    f"{where}: {name} must be C-contiguous (got strides {obj.strides}; expected "
                    "a contiguous array: numpy.ascontiguousarray)"
                )
            self.array = obj.reshape(-1)
        else:
            raise CollectiveArgumentError(
                f"{where}: {name} must be a SHMEMBuffer or a numpy array (got {type(obj).__name__})"
            )
        self.obj = obj
        dt = self.array.dtype
        self.dtype = dt if dt in _SUPPORTED else as_dtype(dt, where)
        self.count = self.array.shape[0]


class Communicator:
    """Collectives over a World's ranks on symmetric memory (collective to create).

    Parameters
    ----------
    world : shmem.World
        The ranks; scratch, flags and a signal pad are allocated from its heap once (and the
        scratch grows collectively when a call needs more, up to
        ``[collectives] scratch_max_nbytes``; larger messages are processed in pieces).
    """

    def __init__(self, world: World) -> None:
        self.world = world
        cfg = world.config.collectives
        self.rank, self.world_size = world.rank, world.world_size
        self.num_nodes = world.num_nodes
        self._closed = False
        self._broken = False
        self._pending: list[tuple[MPI.Request, Any]] = []
        self._seq = 0
        self._calls = 0
        self.stats = CommStats()
        self._acc32 = np.dtype(cfg.float32_accumulate)
        self._check_args = cfg.check_args
        rows = AlgorithmTable().rows
        if cfg.one_shot_max_nbytes != "auto":
            from shmem.config import parse_size

            limit = parse_size(cfg.one_shot_max_nbytes)
            rows = tuple((w, limit) for w, _ in rows)
        self.table = AlgorithmTable(rows=rows, forced=cfg.algorithm)
        self._timeout_s = world.config.signal.timeout_s
        self._spin_s = spin_seconds(world.local_size)
        self._gpu: Any = None
        self._cross: MPI.Intracomm | None = None
        if world.backend == "nvshmem":  # GPU kernels over the nvshmem heap (collectives/gpu.py)
            from .gpu import GpuAllReduce

            self._gpu = GpuAllReduce(self)
            world.barrier()
            return
        # node-local peers in local-rank order (world ranks), and my index among them
        node_of = world.comm.allgather((world.node, world.local_rank))
        self.local_peers = [
            r
            for r, _ in sorted(
                ((r, lr) for r, (nd, lr) in enumerate(node_of) if nd == world.node),
                key=lambda t: t[1],
            )
        ]
        self.local_index = self.local_peers.index(self.rank)
        sizes = {sum(1 for nd, _ in node_of if nd == k) for k in range(self.num_nodes)}
        self.uniform_nodes = len(sizes) == 1
        self._flags = world.zeros(_NUM_FLAGS, "int64")
        self._pad_buf = world.zeros(SignalPad.nbytes_for(_BARRIER_SLOTS), "uint8")
        self._pad = SignalPad(world.heap, self._pad_buf.offset, _BARRIER_SLOTS, self._timeout_s)
        self._scratch = world.zeros(max(cfg.scratch_nbytes, 64), "uint8")
        self._stage_views: dict[tuple[int, np.dtype[Any]], np.ndarray[Any, Any]] = {}
        self._input_views: dict[tuple[Any, ...], np.ndarray[Any, Any]] = {}
        self._op_ok: set[tuple[str, np.dtype[Any]]] = set()
        self._plans: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._scratch_max = cfg.scratch_max_nbytes
        self._my_flags = _q(self._flags.local())
        self._peer_flags = {r: _q(cast(np.ndarray, self._flags.peer(r))) for r in self.local_peers}
        if self.num_nodes > 1:
            # uniform nodes: ranks with the same local index, one per node, in node order;
            # otherwise everyone, in rank order (every rank then reduces the whole vector)
            if self.uniform_nodes:
                self._cross = cast(
                    MPI.Intracomm, world.comm.Split(color=world.local_rank, key=world.node)
                )
            else:
                self._cross = cast(MPI.Intracomm, world.comm.Split(color=0, key=world.rank))
        world.barrier()
        log.debug(
            "Communicator: %d ranks, %d node(s), local peers %s, table %s",
            self.world_size,
            self.num_nodes,
            self.local_peers,
            self.table,
        )

    # -- state ---------------------------------------------------------------------------------

    def _live(self, where: str) -> None:
        if self._closed:
            raise ShmemStateError(f"Communicator.{where}: the communicator is closed")
        self.world._check_open(f"Communicator.{where}")

    def close(self) -> None:
        """Release scratch, flags and pad (collective)."""
        if self._closed:
            return
        if self.world._finalized:  # the heap is gone with the World: nothing left to free
            self._closed = True
            return
        if self._gpu is not None:
            self._closed = True
            self._gpu.close()
            return
        if not self._broken:
            self._wait_peers(DONE, self._seq, "close")
        self._closed = True
        for buf in (self._scratch, self._pad_buf, self._flags):
            buf.close()
        if self._cross is not None:
            self._cross.Free()
            self._cross = None

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()

    # -- flags ---------------------------------------------------------------------------------

    def _post(self, flag: int, value: int) -> None:
        self.world.heap.fence()  # release: data written before the flag is visible
        self._my_flags[flag] = value

    def _wait_peers(self, flag: int, value: int, what: str, peers: list[int] | None = None) -> None:
        deadline = 0.0
        for r in self.local_peers if peers is None else peers:
            if r == self.rank:
                continue
            view = self._peer_flags[r]
            if view[flag] >= value:
                continue
            if not deadline:
                deadline = time.monotonic() + self._timeout_s

            def ready(v: memoryview = view) -> bool:
                return bool(v[flag] >= value)

            if not poll_until(ready, deadline, None, self._spin_s):
                name = ("READY", "SHARD", "DONE", "SRC")[flag] if flag < 4 else str(flag)
                raise SignalTimeoutError(
                    f"{what}: rank {self.rank} timed out after {self._timeout_s:g} s waiting for "
                    f"rank {r} ({name} flag: expected >= {value}, last value seen {view[flag]})",
                    operation=what,
                    slot=flag,
                    expected=f">= {value}",
                    last_value=int(view[flag]),
                    peers=(r,),
                )
        self.world.heap.fence()  # acquire

    def mpi_wait(self, req: MPI.Request, what: str, keep: Any = None) -> None:
        """Wait for a non-blocking MPI exchange between nodes, within the deadline."""
        if not poll_until(req.Test, time.monotonic() + self._timeout_s, None, self._spin_s):
            # a non-blocking collective cannot be cancelled: keep it (and its buffers, which
            # the caller's frame holds through ``keep``) alive and retire this communicator
            self._pending.append((req, keep))
            self._broken = True
            raise SignalTimeoutError(
                f"{what}: rank {self.rank} timed out after {self._timeout_s:g} s in the MPI "
                "exchange between nodes (a rank on another node did not arrive)",
                operation=what,
                slot=-1,
                expected="exchange complete",
                last_value=0,
                peers=(),
            )

    @property
    def cross(self) -> MPI.Intracomm:
        """Ranks of other nodes this rank exchanges with (hierarchical algorithms)."""
        if self._cross is None:
            raise ShmemStateError("Communicator.cross: the job has a single node")
        return self._cross

    def publish(
        self, s: int, xin: Operand, scratch_bytes: int, lo: int = 0, hi: int | None = None
    ) -> None:
        """Make my input ``[lo, hi)`` readable by node-local peers and raise ``READY``.

        A SHMEMBuffer is published where it is (zero-copy); a numpy array is copied into my
        scratch first (callers have waited for ``DONE >= s - 1``). The heap offset goes into the
        ``SRC`` flag, so peers find it whatever kind of argument this rank passed.
        """
        hi = xin.count if hi is None else hi
        isz = xin.dtype.itemsize
        if scratch_bytes > self._scratch.nbytes:
            self.scratch(scratch_bytes)
        if xin.shmem is None:
            key = (hi - lo, xin.dtype)
            mine = self._stage_views.get(key)
            if mine is None:
                mine = self._scratch.local()[: (hi - lo) * isz].view(xin.dtype)
                self._stage_views[key] = mine
            np.copyto(mine, xin.array[lo:hi])
            self.stats.staged_bytes += (hi - lo) * isz
            offset = self._scratch.offset
        else:
            offset = xin.shmem.offset + lo * isz
        self._my_flags[SRC] = offset
        self._post(READY, s)

    def peer_input(self, rank: int, count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """Rank ``rank``'s published input (after its READY), as ``count`` elements."""
        offset = self._my_flags[SRC] if rank == self.rank else self._peer_flags[rank][SRC]
        key = (rank, offset, count, dtype)
        cached = self._input_views.get(key)
        if cached is not None:
            return cached
        view = self.world.heap.peer_view(rank, int(offset), count * dtype.itemsize)
        if view is None:
            raise ShmemStateError(f"peer_input: rank {rank} is not on this node")
        typed = view.view(dtype)
        if len(self._input_views) > 4096:
            self._input_views.clear()
        self._input_views[key] = typed
        return typed

    def _next_call(self) -> int:
        self._seq += 1
        self.stats.calls += 1
        return self._seq

    # -- scratch -------------------------------------------------------------------------------

    def scratch(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """My scratch, at least ``nbytes`` (grown collectively; every rank calls it alike)."""
        if nbytes > self._scratch.nbytes:
            self._wait_peers(DONE, self._seq - 1, "scratch growth")
            new = max(nbytes, min(2 * self._scratch.nbytes, self._scratch_max))
            grown = self.world.empty(new, "uint8")  # on failure the old scratch stays intact
            self._scratch.close()
            self._scratch = grown
            self.stats.scratch_growths += 1
            self._stage_views.clear()
            self._input_views.clear()  # offsets inside the old scratch are stale
            self._plans.clear()
        return cast("np.ndarray[Any, np.dtype[np.uint8]]", self._scratch.local())

    def peer_scratch(self, rank: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return cast(np.ndarray, self._scratch.peer(rank))

    @property
    def scratch_capacity(self) -> int:
        """Bytes the scratch may grow to."""
        return max(self._scratch_max, self._scratch.nbytes)

    # -- arguments -----------------------------------------------------------------------------

    def check_op(self, op: str, dtype: np.dtype[Any], where: str) -> None:
        """Raise unless ``op`` applies to ``dtype`` (valid pairs are remembered)."""
        if (op, dtype) not in self._op_ok:
            check_op(op, dtype, where)
            self._op_ok.add((op, dtype))

    def accumulate_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return accumulate_dtype(dtype, self._acc32)

    def check(self, where: str, record: tuple[Any, ...], error: Exception | None) -> None:
        """Debug mode: all ranks compare (call number, collective, arguments) before any flag.

        Without ``[collectives] check_args`` an argument error is raised here, locally
        (ranks validate identically, so with identical arguments all raise together).
        """
        self._calls += 1
        if not self._check_args:
            if error is not None:
                raise error
            return
        compare_across_ranks(self.world.comm, where, self._calls, record, error)

    def _failed(self, seq_before: int) -> None:
        """A call raised: if it had started exchanging flags, peers may be mid-call, so this
        communicator's flag state is no longer in step (close() will not wait on it)."""
        if self._seq != seq_before:
            self._broken = True

    def choose(self, algorithm: str, nbytes: int, where: str) -> str:
        if algorithm == "auto":
            algo = self.table.choose(nbytes, self.world_size, self.num_nodes)
        elif algorithm in ALGORITHMS:
            algo = algorithm
        else:
            raise CollectiveArgumentError(
                f"{where}: unknown algorithm (got {algorithm!r}; expected 'auto' or one of "
                f"{list(ALGORITHMS)})"
            )
        if algo != "hierarchical" and self.num_nodes > 1:
            algo = "hierarchical"  # peers off the node have no peer views
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %d bytes on %d ranks -> %s", where, nbytes, self.world_size, algo)
        self.stats.count(algo)
        return algo

    # -- the collectives -----------------------------------------------------------------------

    def all_reduce(self, x: Any, op: str = "sum", out: Any = None, algorithm: str = "auto") -> Any:
        """Equivalent to ``out = x_0 op x_1 op ... op x_{P-1}`` (left to right, elementwise) on
        every rank, bitwise identical everywhere. See :mod:`collectives.allreduce`."""
        if self._closed or self.world._finalized:
            self._live("all_reduce")
        if self._gpu is not None:
            return self._gpu.all_reduce(x, op, out, algorithm)
        if algorithm == "auto" and (out is None or type(out) is np.ndarray):
            # replay a cached small one-shot call (only where the table picks one-shot, so
            # every rank runs the same protocol whatever kind of argument it passed)
            shm: SHMEMBuffer | None = None
            plan: Any = None
            if type(x) is np.ndarray and x.flags.c_contiguous:
                plan = self._plans.get((x.size, x.dtype, op))
                count = x.size
            elif type(x) is SHMEMBuffer and not x.closed:
                plan = self._plans.get((x.count, x.dtype, op))
                shm, count = x, x.count
            if (
                plan is not None
                and plan.auto
                and plan.scratch is self._scratch
                and _fits(out, x.dtype, count)
            ):
                res = np.empty(x.shape, x.dtype) if out is None else out
                flat = res if res.ndim == 1 else res.reshape(-1)
                src = flat if shm is not None else (x if x.ndim == 1 else x.reshape(-1))
                plan.run(self, src, shm, flat, False)
                algos = self.stats.algorithms
                if algos is not None:
                    algos["one_shot"] = algos.get("one_shot", 0) + 1
                else:
                    self.stats.count("one_shot")
                return res
        seq = self._seq
        try:
            return _allreduce.all_reduce(self, x, op, out, algorithm)
        except BaseException:
            self._failed(seq)
            raise

    def reduce_scatter(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Shard ``rank`` (``schedule.shard_bounds(count, world_size)``) of the all-reduce."""
        self._live("reduce_scatter")
        self._host_only("reduce_scatter")
        seq = self._seq
        try:
            return _reduce_scatter.reduce_scatter(self, x, op, out)
        except BaseException:
            self._failed(seq)
            raise

    def all_gather(self, x: Any, out: Any = None) -> Any:
        """Every rank's ``x`` (same count everywhere) concatenated in rank order."""
        self._live("all_gather")
        self._host_only("all_gather")
        seq = self._seq
        try:
            return _all_gather.all_gather(self, x, out)
        except BaseException:
            self._failed(seq)
            raise

    def broadcast(self, x: Any, root: int = 0, out: Any = None) -> Any:
        """Root's ``x`` on every rank (into ``out``, by default ``x`` itself)."""
        self._live("broadcast")
        self._host_only("broadcast")
        seq = self._seq
        try:
            return _broadcast.broadcast(self, x, root, out)
        except BaseException:
            self._failed(seq)
            raise

    def all_to_all(self, x: Any, out: Any = None) -> Any:
        """Chunk ``j`` of rank ``i``'s ``x`` becomes chunk ``i`` of rank ``j``'s output."""
        self._live("all_to_all")
        self._host_only("all_to_all")
        seq = self._seq
        try:
            return _all_to_all.all_to_all(self, x, out)
        except BaseException:
            self._failed(seq)
            raise

    def barrier(self, timeout: float | None = None) -> None:
        """Every rank of the communicator has arrived (flag barrier on the comm's pad)."""
        self._live("barrier")
        if self._gpu is not None:
            self.world.barrier(timeout)
            return
        self._pad.barrier(timeout)

    def _host_only(self, what: str) -> None:
        if self._gpu is not None:
            raise ShmemStateError(
                f"Communicator.{what}: not available on the nvshmem backend yet (its GPU "
                "kernels cover all_reduce); use a host World (backend='host') for it"
            )


def _fits(out: np.ndarray[Any, Any] | None, dtype: np.dtype[Any], count: int) -> bool:
    return out is None or (
        out.dtype == dtype and out.size == count and out.flags.c_contiguous and out.flags.writeable
    )


def _q(arr: np.ndarray[Any, Any]) -> memoryview:
    return memoryview(cast(Any, arr)).cast("B").cast("q")


def output_array(
    comm: Communicator, out: Any, count: int, dtype: np.dtype[Any], where: str, like: Operand
) -> tuple[Any, np.ndarray[Any, Any]]:
    """``(object to return, flat array to write)`` for an ``out`` argument (None: a new array
    shaped like the input when counts match, else flat)."""
    if out is None:
        shape = like.obj.shape if like.count == count else (count,)
        arr = np.empty(shape, dtype=dtype)
        return arr, arr.reshape(-1)
    if (
        type(out) is np.ndarray
        and out.ndim == 1
        and out.dtype == dtype
        and out.size == count
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        return out, out
    o = Operand(out, where, "out")
    if o.dtype != dtype or o.count != count:
        raise CollectiveArgumentError(
            f"{where}: invalid out (got {o.count} elements of {dtype_name(o.dtype)}; expected "
            f"{count} elements of {dtype_name(dtype)})"
        )
    return out, o.array


# the algorithms import this module's types; importing them last keeps the cycle benign
from . import all_gather as _all_gather  # noqa: E402
from . import all_to_all as _all_to_all  # noqa: E402
from . import allreduce as _allreduce  # noqa: E402
from . import broadcast as _broadcast  # noqa: E402
from . import reduce_scatter as _reduce_scatter  # noqa: E402
