"""Teams (issue 14): the world and shared teams, split_strided, split_2d, translate_pe,
contexts on a team, and every collective on a team (barrier, broadcast, the all-reduce
family, fcollect, collect, alltoall, alltoalls) with determinism and mismatch detection.
At 1-4 ranks and on the RMA path."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import Communicator
from shmem import World
from shmem.errors import (
    ArgumentError,
    CollectiveArgumentError,
    CollectiveMismatchError,
    OpError,
    ShmemStateError,
)
from shmem.team import Team, TeamConfig

pytestmark = pytest.mark.mpi


def test_world_and_shared_teams(world: World) -> None:
    tw, ts = world.team_world, world.team_shared
    assert (tw.my_pe, tw.n_pes) == (world.rank, world.world_size)
    assert ts.n_pes == world.local_size and ts.my_pe == world.local_rank
    assert all(world.heap.is_local(r) for r in ts.members)
    assert tw.translate_pe(world.rank, ts) == world.local_rank
    for r in range(world.world_size):
        assert tw.translate_pe(r, ts) == (ts.members.index(r) if r in ts else -1)
    assert tw.get_config() == TeamConfig()
    with pytest.raises(ShmemStateError, match="belongs to the World"):
        tw.destroy()
    with pytest.raises(ArgumentError, match="invalid rank"):
        tw.translate_pe(world.world_size, ts)


def test_split_strided_keeps_the_named_ranks(world: World) -> None:
    p = world.world_size
    evens = world.team_world.split_strided(0, 2, (p + 1) // 2, TeamConfig(num_contexts=1))
    if world.rank % 2:
        assert evens is None
    else:
        assert evens is not None
        assert evens.members == tuple(range(0, p, 2))
        assert evens.my_pe == world.rank // 2
        assert evens.get_config().num_contexts == 1
        assert evens.translate_pe(evens.my_pe, world.team_world) == world.rank
        # a split of a split: the last member alone
        last = evens.split_strided(evens.n_pes - 1, 1, 1)
        assert (last is None) == (evens.my_pe != evens.n_pes - 1)
        if last is not None:
            assert last.members == (evens.members[-1],)
            last.destroy()
        evens.barrier()
        evens.destroy()
        assert evens.destroyed
        with pytest.raises(ShmemStateError, match="destroyed"):
            evens.barrier()
    world.barrier()


def test_split_arguments_are_refused_on_every_rank(world: World) -> None:
    p = world.world_size
    with pytest.raises(ArgumentError, match="out of the parent team"):
        world.team_world.split_strided(0, 1, p + 1)
    with pytest.raises(ArgumentError, match="invalid size/stride"):
        world.team_world.split_strided(0, 0, 2)
    with pytest.raises(ArgumentError, match="invalid xrange"):
        world.team_world.split_2d(0)
    if p > 1:  # ranks disagree: every rank raises
        with pytest.raises(CollectiveMismatchError, match="ranks disagree"):
            world.team_world.split_strided(0, 1, 1 + world.rank % 2)
    world.barrier()


def test_split_2d_grid(world: World) -> None:
    p = world.world_size
    xteam, yteam = world.team_world.split_2d(2)
    x, y = world.rank % 2, world.rank // 2
    assert xteam.members == tuple(range(2 * y, min(2 * y + 2, p)))
    assert yteam.members == tuple(range(x, p, 2))
    assert (xteam.my_pe, yteam.my_pe) == (x, y)
    for t in (xteam, yteam):
        t.destroy()
    world.barrier()


def _odd_even(world: World) -> Team:
    """Ranks of the same parity, in a team (every rank is in one)."""
    p = world.world_size
    parity = world.rank % 2
    teams = [world.team_world.split_strided(k, 2, len(range(k, p, 2))) for k in range(min(p, 2))]
    team = teams[parity]
    assert team is not None
    for k, t in enumerate(teams):
        assert (t is None) == (k != parity)
    return team


def test_context_on_a_team_takes_team_ranks(world: World) -> None:
    team = _odd_even(world)
    with world.zeros(4, "int64") as x:
        with team.create_ctx() as ctx:
            right = (team.my_pe + 1) % team.n_pes
            x.put_nbi(right, np.full(4, world.rank, np.int64), ctx=ctx)
            ctx.quiet()
            with pytest.raises(ArgumentError, match="invalid rank"):
                ctx.put_nbi(x, team.n_pes, np.zeros(4, np.int64))
        world.barrier()
        left = team.members[(team.my_pe - 1) % team.n_pes]
        assert x.local().tolist() == [left] * 4
        world.barrier()
    team.destroy()


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64"])
def test_team_all_reduce_is_deterministic(world: World, name: str) -> None:
    team = _odd_even(world)
    with Communicator(team) as comm:
        assert (comm.rank, comm.world_size) == (team.my_pe, team.n_pes)
        rng = np.random.default_rng(world.rank)
        x = (rng.standard_normal(1000) * 100).astype(name)
        got = comm.all_reduce(x)
        rows = team.comm.allgather(x)
        acc = np.float32 if name != "int64" else np.int64
        want = rows[0].astype(acc)
        for row in rows[1:]:
            want = want + row.astype(acc)
        np.testing.assert_array_equal(got, want.astype(name))  # team order, rounded once
        every = team.comm.allgather(got.tobytes())
        assert len(set(every)) == 1  # bitwise identical on every member
        mx = comm.all_reduce(x, "max")
        np.testing.assert_array_equal(mx, np.max(np.stack(rows), axis=0))
        shard = comm.reduce_scatter(x)
        from collectives import shard_bounds

        a, b = shard_bounds(1000, team.n_pes)[team.my_pe]
        np.testing.assert_array_equal(shard, got[a:b])
        if name != "int64":
            with pytest.raises(OpError, match="needs an integer"):
                comm.all_reduce(x, "bxor")
    team.destroy()


def test_team_broadcast_gather_alltoall(world: World) -> None:
    team = _odd_even(world)
    n = team.n_pes
    with Communicator(world, team=team) as comm, world.zeros(6, "int32") as buf:
        buf.local()[...] = world.rank
        comm.broadcast(buf, root=n - 1)
        assert buf.local().tolist() == [team.members[n - 1]] * 6
        g = comm.fcollect(np.full(3, team.my_pe, np.int16))
        assert g.tolist() == [r for r in range(n) for _ in range(3)]
        v = comm.collect(np.arange(team.my_pe + 1, dtype=np.float64))
        assert v.tolist() == [float(k) for r in range(n) for k in range(r + 1)]
        a = comm.alltoall(np.array([10 * team.my_pe + j for j in range(n)], np.int64))
        assert a.tolist() == [10 * i + team.my_pe for i in range(n)]
        # strided: 2 elements per peer, taken every 2nd element, stored every 3rd
        src = np.arange(4 * n, dtype=np.int32) + 100 * team.my_pe
        s = comm.alltoalls(src, 2, src_stride=2, dst_stride=3)
        want = np.zeros((2 * n - 1) * 3 + 1, np.int32)
        want[::3] = [100 * i + 2 * (2 * team.my_pe + k) for i in range(n) for k in range(2)]
        np.testing.assert_array_equal(s, want)
        comm.barrier()
        with pytest.raises(CollectiveArgumentError, match="invalid root"):
            comm.broadcast(buf, root=n)
        if n > 1:
            with pytest.raises(CollectiveMismatchError):
                comm.all_reduce(np.zeros(2 + team.my_pe % 2, np.float32))
        comm.barrier()
    team.destroy()


def test_world_communicator_collect_and_alltoalls(world: World) -> None:
    p = world.world_size
    with Communicator(world) as comm:
        v = comm.collect(np.full(world.rank, world.rank, np.int64))
        assert v.tolist() == [r for r in range(p) for _ in range(r)]
        s = comm.alltoalls(np.arange(p, dtype=np.float32) + 10 * world.rank, 1)
        assert s.tolist() == [10.0 * i + world.rank for i in range(p)]
        assert comm.alltoall(np.arange(p, dtype=np.int32) * 0 + world.rank).tolist() == list(
            range(p)
        )


def test_collect_into_out_like_the_rest_of_its_family(world: World) -> None:
    p = world.world_size
    total = p * (p - 1) // 2
    want = [r for r in range(p) for _ in range(r)]
    with Communicator(world) as comm, world.zeros(max(total, 1), "int64") as sym:
        out = np.full(total, -1, np.int64)
        got = comm.collect(np.full(world.rank, world.rank, np.int64), out=out)
        assert got is out and out.tolist() == want
        if total:  # a symmetric out: the rank's own copy is written
            into = sym if total == sym.count else sym[:total]
            assert comm.collect(np.full(world.rank, world.rank, np.int64), out=into) is into
            assert into.local().tolist() == want
        # one rank's out of the wrong size: every rank raises, before any data moves
        bad = np.empty(total + (1 if world.rank == p - 1 else 0), np.int64)
        wrong = (
            rf"out has the wrong size \(team rank {p - 1}: {total + 1} elements; expected {total}"
        )
        with pytest.raises(CollectiveArgumentError, match=wrong):
            comm.collect(np.full(world.rank, world.rank, np.int64), out=bad)
        with pytest.raises(CollectiveArgumentError, match=r"invalid out .* x's dtype int64"):
            comm.collect(np.zeros(1, np.int64), out=np.empty(p, np.float64))
        again = comm.collect(np.full(world.rank, world.rank, np.int64))  # still in step
        assert again.tolist() == want


def test_subteam_is_made_by_its_members_only(world: World) -> None:
    """Team.subteam (issue 31): any ranks in any order, collective over those ranks only;
    a Communicator on it runs every collective among them, all_to_allv included."""
    n, me = world.world_size, world.rank
    tw = world.team_world
    members = list(reversed(range(0, n, 2)))  # even ranks, highest first
    if me in members:
        team = tw.subteam(members, tag=7)
        assert team.members == tuple(members) and team.my_pe == members.index(me)
        with Communicator(team) as comm:
            size, r = team.n_pes, team.my_pe
            x = np.arange(size * (r + 1), dtype=np.int64) + 100 * r  # r + 1 to each member
            got = comm.all_to_allv(x, [r + 1] * size, list(range(1, size + 1)))
            want = np.concatenate(
                [np.arange(r * (i + 1), (r + 1) * (i + 1)) + 100 * i for i in range(size)]
            )
            assert np.array_equal(got, want)
            assert int(comm.all_reduce(np.array([me]))[0]) == sum(members)
        team.destroy()
    if n > 1:
        with pytest.raises(ArgumentError, match="is not one of ranks"):
            tw.subteam([r for r in range(n) if r != me], tag=1)
    with pytest.raises(ArgumentError, match="invalid ranks"):
        tw.subteam([me, me])
    world.barrier()


def test_all_to_allv_checks_counts_on_every_rank(world: World) -> None:
    n, me = world.world_size, world.rank
    with Communicator(world) as comm:
        sends = [(me + j) % 3 for j in range(n)]
        recvs = [(i + me) % 3 for i in range(n)]
        x = np.full(sum(sends), me, dtype=np.float32)
        out = comm.all_to_allv(x, sends, recvs)
        assert np.array_equal(out, np.repeat(np.arange(n, dtype=np.float32), recvs))
        with pytest.raises(CollectiveArgumentError, match="invalid send_counts"):
            comm.all_to_allv(x, [*sends[:-1], -1], recvs)
        if n > 1:
            bad = list(recvs)
            if me == 0:
                bad[1] += 1  # expects one more element from rank 1 than it sends
            with pytest.raises(CollectiveArgumentError, match="do not pair up"):
                comm.all_to_allv(x, sends, bad, out=np.empty(sum(bad), np.float32))
