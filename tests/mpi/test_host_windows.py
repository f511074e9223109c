"""The host heap's windows off-node (issue 19): one ``Win.Allocate`` window serves node-local
load/store (``Shared_query``) and RMA to the other nodes; where MPI cannot map its memory, the
``Win.Create`` fallback. Both layouts move every kind of data alike."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from shmem.backends.host import HostHeap
from shmem.backends.nodes import split_nodes
from shmem.config import HeapConfig

pytestmark = pytest.mark.mpi

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import procmem  # noqa: E402


@pytest.fixture(params=["allocate", "create"])
def heap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A heap whose peers are all 'off-node' (node split per rank, or per pair)."""
    comm = MPI.COMM_WORLD.Dup()
    if request.param == "create":
        monkeypatch.setattr(HostHeap, "_world_window", lambda *args: None)
    split = "2" if comm.Get_size() == 4 else "rank"
    node_comm = split_nodes(comm, split)
    h = HostHeap(comm, node_comm, HeapConfig(nbytes=1 << 20, alignment=4096), timeout_s=20.0)
    try:
        yield h, request.param
    finally:
        h.close()
        node_comm.Free()
        comm.Free()


def test_the_window_layout(heap: Any) -> None:
    h, layout = heap
    if h.num_nodes == 1:
        assert h._rma_win is None
        return
    flavor = h._rma_win.Get_attr(MPI.WIN_CREATE_FLAVOR)
    if layout == "allocate" and MPI.get_vendor()[0] == "MPICH":  # MPICH shares Win_allocate
        assert h._rma_win is h._shm_win and flavor == MPI.WIN_FLAVOR_ALLOCATE
    elif layout == "allocate":  # other MPIs may not: then the slabs come from Win_create
        shared = h._rma_win is h._shm_win
        assert flavor == (MPI.WIN_FLAVOR_ALLOCATE if shared else MPI.WIN_FLAVOR_CREATE)
    else:
        assert h._rma_win is not h._shm_win and flavor == MPI.WIN_FLAVOR_CREATE
    assert h.address(0) % 4096 == 0  # the slab is aligned whatever MPI's segment layout


@pytest.mark.parametrize("dtype", ["uint8", "float32", "complex128", "bfloat16", "longdouble"])
def test_put_get_every_peer(heap: Any, dtype: str) -> None:
    h, _ = heap
    comm = MPI.COMM_WORLD
    me, p = comm.Get_rank(), comm.Get_size()
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    n = 37
    base = 4096 * 3 + 64  # an unaligned-to-the-window offset inside the slab
    for r in range(p):  # every rank writes its row into every rank's slab
        row = (np.arange(n) + 100 * me).astype(dt)
        h.put_bytes(r, base + me * n * dt.itemsize, row)
    comm.Barrier()
    h.fence()
    got = h.local_view(base, p * n * dt.itemsize).view(dt).reshape(p, n)
    want = (np.arange(n)[None, :] + 100 * np.arange(p)[:, None]).astype(dt)
    np.testing.assert_array_equal(got, want)  # values: long double has padding bytes
    back = np.empty(p * n, dt)
    h.get_bytes((me + 1) % p, base, back)
    np.testing.assert_array_equal(back, want.reshape(-1))
    req = h.get_nbi((me + 1) % p, base, back[:n])
    if req is not None:
        req.Wait()
    np.testing.assert_array_equal(back[:n], want[0])
    comm.Barrier()


def test_atomics_and_strided_on_every_peer(heap: Any) -> None:
    h, _ = heap
    comm = MPI.COMM_WORLD
    me, p = comm.Get_rank(), comm.Get_size()
    word = 8192
    h.local_view(word, 8).view(np.int64)[0] = 0
    comm.Barrier()
    for r in range(p):
        h.atomic_fetch_op(r, word, me + 1, np.dtype(np.int64), "add")
    comm.Barrier()
    assert h.atomic_fetch_op(me, word, 0, np.dtype(np.int64), "fetch") == p * (p + 1) // 2
    comm.Barrier()
    right = (me + 1) % p
    h.put_strided(right, 16384, np.full(4, me + 1, np.int32), 1, 4, 3)
    comm.Barrier()
    h.fence()
    got = h.local_view(16384, 4 * 10).view(np.int32)
    left = (me - 1) % p
    assert got[::3].tolist() == [left + 1] * 4
    back = np.empty(4, np.int32)
    h.get_strided(right, 16384, back, 1, 4, 3)
    assert back.tolist() == [me + 1] * 4
    comm.Barrier()


def _growth_kib(world: Any, work: Callable[[], None], rounds: int = 4) -> int:
    """How much this process's private memory grows over ``rounds`` calls of ``work`` after a
    first one (MPI's pools grow once): the lower of the last two readings less the first
    (``scripts/procmem.py``: ``RssAnon`` less the heap's own pages, which are private memory
    under Open MPI across simulated nodes). A leak grows every round, so both last readings
    hold it; malloc's arenas move by about 1 MiB either way from one reading to the next."""
    work()
    first = procmem.private_kib(world.heap)
    readings = []
    for _ in range(rounds):
        work()
        readings.append(procmem.private_kib(world.heap))
    return min(readings[-2:]) - first


def test_rma_to_memory_mpi_shares_does_not_grow_the_process(world: Any) -> None:
    """MPICH 5.0.2 leaks 48 bytes per ``Rget``/``Rput`` and 128 per ``Rget_accumulate`` to
    ``Win_allocate`` memory it reaches through shared memory: the nodes simulated on one
    machine (``node_split``), where the soak grew ~90 MiB in 5 minutes. Gets, puts, atomics
    and signals to such ranks go without requests (``HostHeap._rget``, the C signaller's
    ``shm`` ranks); before, this grew by ~0.9 MiB per 20,000 gets and 2.4 per 20,000
    atomics."""
    off = [r for r in range(world.world_size) if not world.heap.is_local(r)]
    if not off:
        pytest.skip("needs a rank on another node (SHMEM_HEAP_NODE_SPLIT)")
    peer = off[0]
    x = world.zeros(8, "int64")
    dst = np.empty(8, np.int64)
    try:

        def rounds() -> None:
            for _ in range(10_000):
                x.get(peer, dst)
                x.put_nbi(peer, dst)
                x.atomic_add(peer, 0, 0)
            world.quiet()

        grew = _growth_kib(world, rounds)
        # the leak was ~2.2 MiB a round (8.8 MiB over four)
        assert grew < 4096, f"{grew} KiB more private memory after 120,000 RMA operations"
    finally:
        world.barrier()
        x.close()


def test_strided_rma_off_the_node_does_not_grow_the_process(world: Any) -> None:
    """Open MPI 5.0.11's osc/rdma keeps memory for RMA with a vector datatype (2.9 MiB per put
    of 8192 blocks) and for more than a few hundred outstanding operations: strided puts to
    another node go a block at a time there, flushed every 128, and strided gets read their
    span, or block by block where the span is much larger than the data
    (shmem/backends/strided.py). Before, the soak across simulated nodes grew by 2.4 GiB in
    five minutes; 60 vector transfers of 8192 blocks grew it by ~170 MiB (15 a round here:
    ~42 MiB a round before the fix, against a bound of 8 MiB over two rounds)."""
    off = [r for r in range(world.world_size) if not world.heap.is_local(r)]
    if not off:
        pytest.skip("needs a rank on another node (SHMEM_HEAP_NODE_SPLIT)")
    peer = off[0]
    n = 1 << 13
    x = world.zeros(16 * n, "float32")
    data = np.arange(n, dtype=np.float32)
    back, sparse = np.empty(n, np.float32), np.empty(n, np.float32)
    try:

        def rounds() -> None:
            for _ in range(5):
                x.iput(peer, data, stride=2)
                x.iget(peer, n, stride=2, dst=back)  # (its span: one get)
                x.iget(peer, n, stride=16, dst=sparse)  # (a span 16 times the data)
            world.quiet()

        grew = _growth_kib(world, rounds, rounds=2)
        # (the vector datatypes kept ~170 MiB a round)
        assert grew < 8192, f"{grew} KiB more private memory after 30 strided transfers"
        np.testing.assert_array_equal(back, data)
        np.testing.assert_array_equal(sparse[: n // 8], data[::8][: n // 8])
    finally:
        world.barrier()
        x.close()
