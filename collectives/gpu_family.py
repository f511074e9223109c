"""The rest of the collective family on GPUs: reduce-scatter, all-gather, broadcast and
all-to-all, as kernels of ``collectives/kernels/allreduce.cu`` over the GPU all-reduce's
stages and scratch (:class:`collectives.gpu.GpuAllReduce`: its ordering on ``stream=``, its
argument agreement, its staged launches and their status word, its close).

Each call is one launch per piece of at most the scratch; inputs and outputs are what the
all-reduce takes (numpy is copied to and from the GPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmem import Buffer, SHMEMBuffer
from shmem import cuda as shmem_cuda
from shmem.dtypes import dtype_name
from shmem.errors import GpuCollectiveError

from .gpu import GPU_OP_ARG_DTYPES, KERNELS, OP_CODES, GpuAllReduce, check_reducible, grid_blocks
from .interop import to_device_buffer
from .schedule import shard_of

__all__ = ["GpuCollectives"]


class GpuCollectives(GpuAllReduce):
    """The GPU collectives of one Communicator (collective construction and close): the
    all-reduce (:class:`~collectives.gpu.GpuAllReduce`), and the rest of the family on its
    stages and scratch."""

    def family(
        self,
        name: str,
        x: Any,
        out: Any = None,
        *,
        root: int = 0,
        op: str = "sum",
        stream: object = None,
    ) -> object:
        """``all_gather``, ``broadcast``, ``all_to_all`` or ``reduce_scatter`` on the GPU,
        over the all-reduce's stages and scratch (pieces of at most the scratch), ordered on
        ``stream`` (default the World's context), as :meth:`all_reduce`. Inputs and outputs
        as :meth:`all_reduce`'s (numpy is copied to and from the GPU); ``broadcast`` writes
        into ``x`` by default."""
        where = f"Communicator.{name}"
        extra = (op,) if name == "reduce_scatter" else (root,) if name == "broadcast" else ()
        src, dst, cu_stream = self._agreed(
            where,
            lambda: self._family_args(name, x, out, root, op, where, stream),
            lambda c: (c[0], extra),
        )
        self._family_run(name, src, dst, root, op, cu_stream)
        self.stats.count(f"gpu_{name}")
        target = x if (name == "broadcast" and out is None) else out
        if isinstance(target, np.ndarray):
            np.copyto(target, dst.to_numpy().reshape(target.shape))
            return target
        if target is None:
            return dst.to_numpy() if isinstance(x, np.ndarray) else dst
        if name == "broadcast" and out is None and isinstance(x, SHMEMBuffer):
            return x
        return target

    def _family_args(
        self,
        name: str,
        x: Any,
        out: Any,
        root: int,
        op: str,
        where: str,
        stream: object,
    ) -> tuple[Buffer, Buffer, shmem_cuda.CudaStream]:
        """``(source, destination, stream)`` after the checks every rank makes alike."""
        cu_stream = self._check_stream(stream, where)
        src = self._source(x, where)
        n, size = src.num_elements, self.size
        if name == "reduce_scatter":
            check_reducible(src.dtype, op, where)
            lo, hi = shard_of(n, size, self.rank)
            count = hi - lo
        elif name == "all_gather":
            count = n * size
        elif name == "all_to_all":
            if n % size:
                raise GpuCollectiveError(
                    f"{where}: invalid count (got {n}; expected a multiple of the world size "
                    f"{size})"
                )
            count = n
        else:  # broadcast
            if isinstance(root, bool) or not isinstance(root, int | np.integer):
                raise GpuCollectiveError(f"{where}: invalid root (got {root!r})")
            if not 0 <= root < size:
                raise GpuCollectiveError(
                    f"{where}: invalid root (got {root}; expected 0 <= root < {size})"
                )
            count = n
        target = x if (name == "broadcast" and out is None) else out
        if target is None or isinstance(target, np.ndarray):
            if isinstance(target, np.ndarray) and (
                target.dtype != src.dtype or target.size != count or not target.flags.writeable
            ):
                raise GpuCollectiveError(
                    f"{where}: out does not match (got {target.dtype} {target.size} elements, "
                    f"writeable {target.flags.writeable}; expected a writeable "
                    f"{dtype_name(src.dtype)} array of {count})"
                )
            dst = Buffer(src.dtype, (count,), device=self.heap.device, stream=self.world.ctx)
        else:
            dst = to_device_buffer(target, self.heap.device, where, output=True)
            if dst.dtype != src.dtype or dst.num_elements != count:
                raise GpuCollectiveError(
                    f"{where}: out does not match (got {dtype_name(dst.dtype)} "
                    f"{dst.num_elements} elements; expected {dtype_name(src.dtype)} {count})"
                )
        return src, dst, cu_stream

    def _family_run(
        self, name: str, src: Buffer, dst: Buffer, root: int, op: str, stream: Any
    ) -> None:
        """The launches of one family call, in pieces of at most the scratch."""
        scratch_t = np.uint64(int(self._tables.handle))
        isz, n, cap, size = src.element_size, src.num_elements, self.capacity, self.size
        s_ptr, d_ptr = src.unsafe_ptr(), dst.unsafe_ptr()
        device = self.heap.device.id
        if name == "reduce_scatter":
            key = dtype_name(src.dtype)
            if key == "float32" and self._acc64:
                key = "float32_acc64"
            op_arg = key in GPU_OP_ARG_DTYPES
            kname = f"reduce_scatter_{key}_op" if op_arg else f"reduce_scatter_{key}_{op}"
            fn = shmem_cuda.load_kernel(device, KERNELS, kname)
            lo, hi = shard_of(n, size, self.rank)
            step = max(1, cap // isz)
            for a in range(0, max(n, 1), step):
                b = min(a + step, n)
                plo, phi = max(lo, a), min(hi, b)
                if phi < plo:
                    plo = phi = a  # my shard is not in this piece: take part in its stages
                data: list[Any] = [
                    np.uint64(s_ptr + a * isz),
                    scratch_t,
                    np.uint64(d_ptr + (plo - lo) * isz if phi > plo else d_ptr),
                    np.uint64(b - a),
                    np.uint64(plo - a),
                    np.uint64(phi - a),
                ]
                if op_arg:
                    data.append(np.int32(OP_CODES[op]))
                blocks = grid_blocks(max(b - a, 1), self._sms)
                self._staged(name, "one_shot", fn, blocks, data, 2, stream)
            return
        fn = shmem_cuda.load_kernel(device, KERNELS, f"family_{name}")
        nbytes = n * isz
        if name == "all_to_all":
            part = nbytes // size
            step = max(1, cap // size)
            for a in range(0, max(part, 1), step):
                piece = min(step, part - a)
                data = [
                    np.uint64(s_ptr + a),
                    scratch_t,
                    np.uint64(d_ptr + a),
                    np.uint64(max(piece, 0)),
                    np.uint64(part),
                ]
                blocks = grid_blocks(max(piece * size // 4, 1), self._sms)
                self._staged(name, "one_shot", fn, blocks, data, 2, stream)
            return
        for a in range(0, max(nbytes, 1), cap):
            piece = min(cap, nbytes - a)
            tail: Any = np.int32(root) if name == "broadcast" else np.uint64(nbytes)
            data = [
                np.uint64(s_ptr + a),
                scratch_t,
                np.uint64(d_ptr + a),
                np.uint64(max(piece, 0)),
                tail,
            ]
            blocks = grid_blocks(max(piece // 4, 1), self._sms)
            self._staged(name, "one_shot", fn, blocks, data, 2, stream)
