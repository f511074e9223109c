"""The GPU engine: the nvshmem backend's collectives, as CUDA kernels over the heap's peer
pointers (:mod:`collectives.gpu`, :mod:`collectives.gpu_family`).

Importing this module loads CUDA: a Communicator imports it only on the nvshmem backend.
``collect``, ``alltoalls`` and ``all_to_allv`` have no kernels: they run as the team
collectives of the World's ranks (made on their first call), on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from shmem import World, flight

from ..gpu_family import GpuCollectives
from ..ops import ReduceOp
from ..schedule import Algorithm
from ..stats import CommStats
from ..team import TeamCollectives
from .base import ChannelFree, Input, Output, Result, check_live
from .team import team_collectives

__all__ = ["GpuEngine"]


class GpuEngine(ChannelFree):
    """The GPU collectives of a World's ranks (collective to create)."""

    def __init__(self, world: World, stats: CommStats, acc32: np.dtype[Any]) -> None:
        self.world = world
        self.closed = False
        self.acc32 = acc32
        self.gpu = GpuCollectives(world, stats, acc32)
        self._tc: TeamCollectives | None = None  # collect and alltoalls (made on first use)
        self.stream = flight.recorder().new_stream(range(world.world_size), world.comm.allgather)
        world.barrier()

    def _live(self, where: str) -> GpuCollectives:
        check_live(self.closed, self.world, where)
        return self.gpu

    def _team(self, where: str) -> TeamCollectives:
        check_live(self.closed, self.world, where)
        if self._tc is None:  # collective: every rank makes it on the same call
            self._tc = team_collectives(self.world.team_world, self.acc32)
        return self._tc

    def all_reduce(
        self,
        x: Any,
        op: ReduceOp | str,
        out: Any,
        algorithm: Algorithm | str,
        stream: object,
        out_dtype: Any,
        scale: float | None,
    ) -> Result:
        gpu = self._live("all_reduce")
        res = gpu.all_reduce(
            x, str(op), out, str(algorithm), stream=stream, out_dtype=out_dtype, scale=scale
        )
        return cast("Result", res)

    def reduce_scatter(self, x: Input, op: ReduceOp | str, out: Output, stream: object) -> Input:
        gpu = self._live("reduce_scatter")
        return cast("Input", gpu.family("reduce_scatter", x, out, op=str(op), stream=stream))

    def all_gather(self, x: Input, out: Output, stream: object) -> Input:
        gpu = self._live("all_gather")
        return cast("Input", gpu.family("all_gather", x, out, stream=stream))

    def broadcast(self, x: Input, root: int, out: Output, stream: object) -> Input:
        gpu = self._live("broadcast")
        return cast("Input", gpu.family("broadcast", x, out, root=root, stream=stream))

    def all_to_all(self, x: Input, out: Output, stream: object) -> Input:
        gpu = self._live("all_to_all")
        return cast("Input", gpu.family("all_to_all", x, out, stream=stream))

    def collect(self, x: Input, out: Output) -> Input:
        return self._team("collect").collect(x, out)

    def alltoalls(
        self, x: Input, nelems: int, dst_stride: int, src_stride: int, out: Output
    ) -> Input:
        tc = self._team("alltoalls")
        return tc.alltoalls(x, nelems, dst_stride=dst_stride, src_stride=src_stride, out=out)

    def all_to_allv(
        self, x: Input, send_counts: Sequence[int], recv_counts: Sequence[int], out: Output
    ) -> Input:
        return self._team("all_to_allv").all_to_allv(x, send_counts, recv_counts, out)

    def barrier(self, timeout: float | None) -> None:
        self.world.barrier(timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.world.finalized:  # the heap is gone with the World: nothing left to free
            return
        self.gpu.close()
        if self._tc is not None:
            self._tc.close()
