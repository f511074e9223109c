"""Sequence-parallel attention on GPUs (the nvshmem backend): every schedule forward, the
backward in ring order.

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
  slot for this rank; after every rank's ``finish`` each sums its slots in rank order.
* ``dynamic`` (:func:`forward_dynamic_gpu`): the host's units, queues and fixed-order folds
  (``_units.drive``) with the data, counters and flags in NVSHMEM memory; a unit takes every
  head at once.

Every schedule keeps the host protocol's abort word, arrivals and heartbeat-restarted
deadlines (``_units``): a failing rank stops the others with ``PeerFailedError``.

Precision: a pair's partial O and gradients leave the kernels in the input type (as in
FlashAttention-style ring implementations) and are summed in float32; results are cast to
the input type once. Package-internal (``sequence_parallel.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from shmem import Buffer, DeviceContext
from shmem import cuda as shmem_cuda
from shmem.dtypes import dtype_name

from ..interop import upload
from . import _units
from ._plan import doc_runs
from ._sp_setup import Setup, close_all, symmetric
from ._sp_slots import Slots, plan_units, run_units, unit_groups
from ._units import OrderedFolds, SequenceParallelStats
from .gpu import (
    KERNELS,
    THREADS,
    attention_backward_gpu,
    attention_gpu,
    device_context,
)
from .gpu_args import BLOCK_M
from .scheduler import MHASchedule

__all__ = ["backward_ring_gpu", "forward_dynamic_gpu", "forward_ring_gpu", "segments"]

Segment = tuple[int, int, int]  # (first row, end row, position of the first row)


def segments(
    positions: np.ndarray[Any, Any], docs: np.ndarray[Any, Any] | None = None
) -> list[tuple[Segment, int]]:
    """Runs of consecutive positions within one document: ``((first row, end row, position
    of the first row), document)`` (document 0 without ``docs``, the row offsets)."""
    found = []
    for a, b in doc_runs(positions, 0, int(positions.size), docs):
        first = int(positions[a])
        doc = 0 if docs is None else int(np.searchsorted(docs, first, side="right")) - 1
        found.append(((a, b, first), doc))
    return found


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
    """This call's symmetric buffers (K and V of every rank, the counters of ``_units``:
    abort word, arrivals, heartbeat; and ``extra`` ones, zeroed), the steps of the ring and
    the reads of peers' rows. A failure on any rank inside :meth:`guarded` stops the others
    at their next step or wait with ``PeerFailedError`` naming it."""

    def __init__(
        self,
        st: Setup,
        k: Buffer,
        v: Buffer,
        extra: dict[str, tuple[tuple[int, ...], str]],
        what: str,
    ) -> None:
        self.st, self.what = st, what
        world = st.world
        dtype = dtype_name(k.dtype)
        shape = (st.rows_max, st.kv_heads, st.dim)
        self.bufs = symmetric(
            world,
            {
                "k": (shape, dtype),
                "v": (shape, dtype),
                "counters": ((_units.COUNTERS,), "int64"),
                **extra,
            },
            zeroed=tuple(extra),
        )
        self.device = k.device
        self.stream = device_context(self.device.id).stream
        try:
            with self.guarded():
                if st.rows:
                    self.bufs["k"].local()[: st.rows].inplace_copy_from(k)
                    self.bufs["v"].local()[: st.rows].inplace_copy_from(v)
                world.ctx.synchronize()
                _units.ready(world, self.bufs["counters"], what)  # every rank's K/V is in place
        except BaseException:
            close_all(self.bufs)
            raise
        self._staging: dict[str, Buffer] = {}

    def guarded(self) -> Any:
        """On an error (not a peer's) inside, the abort word of every rank is set."""
        return _units.guarded(self.st.world, self.bufs["counters"])

    def steps(self) -> Iterator[tuple[int, list[tuple[Segment, Segment]]]]:
        """``(source rank, the pairs of segments to compute)`` of each step with work; a
        peer's failure stops it (``PeerFailedError``), each step done beats the heartbeat
        that keeps the peers' deadlines from running out."""
        st, world = self.st, self.st.world
        counters = self.bufs["counters"]
        for step in range(world.world_size):
            _units.check_peers(counters, world.rank, self.what)
            src = (world.rank - step) % world.world_size
            pairs = _pairs(st, st.positions[world.rank], st.positions[src])
            if pairs:
                yield src, pairs
                _units.beat(counters)
                world.heap.progress()  # off-node peers' gets of this rank's rows

    def finish(self) -> None:
        """Wait until every rank is done with this call's steps (reads of this rank's K/V,
        puts into its slots): a barrier that a failing peer ends early."""
        self.stream.sync()
        _units.finish(self.st.world, self.bufs["counters"], self.what)

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
                buf = self._staging[name] = _new(sym.dtype, sym.shape, self.device)
            if rows:
                sym.get(src, buf[:rows])
            got.append(buf[:rows])
        return got[0], got[1]

    def close(self) -> None:
        """Free the buffers (after :meth:`finish`, or at once on a failure: then after this
        rank's queued kernels, which may still read or write them, have run)."""
        _drain(self.stream)
        close_all(self.bufs)

    def kernel(self, name: str) -> Any:
        return shmem_cuda.load_kernel(self.device.id, KERNELS, name)

    def elementwise(self, kernel: Any, count: int, *ptrs: Buffer) -> None:
        _elementwise(self.stream, kernel, count, *ptrs)


def _new(dtype: Any, shape: tuple[int, ...], device: Any) -> Buffer:
    """An uninitialised device buffer that other streams may use at once (its allocation
    is ordered on the default stream, which is waited for here)."""
    buf = Buffer(dtype, shape, device=device)
    shmem_cuda.default_stream_synchronize(device)
    return buf


def _drain(*streams: Any) -> None:
    """Wait for what was queued on ``streams`` (on the way out of a failed call as well:
    errors here must not hide the one being raised)."""
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.sync()


def _elementwise(stream: Any, kernel: Any, count: int, *ptrs: Buffer) -> None:
    """Queue a grid-stride kernel over ``count`` elements of ``ptrs`` (cast, accumulate)."""
    if count:
        shmem_cuda.launch(
            stream,
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


def _pairs(st: Setup, q_pos: np.ndarray[Any, Any], kv_pos: np.ndarray[Any, Any]) -> list[Any]:
    """The (query segment, key segment) pairs of rows at ``q_pos`` against keys at ``kv_pos``
    that may see each other: same document, and some key within the mask."""
    return [
        (qs, ks)
        for qs, q_doc in segments(q_pos, st.docs)
        for ks, k_doc in segments(kv_pos, st.docs)
        if q_doc == k_doc and sees(st, qs[2], qs[1] - qs[0], ks[2], ks[1] - ks[0])
    ]


def _merge(stream: Any, kernel: Any, out: Buffer, lse: Buffer, o: Buffer, l_: Buffer) -> None:
    """Queue the fold of a partial ``(o, l_)`` into the float32 ``(out, lse)`` (same rows)."""
    rows = lse.num_elements
    shmem_cuda.launch(
        stream,
        kernel,
        max(1, -(-rows // (THREADS // 32))),
        THREADS,
        *(np.uint64(b.unsafe_ptr()) for b in (out, lse, o, l_)),
        np.int64(rows),
        np.int32(out.shape[-1]),
    )


def _attend(
    st: Setup,
    stream: Any,
    merge: Any,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    pairs: list[Any],
    out: Buffer,
    lse: Buffer,
) -> int:
    """Attention of ``q``'s rows over ``k``/``v``'s, pair by pair, folded into the float32
    ``(out, lse)`` of ``q``'s rows in pair order; returns when the stream has run it all."""
    partials = []  # alive until their merges have run
    for (qa, qb, qp), (ka, kb, kp) in pairs:
        o_part, l_part = attention_gpu(
            _rows(q, qa, qb),
            _rows(k, ka, kb),
            _rows(v, ka, kb),
            mask=st.mask,
            offsets=None,
            scale=st.scale,
            scheduler="queued",
            schedule=_schedule(st),
            workers=None,
            return_lse=True,
            stream=stream,
            delta=qp - kp,
        )
        _merge(stream, merge, out[qa:qb], lse[qa:qb], o_part, l_part)
        partials.append((o_part, l_part))
    stream.sync()
    return len(partials)


def _running(rows: int, heads: int, dim: int, device: Any) -> tuple[Buffer, Buffer]:
    """A float32 ``(O, LSE)`` that has seen nothing yet: zeros and -inf."""
    out = Buffer.zeros((rows, heads, dim), "float32", device=device)
    return out, upload(np.full((rows, heads), -np.inf, np.float32), device)


def forward_ring_gpu(
    st: Setup, q: Buffer, k: Buffer, v: Buffer, stats: SequenceParallelStats
) -> tuple[Buffer, Buffer]:
    """``(O, LSE)`` of this rank's rows (O in ``q``'s dtype, LSE float32) over the whole
    sequence, ``ring`` or ``zigzag`` order (collective)."""
    dtype = dtype_name(q.dtype)
    ring = _Ring(st, k, v, {}, "sequence_parallel_attention")
    try:
        with ring.guarded():
            out, lse = _running(st.rows, st.heads, st.dim, ring.device)
            merge = ring.kernel(f"mha_merge_{dtype}")
            for src, pairs in ring.steps():
                t0 = time.perf_counter()
                kk, vv = ring.kv(src)
                stats.units_computed += _attend(st, ring.stream, merge, q, kk, vv, pairs, out, lse)
                stats.busy_s += time.perf_counter() - t0
            result = _new(q.dtype, (st.rows, st.heads, st.dim), ring.device)
            ring.elementwise(ring.kernel(f"mha_cast_{dtype}"), out.num_elements, result, out)
            ring.finish()  # every rank is done reading this rank's K/V
    finally:
        ring.close()
    stats.units = stats.units_computed
    stats.threads = 1
    return result, lse


def forward_dynamic_gpu(
    st: Setup, q: Buffer, k: Buffer, v: Buffer, stats: SequenceParallelStats, slowdown: float
) -> tuple[Buffer, Buffer]:
    """The ``dynamic`` forward on GPUs (collective): the host schedule's units, queues and
    fixed-order folds (``_units.drive``), a unit being one query chunk against one KV chunk
    with every head (one kernel launch per segment pair). Its partial ``(O | LSE)`` (float32)
    goes to a slot on the query's home; the home folds its slots in unit order on the GPU, so
    the result does not depend on which rank computed what.

    Long because the unit driver's steps (fetch, compute, deliver, fold) are closures over
    this call's buffers, plan, stream and outputs, written beside the state they share."""
    world, me = st.world, st.world.rank
    what = "sequence_parallel_attention"
    dtype = dtype_name(q.dtype)
    # a unit takes every head at once (the kernel's grid covers them), and the one thread
    # that drives the GPU computes
    ust = dataclasses.replace(st, kv_heads=1, threads=1)
    plan = plan_units(ust, BLOCK_M)
    chunks, h, d = plan.chunks, st.heads, st.dim
    slots = Slots(plan, [(plan.by_q_home, lambda u: chunks[u.q].rows * h * (d + 1))])
    bufs = symmetric(
        world,
        {
            "q": ((st.rows_max, h, d), dtype),
            "k": ((st.rows_max, st.kv_heads, d), dtype),
            "v": ((st.rows_max, st.kv_heads, d), dtype),
            **slots.buffers(),
        },
    )
    device = q.device
    compute_stream = device_context(device.id).stream  # the worker thread's
    fold_ctx = DeviceContext(device)  # the driving thread's
    try:
        with _units.guarded(world, bufs["counters"]):  # a failure here stops the peers at once
            for name, x in (("q", q), ("k", k), ("v", v)):
                if st.rows:
                    bufs[name].local()[: st.rows].inplace_copy_from(x)
            world.ctx.synchronize()
            _units.ready(world, bufs["counters"], what)
            out, lse = _running(st.rows, h, d, device)
            merge_t = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_merge_{dtype}")
            merge_f = shmem_cuda.load_kernel(device.id, KERNELS, "mha_merge_float32")
            reader = _units.RowReader(alloc=lambda shape, dt: _new(dt, shape, device))

            def fetch(u: Any) -> tuple[Buffer, Buffer, Buffer]:
                qc, kc = chunks[u.q], chunks[u.kv]
                return (
                    reader.rows(bufs["q"], qc.rank, qc.lo, qc.hi),
                    reader.rows(bufs["k"], kc.rank, kc.lo, kc.hi),
                    reader.rows(bufs["v"], kc.rank, kc.lo, kc.hi),
                )

            def compute(u: Any, data: tuple[Buffer, Buffer, Buffer]) -> tuple[Buffer, Buffer]:
                shmem_cuda.make_current(device.id)  # a worker thread
                qc, kc = chunks[u.q], chunks[u.kv]
                o_u, l_u = _running(qc.rows, h, d, device)
                pairs = _pairs(st, qc.pos, kc.pos)
                _attend(st, compute_stream, merge_t, *data, pairs, o_u, l_u)
                return o_u, l_u

            def deliver(u: Any, result: tuple[Buffer, Buffer]) -> None:
                o_u, l_u = result
                home = chunks[u.q].rank
                at = slots.offset[home][0, u.id] * 4  # bytes: O, then LSE
                part = bufs["part"]
                part.put(home, o_u.view("float32", (o_u.num_elements,)), offset=at)
                part.put(home, l_u.view("float32", (l_u.num_elements,)), offset=at + o_u.nbytes)
                _units.publish(world, bufs["flags"], home, slots.flag[home][0, u.id])

            def fold(u: Any, part: Buffer, off: int) -> None:
                qc = chunks[u.q]
                n = qc.rows * h
                o_slot = part[off : off + n * d].view("float32", (qc.rows, h, d))
                l_slot = part[off + n * d : off + n * (d + 1)].view("float32", (qc.rows, h))
                rows = slice(qc.lo, qc.hi)
                _merge(fold_ctx.stream, merge_f, out[rows], lse[rows], o_slot, l_slot)
                fold_ctx.synchronize()

            groups = unit_groups(plan.by_q_home[me], lambda u: u.q)
            folds = OrderedFolds(world, bufs["flags"], slots.folds(world, bufs, 0, groups, fold))
            run_units(
                ust,
                plan,
                bufs["counters"],
                dynamic=True,
                fetch=fetch,
                compute=compute,
                deliver=deliver,
                folds=folds,
                slowdown=slowdown,
                stats=stats,
                what=what,
            )
            result = _new(q.dtype, (st.rows, h, d), device)
            cast = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_cast_{dtype}")
            _elementwise(compute_stream, cast, out.num_elements, result, out)
            compute_stream.sync()
    finally:
        _drain(compute_stream, fold_ctx.stream)  # nothing queued still uses the buffers
        fold_ctx.close()
        close_all(bufs)
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
    ring = _Ring(
        st, k, v, {"dkv": ((size, 2, *kv_shape), "float32")}, "sequence_parallel_attention_backward"
    )
    try:
        with ring.guarded():
            add_t = ring.kernel(f"mha_accumulate_{dtype}")
            dq32 = Buffer.zeros((st.rows, st.heads, st.dim), "float32", device=ring.device)
            contrib = _new("float32", (2, *kv_shape), ring.device)
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
            ring.finish()  # every contribution to every rank's slots is in place
            add_f = ring.kernel("mha_accumulate_float32")
            slots = ring.bufs["dkv"].local()
            sums = Buffer.zeros((2, st.rows, st.kv_heads, st.dim), "float32", device=ring.device)
            half = sums.num_elements // 2
            for r in range(size):  # rank order: the same sums on every run
                ring.elementwise(add_f, half, sums[0], slots[r, 0, : st.rows])
                ring.elementwise(add_f, half, sums[1], slots[r, 1, : st.rows])
            cast = ring.kernel(f"mha_cast_{dtype}")
            dq = _new(q.dtype, q.shape, ring.device)
            dk = _new(k.dtype, k.shape, ring.device)
            dv = _new(v.dtype, v.shape, ring.device)
            ring.elementwise(cast, dq.num_elements, dq, dq32)
            ring.elementwise(cast, dk.num_elements, dk, sums[0])
            ring.elementwise(cast, dv.num_elements, dv, sums[1])
            ring.stream.sync()  # the slots are read before they are freed
    finally:
        ring.close()
    stats.units = stats.units_computed
    stats.threads = 1
    return dq, dk, dv
