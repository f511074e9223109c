"""The large all-reduce across nodes of one rank each on persistent requests (issue 44,
point 2): :class:`collectives.cross.PeerReduce`, made by the cached
:class:`~collectives.allreduce_plans.AcrossPlan` on the second call in a row with the same
arrays. Every call still reads its input's current contents and gives the general path's
result bit for bit, whatever the arrays do between calls (the same, alternating, new ones,
in place, symmetric); and a peer in another call raises on every rank."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from collectives.allreduce_plans import AcrossPlan, whole_gather_limit
from collectives.cross import peer_reduce_fits
from shmem.errors import CollectiveMismatchError

pytestmark = pytest.mark.mpi


def _channel_of_lone_ranks(comm: Any) -> Any:
    """The communicator's host channel; the test skips unless nodes have one rank each."""
    ch = comm.host_channel
    if ch is None or ch.num_nodes == 1 or len(ch.local_peers) != 1 or not ch.uniform_nodes:
        pytest.skip("needs nodes of one rank each (SHMEM_HEAP_NODE_SPLIT=rank)")
    return ch


@pytest.fixture
def across() -> Iterator[tuple[Any, Any, int]]:
    """A World, its Communicator and a float32 count just above the one-round plan's limit
    (so an AcrossPlan whose piece takes a PeerReduce), on nodes of one rank each."""
    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=10.0)
    comm = collectives.Communicator(world)
    try:
        ch = _channel_of_lone_ranks(comm)
        count = whole_gather_limit(ch) // 4 + 1001  # (odd: pieces of different lengths)
        assert peer_reduce_fits(world.world_size, 4 * count)
        yield world, comm, count
    finally:
        comm._closed = True  # (a mismatch leaves it unusable on purpose)
        world._abandon()
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


def _data(rank: int, count: int, salt: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(1000 * salt + rank)
    return rng.standard_normal(count).astype(np.float32)


def _want(p: int, count: int, salt: int) -> np.ndarray[Any, Any]:
    """The sum in rank order, rounded to float32 at every step (the library's order)."""
    acc = _data(0, count, salt)
    for q in range(1, p):
        acc = acc + _data(q, count, salt)
    return acc


def _plan(comm: Any, count: int) -> AcrossPlan:
    plan = comm.host_channel.plans[(count, np.dtype(np.float32), "sum")]
    assert isinstance(plan, AcrossPlan), plan
    return plan


def test_the_same_arrays_keep_their_requests(across: tuple[Any, Any, int]) -> None:
    """numpy in, numpy ``out=``: the requests are made on the second call with the same
    arrays (the first, the general path's, runs the new plan once) and started from then
    on, every call with its input's new contents."""
    world, comm, count = across
    p, r = world.world_size, world.rank
    x, out = np.empty(count, np.float32), np.empty(count, np.float32)
    made = []
    for salt in range(5):
        x[...] = _data(r, count, salt)
        comm.all_reduce(x, out=out)
        assert out.tobytes() == _want(p, count, salt).tobytes(), salt
        made.append(list(_plan(comm, count).peers[0]))
    assert made[0] == []  # (the general path: it makes the plan and runs it once)
    assert len(made[1]) == 1 and all(m == made[1] for m in made[1:])
    assert made[1][0].fits(x, out) and not made[1][0].busy


def test_a_closed_exchange_is_never_started_again(across: tuple[Any, Any, int]) -> None:
    """Once the plan drops an exchange (its requests freed), running it raises instead of
    starting freed requests; the plan's next call makes a new one."""
    world, comm, count = across
    p, r = world.world_size, world.rank
    x, out = _data(r, count, 1), np.empty(count, np.float32)
    for _ in range(2):
        comm.all_reduce(x, out=out)
    plan = _plan(comm, count)
    (peer,) = plan.peers[0]
    peer.close()
    assert not peer.fits(x, out)
    with pytest.raises(RuntimeError, match="reused after close"):
        peer.run(comm.host_channel, x, out, "sum", np.dtype(np.float32), p, "all_reduce")
    plan.peers[0] = []
    for _ in range(2):
        comm.all_reduce(x, out=out)
        assert out.tobytes() == _want(p, count, 1).tobytes()
    assert len(plan.peers[0]) == 1 and plan.peers[0][0] is not peer


@pytest.mark.parametrize("form", ["alternating", "new", "in_place", "symmetric", "sym_in_place"])
def test_every_form_gives_the_general_paths_result(across: tuple[Any, Any, int], form: str) -> None:
    """Arrays that change between calls never meet requests made for others: alternating
    inputs, new arrays each call, in place (a copy of my piece before it is overwritten),
    a symmetric input into a new array and in place on it."""
    world, comm, count = across
    p, r = world.world_size, world.rank
    pair = [np.empty(count, np.float32) for _ in range(2)]
    out = np.empty(count, np.float32)
    sym = world.zeros(count, "float32")
    try:
        for salt in range(6):
            data, want = _data(r, count, salt), _want(p, count, salt)
            if form == "alternating":
                x = pair[salt % 2]
                x[...] = data
                got = comm.all_reduce(x, out=out)
            elif form == "new":
                got = comm.all_reduce(data.copy())
            elif form == "in_place":
                pair[0][...] = data
                got = comm.all_reduce(pair[0], out=pair[0])
            elif form == "symmetric":
                sym.local()[...] = data
                got = comm.all_reduce(sym)
            else:
                sym.local()[...] = data
                got = np.array(comm.all_reduce(sym, out=sym).local())
            assert np.asarray(got).tobytes() == want.tobytes(), (form, salt)
        peers = _plan(comm, count).peers[0]
        if form in ("in_place", "sym_in_place"):
            assert len(peers) == 1 and peers[0].in_place
        elif form == "alternating":  # (two inputs in turn: both kept, one set of rows)
            assert len(peers) == 2 and peers[0].rows is peers[1].rows, peers
    finally:
        sym.close()


def test_a_peer_in_another_call_raises_everywhere(across: tuple[Any, Any, int]) -> None:
    """Once every rank starts the persistent exchange, rank 0 in an all-reduce of another op
    (the general path's exchange, another signature) meets the others' signatures: every
    rank raises ``CollectiveMismatchError`` instead of reducing the other call's data."""
    world, comm, count = across
    r = world.rank
    x, out = np.ones(count, np.float32), np.empty(count, np.float32)
    for _ in range(3):
        comm.all_reduce(x, out=out)
    assert len(_plan(comm, count).peers[0]) == 1
    with pytest.raises(CollectiveMismatchError, match="ranks called different collectives"):
        comm.all_reduce(x, op="max" if r == 0 else "sum", out=out)


def test_a_vector_in_several_pieces_keeps_one_exchange_a_piece() -> None:
    """Beyond the scratch a large all-reduce runs piece by piece (the general path's pieces):
    each piece keeps its own persistent exchange, each call gives the general path's sum."""
    world = shmem.init(
        heap_nbytes="32MiB",
        signal_timeout_s=10.0,
        collectives_scratch_nbytes="256KiB",
        collectives_scratch_max_nbytes="256KiB",
    )
    comm = collectives.Communicator(world)
    try:
        _channel_of_lone_ranks(comm)
        p, r, count = world.world_size, world.rank, 1_000_003
        x, out = np.empty(count, np.float32), np.empty(count, np.float32)
        for salt in range(4):
            x[...] = _data(r, count, salt)
            comm.all_reduce(x, out=out)
            assert out.tobytes() == _want(p, count, salt).tobytes(), salt
        plan = _plan(comm, count)
        assert len(plan.pieces) > 1, plan.pieces
        assert all(len(peers) == 1 for peers in plan.peers), plan.peers
        assert len({id(peers[0]) for peers in plan.peers}) == len(plan.pieces)
    finally:
        comm.close()
        world.finalize()


@pytest.mark.parametrize("count", [None, 1_048_579])
def test_members_on_either_route_meet(across: tuple[Any, Any, int], count: int | None) -> None:
    """Rank 0 passes the same arrays every call (its persistent exchange), the others new
    ones (their exchange made per call): the two routes send the same messages, so they
    meet, at a size whose pieces exceed 256 KiB too (once all-gathered by Iallgatherv
    there, point to point here: a hang)."""
    world, comm, fitted = across
    p, r = world.world_size, world.rank
    n = count or fitted
    x, out = np.empty(n, np.float32), np.empty(n, np.float32)
    kept = []  # (every array stays alive: no two calls see one address)
    for salt in range(5):
        if r == 0:
            x[...] = _data(r, n, salt)
            got = comm.all_reduce(x, out=out)
        else:
            kept += [_data(r, n, salt), np.empty(n, np.float32)]
            got = comm.all_reduce(kept[-2], out=kept[-1])
        assert got.tobytes() == _want(p, n, salt).tobytes(), salt
    assert len(_plan(comm, n).peers[0]) == (1 if r == 0 else 0)


def test_pieces_one_element_apart_take_one_route(across: tuple[Any, Any, int]) -> None:
    """Member 0's piece one element longer than the others', right at the 256 KiB that once
    split the route (each member read its own piece: member 0 all-gathered by Iallgatherv,
    the others point to point, and every member timed out): every route is the vector's."""
    world, comm, _ = across
    p, r = world.world_size, world.rank
    n = p * 65536 + 1
    for salt in range(3):
        got = comm.all_reduce(_data(r, n, salt))
        assert got.tobytes() == _want(p, n, salt).tobytes(), salt


def test_a_member_that_never_comes_times_out_and_the_exchange_is_never_started_again() -> None:
    """Rank 0 skips a call the others make on their persistent exchange: they raise
    ``SignalTimeoutError`` naming rank 0 at the deadline instead of hanging, the exchange
    stays busy (its requests kept with their arrays, never started again), and the job
    finalizes."""
    import time

    from shmem.errors import SignalTimeoutError

    world = shmem.init(heap_nbytes="32MiB", signal_timeout_s=1.0)
    comm = collectives.Communicator(world)
    try:
        ch = _channel_of_lone_ranks(comm)
        n = whole_gather_limit(ch) // 4 + 1001
        x, out = np.ones(n, np.float32), np.empty(n, np.float32)
        for _ in range(3):
            comm.all_reduce(x, out=out)
        (peer,) = _plan(comm, n).peers[0]
        if world.rank != 0:
            start = time.monotonic()
            with pytest.raises(SignalTimeoutError, match=r"rank\(s\) 0 never arrived"):
                comm.all_reduce(x, out=out)
            assert time.monotonic() - start < 5
            assert peer.busy and not peer.fits(x, out)
            assert any(keep[0] is peer for _, keep in ch.pending if isinstance(keep, tuple))
        world.comm.Barrier()
        comm._closed = True  # (broken on purpose: dropped)
    finally:
        world.finalize()
