"""The mismatch matrix (issue 40): one collective call that differs across ranks in one way
(count, op, dtype, root, or another collective altogether), on a fresh Communicator, the
last rank the odd one out. Every rank must raise ``CollectiveMismatchError`` (never a bare
peer failure, never a timeout), and its table must hold every rank's own account of its
call, numbered as the flight recorder numbers it: the same table on every rank, each line
checked here against what that rank called.

Each cell runs on the world's Communicator (the host engine: node-local flags, MPI between
nodes) and on a team of every rank in reverse order (the team engine: MPI on the team's
communicator, members numbered apart from world ranks), with the shape fresh or already
cached on every rank (the cached replays run then), and twice in a row (a race shows as
one run that differs). The mpi tier runs it at 2, 3 and 4 ranks, with one node and every
rank its own node, on MPICH and on Open MPI.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from shmem import World, flight
from shmem.errors import CollectiveMismatchError

pytestmark = pytest.mark.mpi

Call = tuple[str, Callable[[Any], Any]]  # (the line's text, the call on a Communicator)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """Defaults (no argument checks: the cached replays run); short deadlines, so a cell
    that hangs fails fast."""
    w = shmem.init(heap_nbytes="32MiB", signal_timeout_s=10.0)
    assert not w.config.collectives.check_args
    yield w
    w.finalize()


def _call(name: str, p: int, count: int, dtype: str, op: str, root: int) -> Call:
    """``name`` with these arguments: the report line's text and the call itself."""
    x = np.arange(count).astype(dtype)
    if name == "all_reduce":
        return f"all_reduce({count} {dtype}, op={op}, algorithm=auto)", lambda c: c.all_reduce(
            x, op
        )
    if name == "reduce_scatter":
        return f"reduce_scatter({count} {dtype}, op={op})", lambda c: c.reduce_scatter(x, op)
    if name == "broadcast":
        return f"broadcast({count} {dtype}, root={root})", lambda c: c.broadcast(x, root)
    if name == "alltoalls":
        nelems = count // p
        text = f"alltoalls({count} {dtype}, nelems={nelems}, dst_stride=1, src_stride=1)"
        return text, lambda c: c.alltoalls(x, nelems)
    if name == "all_to_allv":
        counts = [count // p] * p
        text = f"all_to_allv({count} {dtype}, send_counts={counts}, recv_counts={counts})"
        return text, lambda c: c.all_to_allv(x, counts, counts)
    if name == "barrier":
        return "barrier()", lambda c: c.barrier()
    return f"{name}({count} {dtype})", lambda c: getattr(c, name)(x)


# what can differ for each collective (collect's and all_to_allv's counts may differ by
# design; a barrier has only its name)
KINDS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("count", "op", "dtype", "collective"),
    "reduce_scatter": ("count", "op", "dtype", "collective"),
    "all_gather": ("count", "dtype", "collective"),
    "broadcast": ("count", "dtype", "root", "collective"),
    "all_to_all": ("count", "dtype", "collective"),
    "collect": ("dtype", "collective"),
    "alltoalls": ("count", "dtype", "collective"),
    "all_to_allv": ("dtype", "collective"),
    "barrier": ("collective",),
}
CELLS = [(name, kind) for name, kinds in KINDS.items() for kind in kinds]


def _plan(name: str, kind: str, p: int, odd: bool) -> Call:
    """This rank's call in the cell (the odd rank's differs by ``kind``)."""
    count, dtype, op, root = 4 * p, "float32", "sum", 0
    if odd and kind == "count":
        count += p
    elif odd and kind == "dtype":
        dtype = "float64"
    elif odd and kind == "op":
        op = "max"
    elif odd and kind == "root":
        root = 1
    elif odd and kind == "collective":
        name = "broadcast" if name == "all_reduce" else "all_reduce"
    return _call(name, p, count, dtype, op, root)


def _communicator(world: World, on_team: bool) -> collectives.Communicator:
    if not on_team:
        return collectives.Communicator(world)
    p = world.world_size
    team = world.team_world.split_strided(p - 1, -1, p)  # every rank, in reverse order
    assert team is not None
    return collectives.Communicator(team)


@pytest.mark.parametrize("cached", [False, True], ids=["fresh", "cached"])
@pytest.mark.parametrize("on_team", [False, True], ids=["world", "team"])
@pytest.mark.parametrize(("name", "kind"), CELLS, ids=[f"{n}-{k}" for n, k in CELLS])
def test_every_rank_reports_every_rank_s_call(
    world: World, name: str, kind: str, on_team: bool, cached: bool
) -> None:
    p, r = world.world_size, world.rank
    if p == 1:
        pytest.skip("needs two ranks to disagree")
    members = list(range(p))[::-1] if on_team else list(range(p))
    odd = members[-1]  # the last member differs
    texts = [_plan(name, kind, p, q == odd)[0] for q in range(p)]
    mine = _plan(name, kind, p, r == odd)[1]
    same = _call(name, p, 4 * p, "float32", "sum", 0)[1]  # the call every rank agrees on
    for _ in range(2):  # twice in a row: a race would show as one run that differs
        comm = _communicator(world, on_team)
        try:
            if cached:
                same(comm)  # made on every rank: the odd rank's call replays or misses
            with pytest.raises(CollectiveMismatchError) as err:
                mine(comm)
        finally:
            comm.close()
            if on_team:
                comm.team.destroy()
        call = 2 if cached else 1
        got = [(line.rank, line.member, line.call, line.text) for line in err.value.calls]
        want = [(q, m, call, texts[q]) for m, q in enumerate(members)]
        assert got == want, str(err.value)
        for line in err.value.calls:
            assert str(line) in str(err.value)


SP_KINDS = ("count", "op", "dtype", "collective")


@pytest.mark.parametrize("kind", SP_KINDS)
def test_sequence_parallel_attention_mismatches(world: World, kind: str) -> None:
    """Sequence-parallel attention against itself with other heads, another mask or dtype
    (the arguments every rank all-gathers: each rank's record is its line), and against an
    all-reduce on the same Communicator (its first step meets the others on the channel:
    before, both waited out the deadline)."""
    from collectives.mha import sequence_parallel_attention

    p, r = world.world_size, world.rank
    if p == 1:
        pytest.skip("needs two ranks to disagree")
    odd = r == p - 1
    heads = 4 if (odd and kind == "count") else 2
    dtype = np.float16 if (odd and kind == "dtype") else np.float32
    x = np.zeros((4, heads, 8), dtype)
    name = "sequence_parallel_attention"
    for _ in range(2):
        comm = collectives.Communicator(world)
        try:
            with pytest.raises(CollectiveMismatchError) as err:
                if odd and kind == "collective":
                    comm.all_reduce(np.ones(8, np.float32))
                else:
                    sequence_parallel_attention(comm, x, x, x, causal=odd and kind == "op")
        finally:
            comm.close()
        lines = err.value.calls
        assert [(line.rank, line.call) for line in lines] == [(q, 1) for q in range(p)]
        for q, line in enumerate(lines):
            other = q == p - 1
            if other and kind == "collective":
                assert line.text == "all_reduce(8 float32, op=sum, algorithm=auto)"
                continue
            assert line.text.startswith(f"{name}(rows=4, schedule=dynamic, heads=")
            assert f"heads={4 if other and kind == 'count' else 2}," in line.text
            assert f"causal={other and kind == 'op'}," in line.text
            assert f"dtype={'float16' if other and kind == 'dtype' else 'float32'}," in line.text


@pytest.mark.parametrize("kind", ["count", "dtype", "collective"])
def test_allocations_report_every_rank_s_call(world: World, kind: str) -> None:
    """``World.empty`` of another size or dtype, or against a ``SHMEMBuffer.close``: every
    rank finds it after the allocation barrier and raises with every rank's heap call,
    numbered on the World's stream; nothing is allocated or freed, and the heap stays in
    step (the matched calls after it work)."""
    p, r = world.world_size, world.rank
    if p == 1:
        pytest.skip("needs two ranks to disagree")
    odd = r == p - 1
    gc.collect()  # the earlier cells' failed calls held views of their buffers: gone now,
    world.zeros(1).close()  # and freed at this heap call (shmem.quarantine)
    before = world.heap_stats()
    for _ in range(2):
        spare = world.zeros(4, "int64")
        count = 17 if (odd and kind == "count") else 16
        dtype = "float64" if (odd and kind == "dtype") else "float32"
        # each rank's count of World calls so far (an earlier test's out-of-step World may
        # have left the process's counts apart: the calls from here on are the same)
        base = world.comm.allgather(flight.recorder().calls(0))
        with pytest.raises(CollectiveMismatchError) as err:
            if odd and kind == "collective":
                spare.close()
            else:
                world.empty(count, dtype)
        lines = err.value.calls
        assert len({line.call - base[line.rank] for line in lines}) == 1
        assert lines[0].call > base[0]
        for q, line in enumerate(lines):
            assert line.rank == q and line.seen
            if q == p - 1 and kind == "collective":
                assert line.text == (
                    f"SHMEMBuffer.close() of the buffer at offset {spare.offset} (32 bytes)"
                )
            else:
                n = 17 if (q == p - 1 and kind == "count") else 16
                dt, size = ("float64", 8) if (q == p - 1 and kind == "dtype") else ("float32", 4)
                assert line.text == f"World.empty(shape=({n},), dtype={dt}): {n * size} bytes"
        assert "nothing was allocated or freed" in str(err.value)
        if not spare.closed:
            spare.close()
        else:  # (the close raised on the odd rank: its buffer is still allocated there)
            pytest.fail("a mismatched close must not close")
    assert world.heap_stats() == before
