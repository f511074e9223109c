"""Sequence-parallel attention on GPUs (the nvshmem backend): ``ring`` and ``zigzag`` forward.

Each rank's K/V rows go to symmetric (NVSHMEM) buffers; at step ``s`` a rank reads the rows of
rank ``(r - s) mod P`` through a peer pointer where the peer's memory is mapped (same node),
else with an NVSHMEM get into a local buffer. Each pair of a query segment and a key segment
(one segment per rank on the ring, two for zigzag) is one launch of the single-GPU kernel on
a padded K/V of its own length with the segments' position difference (``delta``), and its
partial ``(O, LSE)`` is folded into the running float32 result by ``mha_merge_<dtype>``, in
step order (the same order on every run). Pairs that no mask lets see each other are skipped.

Precision: a unit's partial O leaves the kernel in the input type (as in FlashAttention-style
ring implementations) and is folded in float32; the result is cast to the input type once.
Package-internal (``sequence_parallel.py``).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from shmem import Buffer
from shmem import cuda as shmem_cuda
from shmem.dtypes import dtype_name

from ._sp_setup import Setup, close_all, symmetric
from ._units import SequenceParallelStats
from .gpu import KERNELS, THREADS, _context, _upload, attention_gpu
from .scheduler import MHASchedule

__all__ = ["forward_ring_gpu", "segments"]


def segments(positions: np.ndarray[Any, Any]) -> list[tuple[int, int, int]]:
    """Runs of consecutive positions: ``(first row, end row, position of the first row)``."""
    if positions.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(positions) != 1) + 1
    bounds = [0, *cuts.tolist(), int(positions.size)]
    return [(a, b, int(positions[a])) for a, b in itertools.pairwise(bounds)]


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


def forward_ring_gpu(
    st: Setup, q: Buffer, k: Buffer, v: Buffer, stats: SequenceParallelStats
) -> tuple[Buffer, Buffer]:
    """``(O, LSE)`` of this rank's rows (O in ``q``'s dtype, LSE float32) over the whole
    sequence, ``ring`` or ``zigzag`` order (collective)."""
    world = st.world
    rank, size = world.rank, world.world_size
    dtype = dtype_name(q.dtype)
    bufs = symmetric(
        world,
        {
            "k": ((st.rows_max, st.kv_heads, st.dim), dtype),
            "v": ((st.rows_max, st.kv_heads, st.dim), dtype),
        },
    )
    k_sym, v_sym = bufs["k"], bufs["v"]
    try:
        if st.rows:
            k_sym.local()[: st.rows].inplace_copy_from(k)
            v_sym.local()[: st.rows].inplace_copy_from(v)
        world.ctx.synchronize()
        world.barrier()  # every rank's K/V is in place
        device = q.device
        out = Buffer.zeros((st.rows, st.heads, st.dim), "float32", device=device)
        lse = _upload(np.full((st.rows, st.heads), -np.inf, np.float32), device)
        stream = _context(device.id).stream
        merge = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_merge_{dtype}")
        staging: dict[str, Buffer] = {}
        mine = segments(st.positions[rank])
        busy = 0.0
        for step in range(size):
            src = (rank - step) % size
            theirs = segments(st.positions[src])
            pairs = [
                (qs, ks)
                for qs in mine
                for ks in theirs
                if sees(st, qs[2], qs[1] - qs[0], ks[2], ks[1] - ks[0])
            ]
            if not pairs:
                continue
            t0 = time.perf_counter()
            kv = [_rows_of(sym, src, st.counts[src], staging, name) for name, sym in bufs.items()]
            partials = []  # alive until the step's merges have run
            for (qa, qb, qp), (ka, kb, kp) in pairs:
                n, m = qb - qa, kb - ka
                o_part, l_part = attention_gpu(
                    q[qa:qb].view(q.dtype, (1, n, st.heads, st.dim)),
                    kv[0][ka:kb].view(q.dtype, (1, m, st.kv_heads, st.dim)),
                    kv[1][ka:kb].view(q.dtype, (1, m, st.kv_heads, st.dim)),
                    mask=st.mask,
                    offsets=None,
                    scale=st.scale,
                    scheduler="queued",
                    schedule=MHASchedule.LPT if st.mask.causal else MHASchedule.DEFAULT,
                    workers=None,
                    return_lse=True,
                    stream=stream,
                    delta=qp - kp,
                )
                rows = n * st.heads
                shmem_cuda.launch(
                    stream,
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
            stream.sync()
            del partials
            busy += time.perf_counter() - t0
            world.heap.progress()  # off-node peers' gets of this rank's rows
        stats.busy_s += busy
        stats.units = stats.units_computed
        stats.threads = 1
        result = Buffer(q.dtype, (st.rows, st.heads, st.dim), device=device)
        if st.rows:
            cast = shmem_cuda.load_kernel(device.id, KERNELS, f"mha_cast_{dtype}")
            count = st.rows * st.heads * st.dim
            shmem_cuda.launch(
                stream,
                cast,
                min(-(-count // THREADS), 65535),
                THREADS,
                np.uint64(result.unsafe_ptr()),
                np.uint64(out.unsafe_ptr()),
                np.int64(count),
            )
        stream.sync()
        world.barrier()  # every rank is done reading my K/V
    finally:
        close_all(bufs)
    return result, lse


def _rows_of(sym: Any, src: int, rows: int, staging: dict[str, Buffer], name: str) -> Buffer:
    """``src``'s first ``rows`` rows of ``sym``: a peer view where mapped, else a get."""
    peer = sym.peer(src)
    if peer is not None:
        return peer[:rows]  # type: ignore[no-any-return]
    buf = staging.get(name)
    if buf is None:
        buf = staging[name] = Buffer(sym.dtype, sym.shape, device=sym.local().device)
    if rows:
        sym.get(src, buf[:rows])
    return buf[:rows]
