"""The team engine: a proper team's collectives, on the team's MPI communicator.

A Communicator made for a Team other than the world's runs every call here
(:class:`collectives.team.TeamCollectives`); ranks are team ranks. The host and GPU engines
use the same collectives for ``collect``, ``alltoalls`` and ``all_to_allv``
(:func:`team_collectives`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shmem import flight
from shmem.callreport import Reporter
from shmem.team import Team

from ..ops import ReduceOp
from ..schedule import Algorithm
from ..team import TeamCollectives
from .base import (
    ChannelFree,
    Input,
    Output,
    Result,
    check_live,
    refuse_device_buffers,
    widened_all_reduce,
)

__all__ = ["TeamEngine", "team_collectives"]


def team_collectives(team: Team, acc32: np.dtype[Any]) -> TeamCollectives:
    """``team``'s collectives (collective: every member makes them in the same call)."""
    cfg = team.world.config
    return TeamCollectives(team, cfg.collectives.check_args, cfg.signal.timeout_s, acc32)


class TeamEngine(ChannelFree):
    """The collectives of a proper team (collective over its members to create)."""

    def __init__(self, team: Team, acc32: np.dtype[Any]) -> None:
        self.world = team.world
        self.closed = False
        self.acc32 = acc32
        self.tc = team_collectives(team, acc32)
        self.stream = flight.recorder().new_stream(team.members, self.tc.comm.allgather)
        cfg = team.world.config.signal
        self.reporter = Reporter(self.tc.comm, team.members, cfg.timeout_s, self.tc.progress)

    def _live(self, where: str) -> TeamCollectives:
        check_live(self.closed, self.world, where)
        return self.tc

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
        tc = self._live("all_reduce")
        refuse_device_buffers(x, out)
        if out_dtype is not None or scale is not None:
            return widened_all_reduce(
                self.all_reduce, x, op, out, algorithm, out_dtype, scale, self.acc32
            )
        return tc.all_reduce(x, op, out)

    def reduce_scatter(self, x: Input, op: ReduceOp | str, out: Output, stream: object) -> Input:
        return self._live("reduce_scatter").reduce_scatter(x, op, out)

    def all_gather(self, x: Input, out: Output, stream: object) -> Input:
        return self._live("all_gather").all_gather(x, out)

    def broadcast(self, x: Input, root: int, out: Output, stream: object) -> Input:
        return self._live("broadcast").broadcast(x, root, out)

    def all_to_all(self, x: Input, out: Output, stream: object) -> Input:
        return self._live("all_to_all").all_to_all(x, out)

    def collect(self, x: Input, out: Output) -> Input:
        return self._live("collect").collect(x, out)

    def alltoalls(
        self, x: Input, nelems: int, dst_stride: int, src_stride: int, out: Output
    ) -> Input:
        tc = self._live("alltoalls")
        return tc.alltoalls(x, nelems, dst_stride=dst_stride, src_stride=src_stride, out=out)

    def all_to_allv(
        self, x: Input, send_counts: Sequence[int], recv_counts: Sequence[int], out: Output
    ) -> Input:
        return self._live("all_to_allv").all_to_allv(x, send_counts, recv_counts, out)

    def barrier(self, timeout: float | None) -> None:
        self._live("barrier").barrier(timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.world.finalized:  # else the heap is gone with the World
            self.tc.close()
