"""Sequence-parallel attention on GPUs (the nvshmem backend): ``ring`` and ``zigzag``, forward
and backward.

Each rank's K/V rows go to symmetric (NVSHMEM) buffers; at step ``s`` a rank reads the rows of
rank ``(r - s) mod P`` through a peer pointer where the peer's memory is mapped (same node),
else with an NVSHMEM get into a local buffer. Each pair of a query segment and a key segment
(one segment per rank on the ring, two for zigzag, cut where documents of ``valid_length``
end; a query segment meets only key segments of its own document) is one launch of the
single-GPU kernel on a padded K/V of its own length with the segments' position difference
(``delta``). Pairs that no mask lets see each other are skipped.

* Forward: a pair's partial ``(O, LSE)`` is folded into the running float32 result by
  ``mha_merge_<dtype>``, in step order (the same order on every run).
* Backward (FlashAttention-2, ``P`` recomputed from the forward's LSE): a pair gives ``dQ``
  for this rank's rows, summed here in float32 in step order, and ``dK``/``dV`` for the key
  owner's rows, summed per step into one float32 contribution that is put into the owner's
  slot for this rank; after a barrier each rank sums its slots in rank order.

Precision: a pair's partial O and gradients leave the kernels in the input type (as in
FlashAttention-style ring implementations) and are summed in float32; results are cast to
the input type once. Package-internal (``sequence_parallel.py``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from shmem import Buffer
from shmem import cuda as shmem_cuda
from shmem.dtypes import dtype_name

from ._sp_setup import Setup, close_all, symmetric
from ._units import SequenceParallelStats
from .gpu import KERNELS, THREADS, _context, _upload, attention_backward_gpu, attention_gpu
from .scheduler import MHASchedule

__all__ = ["backward_ring_gpu", "forward_ring_gpu", "segments"]

Segment = tuple[int, int, int]  # (first row, end row, position of the first row)


def segments(
    positions: np.ndarray[Any, Any], docs: np.ndarray[Any, Any] | None = None
) -> list[tuple[Segment, int]]:
    """Runs of consecutive positions within one document: ``((first row, end row, position
    of the first row), document)`` (document 0 without ``docs``, the row offsets)."""
    if positions.size == 0:
        return []
    breaks = np.diff(positions) != 1
    doc = np.zeros(positions.size, np.int64)
    if docs is not None:
        doc = np.searchsorted(docs, positions, side="right") - 1
        breaks |= np.diff(doc) != 0
    cuts = np.flatnonzero(breaks) + 1
    bounds = [0, *cuts.tolist(), int(positions.size)]
    return [((a, b, int(positions[a])), int(doc[a])) for a, b in itertools.pairwise(bounds)]


def sees(st: Setup, q_pos: int, rows: int, k_pos: int, keys: int) -> bool:
    """Whether any query of ``[q_pos, q_pos + rows)`` may see a key of ``[k_pos, k_pos + keys)``
    (a superset test: the kernel applies the exact mask)."""
    if rows == 0 or keys == 0:
        return False
    first_q, last_q, first_k, last_k = q_pos, q_pos + rows - 1, k_pos, k_pos + keys - 1
    m = st.mask
    if m.causal and first_k > last_q:
        return False
    if m.left is not None and last_k < first_q - m.left:
        return False
    return not (m.right is not None and first_k > last_q + m.right)


class _Ring:
    """This call's symmetric buffers (K and V of every rank, and ``extra`` ones, zeroed), the
    steps of the ring and the reads of peers' rows."""

    def __init__(
        self, st: Setup, k: Buffer, v: Buffer, extra: dict[str, tuple[tuple[int, ...], str]]
    ) -> None:
        self.st = st
        world = st.world
        dtype = dtype_name(k.dtype)
        shape = (st.rows_max, st.kv_heads, st.dim)
        self.bufs = symmetric(world, {"k": (shape, dtype), "v": (shape, dtype)})
        try:
            for name, (extra_shape, extra_dtype) in extra.items():
                self.bufs[name] = world.zeros(extra_shape, extra_dtype)
            if st.rows:
                self.bufs["k"].local()[: st.rows].inplace_copy_from(k)
                self.bufs["v"].local()[: st.rows].inplace_copy_from(v)
            world.ctx.synchronize()
            world.barrier()  # every rank's K/V is in place
        except BaseException:
            close_all(self.bufs)
            raise
        self.device = k.device
        self.stream = _context(self.device.id).stream
        self._staging: dict[str, Buffer] = {}

    def steps(self) -> Iterator[tuple[int, list[tuple[Segment, Segment]]]]:
        """``(source rank, the pairs of segments to compute)`` of each step with work."""
        st, world = self.st, self.st.world
        mine = segments(st.positions[world.rank], st.docs)
        for step in range(world.world_size):
            src = (world.rank - step) % world.world_size
            pairs = [  # a document sees only itself: the mask within it is in positions
                (qs, ks)
                for qs, q_doc in mine
                for ks, k_doc in segments(st.positions[src], st.docs)
                if q_doc == k_doc and sees(st, qs[2], qs[1] - qs[0], ks[2], ks[1] - ks[0])
            ]
            if pairs:
                yield src, pairs

    def kv(self, src: int) -> tuple[Buffer, Buffer]:
        """``src``'s K and V rows: peer views where mapped, else gets into local buffers."""
        rows = self.st.counts[src]
        got = []
        for name in ("k", "v"):
            sym = self.bufs[name]
            peer = sym.peer(src)
            if peer is not None:
                got.append(peer[:rows])
                continue
            buf = self._staging.get(name)
            if buf is None:
                buf = self._staging[name] = Buffer(sym.dtype, sym.shape, device=self.device)
            if rows:
                sym.get(src, buf[:rows])
            got.append(buf[:rows])
        return got[0], got[1]

    def close(self, failed: bool) -> None:
        """Free the buffers: after a barrier (every rank is done with this rank's), or at
        once on a failure (no barrier that could hide the error: the launcher ends the job)."""
        if not failed:
            self.stream.sync()
            self.st.world.barrier()
        close_all(self.bufs)

    def kernel(self, name: str) -> Any:
        return shmem_cuda.load_kernel(self.device.id, KERNELS, name)

    def elementwise(self, kernel: Any, count: int, *ptrs: Buffer) -> None:
        """Queue a grid-stride kernel over ``count`` elements of ``ptrs`` (cast, accumulate)."""
        if count:
            shmem_cuda.launch(
                self.stream,
                kernel,
                min(-(-count // THREADS), 65535),
                THREADS,
                *(np.uint64(b.unsafe_ptr()) for b in ptrs),
                np.int64(count),
            )


def _rows(x: Buffer, a: int, b: int) -> Buffer:
    """Rows ``[a, b)`` of ``[rows, heads, d]`` as one padded sequence ``[1, b - a, heads, d]``."""
    return x[a:b].view(x.dtype, (1, b - a, *x.shape[1:]))


def _schedule(st: Setup) -> MHASchedule:
    return MHASchedule.LPT if st.mask.causal else MHASchedule.DEFAULT


def forward_ring_gpu(
    st: Setup, q: Buffer, k: Buffer, v: Buffer, stats: SequenceParallelStats
) -> tuple[Buffer, Buffer]:
    """``(O, LSE)`` of this rank's rows (O in ``q``'s dtype, LSE float32) over the whole
    sequence, ``ring`` or ``zigzag`` order (collective)."""
    dtype = dtype_name(q.dtype)
    ring = _Ring(st, k, v, {})
    failed = True
    try:
        out = Buffer.zeros((st.rows, st.heads, st.dim), "float32", device=ring.device)
        lse = _upload(np.full((st.rows, st.heads), -np.inf, np.float32), ring.device)
        merge = ring.kernel(f"mha_merge_{dtype}")
        for src, pairs in ring.steps():
            t0 = time.perf_counter()
            kk, vv = ring.kv(src)
            partials = []  # alive until the step's merges have run
            for (qa, qb, qp), (ka, kb, kp) in pairs:
                o_part, l_part = attention_gpu(
                    _rows(q, qa, qb),
                    _rows(kk, ka, kb),
                    _rows(vv, ka, kb),
                    mask=st.mask,
                    offsets=None,
                    scale=st.scale,
                    scheduler="queued",
                    schedule=_schedule(st),
                    workers=None,
                    return_lse=True,
                    stream=ring.stream,
                    delta=qp - kp,
                )
                rows = (qb - qa) * st.heads
                shmem_cuda.launch(
                    ring.stream,
                    merge,
                    -(-rows // (THREADS // 32)),
                    THREADS,
                    np.uint64(out[qa:qb].unsafe_ptr()),
                    np.uint64(lse[qa:qb].unsafe_ptr()),
                    np.uint64(o_part.unsafe_ptr()),
                    np.uint64(l_part.unsafe_ptr()),
                    np.int64(rows),
                    np.int32(st.dim),
                )
                partials.append((o_part, l_part))
                stats.units_computed += 1
            # the step's partials and any staged rows are used up before the next step
            ring.stream.sync()
            del partials
            stats.busy_s += time.perf_counter() - t0
            st.world.heap.progress()  # off-node peers' gets of this rank's rows
        result = Buffer(q.dtype, (st.rows, st.heads, st.dim), device=ring.device)
        ring.elementwise(ring.kernel(f"mha_cast_{dtype}"), out.num_elements, result, out)
        failed = False
    finally:
        ring.close(failed)
    stats.units = stats.units_computed
    stats.threads = 1
    return result, lse


def backward_ring_gpu(
    st: Setup,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    out: Buffer,
    dout: Buffer,
    lse: Buffer,
    stats: SequenceParallelStats,
) -> tuple[Buffer, Buffer, Buffer]:
    """``(dQ, dK, dV)`` of this rank's rows (the dtypes of ``q``, ``k``, ``v``), ``ring`` or
    ``zigzag`` order (collective)."""
    world = st.world
    rank, size = world.rank, world.world_size
    dtype = dtype_name(q.dtype)
    kv_shape = (st.rows_max, st.kv_heads, st.dim)
    # slot r of "dkv": rank r's float32 contribution to this rank's dK (0) and dV (1)
    ring = _Ring(st, k, v, {"dkv": ((size, 2, *kv_shape), "float32")})
    failed = True
    try:
        add_t = ring.kernel(f"mha_accumulate_{dtype}")
        dq32 = Buffer.zeros((st.rows, st.heads, st.dim), "float32", device=ring.device)
        contrib = Buffer("float32", (2, *kv_shape), device=ring.device)
        for src, pairs in ring.steps():
            t0 = time.perf_counter()
            kk, vv = ring.kv(src)
            shmem_cuda.memset_async(contrib.unsafe_ptr(), 0, contrib.nbytes, ring.stream)
            partials = []
            for (qa, qb, qp), (ka, kb, kp) in pairs:
                grads = attention_backward_gpu(
                    _rows(q, qa, qb),
                    _rows(kk, ka, kb),
                    _rows(vv, ka, kb),
                    _rows(out, qa, qb),
                    lse[qa:qb].view(lse.dtype, (1, qb - qa, st.heads)),
                    _rows(dout, qa, qb),
                    mask=st.mask,
                    offsets=None,
                    scale=st.scale,
                    stream=ring.stream,
                    delta=qp - kp,
                )
                dq_p, dk_p, dv_p = grads
                ring.elementwise(add_t, dq_p.num_elements, dq32[qa:qb], dq_p)
                ring.elementwise(add_t, dk_p.num_elements, contrib[0, ka:kb], dk_p)
                ring.elementwise(add_t, dv_p.num_elements, contrib[1, ka:kb], dv_p)
                partials.append(grads)
                stats.units_computed += 1
            ring.stream.sync()
            del partials
            # this step's dK | dV of src's rows, into src's slot for this rank
            ring.bufs["dkv"].put(src, contrib, offset=rank * contrib.nbytes)
            stats.busy_s += time.perf_counter() - t0
            world.heap.progress()
        ring.stream.sync()
        world.barrier()  # every contribution to every rank's slots is in place
        add_f = ring.kernel("mha_accumulate_float32")
        slots = ring.bufs["dkv"].local()
        sums = Buffer.zeros((2, st.rows, st.kv_heads, st.dim), "float32", device=ring.device)
        for r in range(size):  # rank order: the same sums on every run
            ring.elementwise(add_f, sums.num_elements // 2, sums[0], slots[r, 0, : st.rows])
            ring.elementwise(add_f, sums.num_elements // 2, sums[1], slots[r, 1, : st.rows])
        cast = ring.kernel(f"mha_cast_{dtype}")
        dq = Buffer(q.dtype, q.shape, device=ring.device)
        dk = Buffer(k.dtype, k.shape, device=ring.device)
        dv = Buffer(v.dtype, v.shape, device=ring.device)
        ring.elementwise(cast, dq.num_elements, dq, dq32)
        ring.elementwise(cast, dk.num_elements, dk, sums[0])
        ring.elementwise(cast, dv.num_elements, dv, sums[1])
        failed = False
    finally:
        ring.close(failed)
    stats.units = stats.units_computed
    stats.threads = 1
    return dq, dk, dv
