"""World life cycle: init/finalize, ranks, node split, state errors (COMM_SELF and COMM_WORLD)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from mpi4py import MPI

import shmem
from shmem.errors import BackendUnavailableError, ConfigError, ShmemStateError
from tests.conftest import CI_CONFIG

pytestmark = pytest.mark.mpi


@pytest.fixture(params=["self", "world"])
def comm(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield MPI.COMM_SELF if request.param == "self" else MPI.COMM_WORLD


def test_init_reports_ranks_and_node(comm: Any) -> None:
    with shmem.init(CI_CONFIG, comm=comm) as world:
        assert world.rank == comm.Get_rank()
        assert world.world_size == comm.Get_size()
        assert world.backend == "host"
        assert world.comm != comm  # duplicated
        split = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        split_cfg = world.config.heap.node_split
        if comm == MPI.COMM_SELF:
            assert (world.local_rank, world.local_size, world.num_nodes) == (0, 1, 1)
        elif split_cfg == "rank":
            assert (world.local_rank, world.local_size) == (0, 1)
            assert (world.node, world.num_nodes) == (world.rank, world.world_size)
        elif split_cfg.isdigit():  # nodes of K consecutive ranks (all on this machine here)
            k, p = int(split_cfg), world.world_size
            assert world.local_rank == world.rank % k and world.node == world.rank // k
            assert world.num_nodes == -(-p // k)
        else:
            assert (world.local_rank, world.local_size) == (split.Get_rank(), split.Get_size())
            assert world.num_nodes == 1 and world.node == 0
        split.Free()
        assert shmem.get_world() is world
    assert world.finalized
    with pytest.raises(ShmemStateError, match="not initialised"):
        shmem.get_world()


def test_init_twice_and_finalize_without_init() -> None:
    with pytest.raises(ShmemStateError, match="finalize: shmem is not initialised"):
        shmem.finalize()
    world = shmem.init(CI_CONFIG)
    try:
        with pytest.raises(ShmemStateError, match="init: already initialised"):
            shmem.init(CI_CONFIG)
    finally:
        shmem.finalize()
    with pytest.raises(ShmemStateError, match="already finalized"):
        world.finalize()


def test_use_after_finalize_raises() -> None:
    world = shmem.init(CI_CONFIG)
    buf = world.empty(4, "int32")
    world.finalize()
    with pytest.raises(ShmemStateError, match=r"World.empty: the World is finalized"):
        world.empty(4)
    with pytest.raises(ShmemStateError, match="closed"):
        buf.local()
    with pytest.raises(ShmemStateError, match="finalized"):
        world.barrier()
    with pytest.raises(ShmemStateError, match="finalized"):
        world.signal(0, 0, 1)


def test_keywords_override_the_file() -> None:
    with shmem.init(CI_CONFIG, heap_nbytes="8MiB", signal_slots=16) as world:
        assert world.config.heap.nbytes == 8 << 20
        assert world.signals.slots == 16
        assert world.config.heap.check_symmetry is True  # from ci.toml


def test_bad_config_and_backend_raise_before_any_collective() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        shmem.init(CI_CONFIG, heap_size=1)
    with pytest.raises(BackendUnavailableError, match="unknown backend"):
        shmem.init(CI_CONFIG, backend="cuda")
    if not os.path.exists("/dev/nvidiactl"):
        with pytest.raises(BackendUnavailableError, match="'nvshmem' is unavailable"):
            shmem.init(CI_CONFIG, backend="nvshmem")
    with pytest.raises(ValueError, match="keyword overrides need a config path"):
        shmem.init(shmem.load_config(CI_CONFIG), heap_nbytes=1)


def test_exception_in_with_block_tears_down_locally() -> None:
    with pytest.raises(RuntimeError, match="user error"), shmem.init(CI_CONFIG):
        raise RuntimeError("user error")
    # the runtime is usable again afterwards
    with shmem.init(CI_CONFIG) as world:
        world.barrier()


def test_init_logs_one_line_per_rank(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="shmem.world")
    with shmem.init(CI_CONFIG) as world:
        lines = [r.getMessage() for r in caplog.records if r.name == "shmem.world"]
        assert len(lines) == 1
        assert f"rank {world.rank}/{world.world_size} (local {world.local_rank}/" in lines[0]
        assert "backend host" in lines[0]
