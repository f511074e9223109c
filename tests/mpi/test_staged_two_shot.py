"""An ``"auto"`` all-reduce on a node of 2 ranks runs two-shot where every rank staged its
numpy input the last time that size ran, between the cached plan and streaming stores
(:data:`collectives.allreduce.STAGED_TWO_SHOT`); one-shot otherwise. Every rank decides from
the same ``SRC`` words, so they agree with nothing exchanged (the CI config compares every
call's signature, the algorithm in it), and the result is the same bits either way."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import collectives
import shmem
from collectives.allreduce import STAGED_TWO_SHOT
from shmem import World
from tests.conftest import CI_CONFIG

pytestmark = pytest.mark.mpi

NBYTES = 4 << 20  # in the band
COUNT = NBYTES // 4


@pytest.fixture
def comm(world: World) -> Any:
    c = collectives.Communicator(world)
    yield c
    c.close()


def _input(world: World, r: int, salt: int, count: int = COUNT) -> np.ndarray[Any, Any]:
    return np.random.default_rng(1000 * salt + r).standard_normal(count).astype(np.float32)


def _want(world: World, salt: int, count: int = COUNT) -> np.ndarray[Any, Any]:
    """The rank-order sum in float32, ((x0 + x1) + x2) ..."""
    total = _input(world, 0, salt, count)
    for r in range(1, world.world_size):
        total = total + _input(world, r, salt, count)
    return total


def _check(world: World, out: np.ndarray[Any, Any], salt: int) -> None:
    """The rank-order bits on one node (across nodes the sum is grouped by node)."""
    want = _want(world, salt, out.size)
    if world.num_nodes == 1:
        assert out.tobytes() == want.tobytes(), salt
    else:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def _two_ranks_one_node(world: World) -> bool:
    return world.world_size == 2 and world.num_nodes == 1


def _ran(comm: Any, call: Any) -> str:
    """The one algorithm ``call`` counted in the stats."""
    before = dict(comm.stats.algorithms or {})
    call()
    after = dict(comm.stats.algorithms or {})
    ran = [k for k in after if after[k] != before.get(k, 0)]
    assert len(ran) == 1 and after[ran[0]] - before.get(ran[0], 0) == 1, (before, after)
    return str(ran[0])


# 12 MiB: in pieces (the CI config's 16 MiB scratch holds 8 MiB of stage and its shards)
@pytest.mark.parametrize("nbytes", [NBYTES, 12 << 20], ids=["4MiB", "12MiB"])
def test_numpy_inputs_run_two_shot_from_the_third_call(
    world: World, comm: Any, nbytes: int
) -> None:
    assert STAGED_TWO_SHOT[0] < nbytes < STAGED_TWO_SHOT[1]
    if nbytes != NBYTES and not _two_ranks_one_node(world):
        pytest.skip("the pieces of the band: 2 ranks on one node")
    table = comm.host_channel.table.choose(nbytes, world.world_size, world.num_nodes)
    for salt in range(4):
        x = _input(world, world.rank, salt, nbytes // 4)
        out = np.empty_like(x)
        ran = _ran(comm, lambda x=x, out=out: comm.all_reduce(x, out=out))
        if _two_ranks_one_node(world):  # (after STAGED_CALLS staged calls in a row)
            assert ran == ("one_shot" if salt < 2 else "two_shot"), salt
        else:
            assert ran == table, salt
        _check(world, out, salt)
    if _two_ranks_one_node(world):  # what the next call would run
        assert comm.choose("auto", nbytes, "test") == "two_shot"
        assert comm.choose("one_shot", nbytes, "test") == "one_shot"


# rank 1's input in each call (N numpy, S symmetric) and what runs
SEQUENCES = {
    # three numpy calls: two-shot at the third; rank 1 symmetric: two-shot still (the last
    # calls' words), one-shot after it; numpy again: two-shot at the third
    "switch": ("NNNSSNNN", ["one_shot"] * 2 + ["two_shot"] * 2 + ["one_shot"] * 3 + ["two_shot"]),
    # alternating kinds call by call: one-shot for both, never the worst of each
    "alternate": ("NSNSNS", ["one_shot"] * 6),
}


@pytest.mark.parametrize("sequence", list(SEQUENCES))
def test_a_symmetric_input_on_one_rank_brings_one_shot_back(
    world: World, comm: Any, sequence: str
) -> None:
    if not _two_ranks_one_node(world):
        pytest.skip("2 ranks on one node")
    kinds, want = SEQUENCES[sequence]
    sym = world.zeros(COUNT, np.float32)
    try:
        for salt, algo in enumerate(want):
            x = _input(world, world.rank, salt)
            if kinds[salt] == "S" and world.rank == 1:
                sym.local()[...] = x
                arg: Any = sym
            else:
                arg = x
            out = np.empty_like(x)
            assert _ran(comm, lambda a=arg, o=out: comm.all_reduce(a, out=o)) == algo, salt
            _check(world, out, salt)
    finally:
        sym.close()


@pytest.mark.parametrize("nbytes", [STAGED_TWO_SHOT[1], STAGED_TWO_SHOT[1] + (4 << 20)])
def test_outside_the_band_numpy_inputs_stay_on_the_table(
    world: World, comm: Any, nbytes: int
) -> None:
    """From STREAM_MIN one-shot's stage streams: the table's choice stays (the scratch cap
    of the CI config cuts these into pieces; the band counts the whole call)."""
    table = comm.host_channel.table.choose(nbytes, world.world_size, world.num_nodes)
    x = np.full(nbytes // 4, world.rank + 1, np.float32)
    for _ in range(2):
        out = np.empty_like(x)
        comm.all_reduce(x, out=out)
        assert (out == sum(range(1, world.world_size + 1))).all()
        assert comm.choose("auto", nbytes, "test") == table


def test_a_forced_one_shot_stays_one_shot(world: World, comm: Any) -> None:
    x = _input(world, world.rank, 0)
    for _ in range(3):
        out = np.empty_like(x)
        algo = "hierarchical" if world.num_nodes > 1 else "one_shot"
        assert _ran(comm, lambda o=out: comm.all_reduce(x, out=o, algorithm="one_shot")) == algo
        _check(world, out, 0)


@pytest.mark.parametrize(
    "setting",
    [{"collectives_algorithm": "one_shot"}, {"collectives_one_shot_max_nbytes": "64MiB"}],
    ids=["algorithm", "one_shot_max_nbytes"],
)
def test_a_table_from_the_config_is_kept(setting: dict[str, Any]) -> None:
    """One-shot asked for in the config (every call, or up to a size) stays one-shot: only
    the measured table gives way to two-shot."""
    world = shmem.init(CI_CONFIG, **setting)
    comm = collectives.Communicator(world)
    try:
        want = "hierarchical" if world.num_nodes > 1 else "one_shot"
        for salt in range(3):
            x = _input(world, world.rank, salt)
            out = np.empty_like(x)
            assert _ran(comm, lambda x=x, o=out: comm.all_reduce(x, out=o)) == want, salt
            _check(world, out, salt)
    finally:
        comm.close()
        world.finalize()
