"""All-reduce on GPUs: the CUDA kernels of ``collectives/kernels/allreduce.cu`` over the
nvshmem heap's peer pointers (the Communicator's path when the World's backend is nvshmem).

One kernel launch per call (per piece, for inputs larger than the scratch). Each rank copies its
input into its symmetric scratch inside the kernel. Ranks meet in numbered cross-rank stages
(system-scope release/acquire flags; see the kernel file). Two algorithms:

* ``one_shot``: every rank reduces every element from every rank's scratch;
* ``two_shot``: each rank reduces its shard into a symmetric results buffer, then copies
  every shard.

Both reduce in rank order in float32 (float16/bfloat16), float32 or float64 (float32, as
``[collectives] float32_accumulate`` says) or float64, rounding once. Results are therefore
bitwise the same on every rank, for both algorithms, and equal to the host backend's
(``collectives.ops.reduce_into``).

Ordering (as NCCL's): the kernel is queued on ``stream=`` (a GPU DeviceContext, or another
library's stream: anything with ``__cuda_stream__``, e.g. a torch or cupy stream; default the
World's context, where SHMEMBuffer copies are queued) after the work already on it; there is
no device-wide synchronize. Inputs written on another stream must be ordered before the call
by the caller (``stream.enqueue_wait_for(other)``, or that library's synchronize). The call
then waits on the host for that one stream, to read the kernel's status word (a peer timeout
is raised here, not later): it is host-blocking, and the result is complete on return. A peer
that does not arrive within ``[signal] timeout_s`` makes the kernel give up; this rank raises
``SignalTimeoutError`` and the communicator is then unusable (its stages are out of step).

CUDA graphs: the stage numbers live on the device (each rank's last published stage beside
its arrival counter; see the kernel file), so a call made while ``stream`` captures a graph
is recorded and every replay runs the next stages. While capturing, the call does not wait
(nothing runs yet); a replay that times out or meets a mismatch leaves the status word set,
every later launch returns at once, and the next eager call raises. Captured calls need
device inputs and outputs (numpy would be copied on the host at capture time).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from shmem import Buffer
from shmem import cuda as shmem_cuda
from shmem.agreement import allgather_within, compare_across_ranks
from shmem.dtypes import dtype_name
from shmem.errors import (
    ArgumentError,
    CollectiveMismatchError,
    GpuCollectiveError,
    ShmemError,
    SignalTimeoutError,
)
from shmem.heap import DeviceSymmetricHeap

from .interop import to_device_buffer
from .ops import OPS, accumulate_dtype, check_op, fused_out_dtype
from .signature import describe, signature

if TYPE_CHECKING:
    from shmem import World

    from .stats import CommStats

__all__ = ["GPU_DTYPES", "GPU_OPS", "GpuAllReduce", "check_reducible", "grid_blocks"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

GPU_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")  # a kernel per op
# a kernel per dtype, the op a runtime argument (see the kernel file)
GPU_OP_ARG_DTYPES = (
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
    "float8_e4m3",
    "float8_e5m2",
    "complex64",
    "complex128",
)
GPU_DTYPES = GPU_FLOAT_DTYPES + GPU_OP_ARG_DTYPES  # every host dtype but long double
GPU_OPS = OPS
OP_CODES = {op: i for i, op in enumerate(OPS)}  # the kernels' OP_* numbers
KERNELS = "collectives/kernels/allreduce.cu"
THREADS = 512
STAGES = {"one_shot": 2, "two_shot": 3}
ONE_SHOT_MAX_NBYTES = 512 << 10  # measured crossover to fill in on a GPU (docs/gpu-validation)


def check_reducible(dtype: np.dtype[Any], op: str, where: str) -> None:
    """Raise unless the GPU kernels reduce ``dtype`` with ``op`` (the host's rules, and a
    GPU type for the dtype: every host dtype but long double)."""
    name = dtype_name(dtype)
    if name not in GPU_DTYPES:
        raise GpuCollectiveError(
            f"{where}: a GPU has no long double type (got {name}; reduce it on the host "
            f"backend; the GPU reductions take {list(GPU_DTYPES)})"
        )
    check_op(op, dtype, where)


def grid_blocks(count: int, multiprocessors: int) -> int:
    """Blocks of :data:`THREADS` for ``count`` elements: at least 4 elements per thread, at
    most one block per multiprocessor (every block must be resident: they wait for each
    other; the launch is cooperative)."""
    return max(1, min(multiprocessors, math.ceil(count / (THREADS * 4))))


class GpuAllReduce:
    """The GPU all-reduce of one Communicator, and the stages and scratch it runs on
    (collective construction and close); the rest of the family runs on them too
    (:class:`collectives.gpu_family.GpuCollectives`)."""

    def __init__(self, world: World, stats: CommStats, acc32: np.dtype[Any]) -> None:
        self.stats = stats
        self.world = world
        self.heap = cast(DeviceSymmetricHeap, world.heap)
        self.rank, self.size = world.rank, world.world_size
        self.check_args = world.config.collectives.check_args
        # its own communicator for the argument checks and close's agreement: Communicators
        # used at once by several threads never match each other's exchanges
        self.mpi = world.comm.Dup()
        self.calls = 0  # calls compared across ranks (check_args)
        self.signature = 0  # the current call's (collectives.signature), compared in-kernel
        unreachable = [r for r in range(self.size) if not self.heap.is_local(r)]
        self._unreachable = unreachable
        cfg = world.config.collectives
        self.capacity = max(int(cfg.scratch_nbytes), 1 << 20)
        self.scratch = world.zeros(self.capacity, "uint8")
        self.results = world.zeros(self.capacity, "uint8")
        # per rank: each sender's stage, then each sender's call signature
        self.flags = world.zeros(2 * self.size, "uint64")
        gpu = self.heap.gpu.current()
        stream = self.heap.stream
        # u32 arrival counter, i32 status, u64 epoch (the last published stage): the stage
        # numbers live on the device, so a call captured in a CUDA graph replays correctly
        self._arrive = gpu.allocate(16, stream=stream)
        shmem_cuda.memset_async(int(self._arrive.handle), 0, 16, stream)
        self._tables = gpu.allocate(3 * 8 * self.size, stream=stream)
        if not unreachable:
            table = np.array(
                [
                    [self.heap.peer_address(r, buf.offset) for r in range(self.size)]
                    for buf in (self.scratch, self.results, self.flags)
                ],
                dtype=np.uint64,
            )
            self.heap.memcpy(int(self._tables.handle), int(table.ctypes.data), table.nbytes)
        stream.sync()
        self._status = np.zeros(1, np.int32)
        self._sms = int(self.heap.gpu.attributes.multiprocessor_count or 1)
        self._acc64 = accumulate_dtype(np.dtype(np.float32), acc32) == np.dtype(np.float64)
        self.broken = False
        # compile (or load from the kernel cache) now, before the peers start waiting
        shmem_cuda.compile_module(self.heap.device.id, KERNELS)

    # -- the call ------------------------------------------------------------------------------

    def _kernel(
        self, algorithm: str, dtype: np.dtype[Any], op: str, out_dtype: np.dtype[Any]
    ) -> Any:
        name = dtype_name(dtype)
        if name in GPU_OP_ARG_DTYPES:  # the op is the launch's argument
            return shmem_cuda.load_kernel(
                self.heap.device.id, KERNELS, f"allreduce_{algorithm}_{name}_op"
            )
        if name == "float32" and self._acc64:
            name = "float32_acc64"
        if out_dtype != dtype:  # float32 out of a 16-bit input
            name += "_to_float32"
        return shmem_cuda.load_kernel(
            self.heap.device.id, KERNELS, f"allreduce_{algorithm}_{name}_{op}"
        )

    def _check_stream(self, stream: object, where: str) -> shmem_cuda.CudaStream:
        """The cuda.core stream of ``stream=`` (a GPU DeviceContext of this rank's device, or
        another library's stream: anything with ``__cuda_stream__``); default: the World's
        context, where SHMEMBuffer copies are queued."""
        try:
            got = shmem_cuda.as_stream(stream, self.heap.device, where)
        except ArgumentError as exc:
            raise GpuCollectiveError(str(exc)) from None
        return got if got is not None else self.world.ctx.stream

    def _source(self, x: Any, where: str) -> Buffer:
        """``x`` on this rank's GPU, once this communicator can run a call at all."""
        if self.broken:
            raise GpuCollectiveError(
                f"{where}: this communicator's GPU stages are out of step after an earlier "
                "failure; make a new Communicator"
            )
        if self._unreachable:
            raise GpuCollectiveError(
                f"{where}: ranks {self._unreachable} are not load/store reachable from rank "
                f"{self.rank} (other nodes); the GPU collectives need every peer on this node"
            )
        return to_device_buffer(x, self.heap.device, where)

    def _check(self, x: Any, op: str, where: str) -> Buffer:
        buf = self._source(x, where)
        check_reducible(buf.dtype, op, where)
        return buf

    def all_reduce(
        self,
        x: Any,
        op: str = "sum",
        out: Any = None,
        algorithm: str = "auto",
        *,
        stream: object = None,
        out_dtype: Any = None,
        scale: float | None = None,
    ) -> object:
        """``x`` and ``out``: GPU Buffers, SHMEMBuffers, DLPack GPU arrays or numpy arrays
        (copied to and from the GPU). Returns ``out``, or a new array like ``x`` (numpy for
        numpy, else a GPU Buffer). ``stream``: where the call is ordered (see the module
        docstring). ``out_dtype`` (float32 for a 16-bit input) and ``scale`` (a factor
        applied in the accumulation type before the one rounding) are fused into the
        kernel."""
        where = "Communicator.all_reduce"
        src, dst, algo, host_out, cu_stream = self._agreed(
            where,
            lambda: self._validate(x, op, out, algorithm, stream, where, out_dtype, scale),
            lambda c: (c[0], (op, c[2])),
        )
        n, item = src.num_elements, max(src.element_size, dst.element_size)
        step = self.capacity // item  # (the results buffer holds the output type)
        factor = 1.0 if scale is None else float(scale)
        for lo in range(0, n, step):
            count = min(step, n - lo)
            self._launch(algo, src, dst, lo, count, op, factor, cu_stream)
        self.stats.count(algo)
        if isinstance(out, np.ndarray):
            np.copyto(out, dst.to_numpy().reshape(out.shape))  # any layout of out
            return out
        if host_out:
            return dst.to_numpy().reshape(np.shape(x))
        return out if out is not None else dst

    def _agreed(
        self,
        where: str,
        validate: Callable[[], _T],
        summary: Callable[[_T], tuple[Buffer, tuple[object, ...]]],
    ) -> _T:
        """``validate()``'s result, after ``[collectives] check_args`` compared the call
        across ranks (``summary``: the source and the arguments besides count and dtype);
        an invalid argument raises on every rank then, else on this rank."""
        error: Exception | None = None
        checked: _T | None = None
        try:
            checked = validate()
        except (ValueError, TypeError, ShmemError) as exc:
            error = exc
        name = where.rsplit(".", 1)[-1]
        record: tuple[object, ...] = (name, "invalid")
        if checked is not None:
            src, extra = summary(checked)
            record = (name, src.num_elements, dtype_name(src.dtype), *extra)
        # always on: the kernels compare every rank's signature when the inputs are staged
        self.signature = signature(record) if error is None else 0
        if self.check_args:
            self.calls += 1
            compare_across_ranks(
                self.mpi,
                where,
                self.calls,
                record,
                error,
                self.world.config.signal.timeout_s,
                self.heap.progress,
            )
        if error is not None or checked is None:
            raise error if error is not None else GpuCollectiveError(f"{where}: invalid arguments")
        return checked

    def _validate(
        self,
        x: Any,
        op: str,
        out: Any,
        algorithm: str,
        stream: object,
        where: str,
        out_dtype: Any = None,
        scale: float | None = None,
    ) -> tuple[Buffer, Buffer, str, bool, Any]:
        """``(source, destination, algorithm, result goes to the host, stream)`` after the
        checks every rank makes alike."""
        cu_stream = self._check_stream(stream, where)
        src = self._check(x, op, where)
        odt = fused_out_dtype(src.dtype, out_dtype, scale, where)
        if odt != src.dtype and dtype_name(src.dtype) not in ("float16", "bfloat16"):
            raise GpuCollectiveError(
                f"{where}: on the GPU out_dtype may widen float16 or bfloat16 to float32 (got "
                f"{dtype_name(src.dtype)} to {dtype_name(odt)})"
            )
        host_out = isinstance(out, np.ndarray) or (out is None and isinstance(x, np.ndarray))
        if out is None or isinstance(out, np.ndarray):
            dst = Buffer(odt, src.shape, device=self.heap.device, stream=self.world.ctx)
            if isinstance(out, np.ndarray) and (
                out.dtype != odt or out.size != src.num_elements or not out.flags.writeable
            ):
                raise GpuCollectiveError(
                    f"{where}: out does not match x (got {out.dtype} {out.size} elements, "
                    f"writeable {out.flags.writeable}; expected a writeable "
                    f"{dtype_name(odt)} array of {src.num_elements})"
                )
        else:
            dst = to_device_buffer(out, self.heap.device, where, output=True)
            if dst.dtype != odt or dst.num_elements != src.num_elements:
                raise GpuCollectiveError(
                    f"{where}: out does not match x (got {dtype_name(dst.dtype)} "
                    f"{dst.num_elements} elements; expected {dtype_name(odt)} "
                    f"{src.num_elements})"
                )
        # stream-ordered: after the work already on the caller's stream; no device-wide
        # synchronize
        n, item = src.num_elements, src.element_size
        algo = algorithm
        if algo == "auto":
            algo = "one_shot" if n * item <= ONE_SHOT_MAX_NBYTES or self.size == 1 else "two_shot"
        if algo not in STAGES:
            raise GpuCollectiveError(
                f"{where}: unknown algorithm (got {algorithm!r}; expected auto, one_shot or "
                "two_shot on the GPU)"
            )
        return src, dst, algo, host_out, cu_stream

    def _launch(
        self,
        algo: str,
        src: Buffer,
        dst: Buffer,
        first: int,
        count: int,
        op: str,
        scale: float,
        stream: shmem_cuda.CudaStream,
    ) -> None:
        tables = int(self._tables.handle)
        scratch_t, results_t = tables, tables + 8 * self.size
        data: list[Any] = [
            np.uint64(src.unsafe_ptr() + first * src.element_size),
            np.uint64(scratch_t),
        ]
        if algo == "two_shot":
            data.append(np.uint64(results_t))
        data += [
            np.uint64(dst.unsafe_ptr() + first * dst.element_size),
            np.uint64(count),
            np.float64(scale),
        ]
        if dtype_name(src.dtype) in GPU_OP_ARG_DTYPES:
            data.append(np.int32(OP_CODES[op]))
        fn = self._kernel(algo, src.dtype, op, dst.dtype)
        self._staged(
            "all_reduce", algo, fn, grid_blocks(count, self._sms), data, STAGES[algo], stream
        )

    def _staged(
        self,
        name: str,
        algo: str,
        fn: Any,
        blocks: int,
        data: list[Any],
        stages: int,
        stream: shmem_cuda.CudaStream,
    ) -> None:
        """Launch one staged kernel (``data``, then the stage arguments) and check its status
        word: a peer that did not arrive in time is a :class:`SignalTimeoutError` here."""
        size = self.size
        tables = int(self._tables.handle)
        arrive = int(self._arrive.handle)
        status = arrive + 4
        sync = (
            np.uint64(tables + 16 * size),  # the flags table
            np.uint64(arrive),
            np.uint32(0),  # arrival base and first stage: 0, the kernel reads the device's
            np.uint64(0),
            np.uint64(int(self.world.config.signal.timeout_s * 1e9)),
            np.uint64(status),
            np.int32(self.rank),
            np.int32(size),
            np.uint64(self.signature),
        )
        shmem_cuda.launch(stream, fn, blocks, THREADS, *data, *sync, cooperative=True)
        if shmem_cuda.is_capturing(stream):
            # recorded into the caller's CUDA graph: nothing to wait for now; a replay that
            # fails leaves the status word set, and the next eager call raises it
            return
        shmem_cuda.memcpy_async(int(self._status.ctypes.data), status, 4, stream)
        stream.sync()  # the status word: a peer timeout is raised by this call
        if self._status[0] < 0:  # rank q's call differs (compared in the kernel)
            self.broken = True
            q = -int(self._status[0]) - 1
            words = self.flags.local().to_numpy()
            raise CollectiveMismatchError(
                f"Communicator.{name}: ranks called different collectives (rank {self.rank}: "
                f"{describe(self.signature)}; rank {q}: {describe(int(words[size + q]))})"
            )
        if self._status[0]:
            self.broken = True
            wait = int(self._status[0])
            what = "to finish the previous call" if wait == 1 else f"at step {wait - 1}"
            raise SignalTimeoutError(
                f"Communicator.{name} ({algo}): rank {self.rank} timed out after "
                f"{self.world.config.signal.timeout_s:g} s waiting for every rank {what} "
                f"(a peer failed or is not calling {name})",
                operation=name,
                slot=-1,
                expected=f"every rank {what}",
                last_value=-1,
            )

    def close(self) -> None:
        """Free the symmetric buffers (collective: after every peer finished its last call)
        and the communicator; see :meth:`_close_buffers`."""
        if self._close_buffers() and self.mpi:
            self.mpi.Free()  # (kept with the scratch: a later close may agree again)

    def _close_buffers(self) -> bool:
        """Free the symmetric buffers (collective: after every peer finished its last call).

        A peer may still write into them after a timeout, so they stay allocated, on every
        rank alike (freeing is collective), when any rank cannot vouch for them: it saw a
        timeout, its closing drain did not see every peer finish (a timeout, or the status a
        failed CUDA-graph replay left), or the ranks did not all reach this agreement in time.
        """
        why = "a timed-out all_reduce may still write there" if self.broken else ""
        if not self.broken and not self._unreachable:
            heap = self.heap
            # every call and replay this process queued, on any stream, before the drain
            shmem_cuda.device_synchronize(heap.device.id)
            arrive = int(self._arrive.handle)
            shmem_cuda.launch(
                heap.stream,
                shmem_cuda.load_kernel(heap.device.id, KERNELS, "allreduce_drain"),
                1,
                32 * math.ceil(max(self.size, 1) / 32),
                np.uint64(int(self._tables.handle) + 16 * self.size),
                np.uint64(arrive),
                np.uint32(0),
                np.uint64(0),  # the device's epoch: every peer finished its last call
                np.uint64(int(self.world.config.signal.timeout_s * 1e9)),
                np.uint64(arrive + 4),
                np.int32(self.rank),
                np.int32(self.size),
            )
            shmem_cuda.memcpy_async(int(self._status.ctypes.data), arrive + 4, 4, heap.stream)
            heap.stream.sync()
            if self._status[0]:
                why = (
                    f"status {int(self._status[0])}: not every peer finished its last call, "
                    "or a failed CUDA-graph replay left the status set"
                )
        try:
            verdicts = allgather_within(
                self.mpi,
                why,
                self.world.config.signal.timeout_s,
                "Communicator.close",
                self.heap.progress,
            )
        except SignalTimeoutError as exc:
            verdicts = [f"the ranks did not all reach close in time ({exc})"]
        reasons = [f"rank {r}: {v}" for r, v in enumerate(verdicts) if v]
        if reasons:
            self.broken = True
            self._keep_scratch("; ".join(reasons))
            return False
        self._tables.close(self.heap.stream)
        self._arrive.close(self.heap.stream)
        for buf in (self.flags, self.results, self.scratch):
            buf.close()
        return True

    def _keep_scratch(self, why: str) -> None:
        log.warning(
            "Communicator.close: rank %d leaves %d bytes of GPU scratch allocated (%s)",
            self.rank,
            self.scratch.nbytes + self.results.nbytes + self.flags.nbytes,
            why,
        )
