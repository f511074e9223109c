"""All-to-all: chunk ``j`` of rank ``i``'s ``x`` becomes chunk ``i`` of rank ``j``'s output
(``count`` must be a multiple of the world size)."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer
from shmem.errors import CollectiveArgumentError

from . import pipeline, signed
from .channel import Channel
from .cross import all_to_all_across
from .cross_plan import cross_plan
from .operand import Array, Operand

__all__ = ["AllToAll", "all_to_all"]


class AllToAll(pipeline.Call):
    """The all-to-all's steps of the pipeline (:mod:`collectives.pipeline`): on the node no
    cached plan (a staged input is read from scratch, so in place is safe)."""

    kind = "all_to_all"

    def validate(self, xin: Operand) -> None:
        if xin.count % self.size:
            raise CollectiveArgumentError(
                f"{self.where}: invalid count (got {xin.count}; expected a multiple of the "
                f"world size {self.size})"
            )

    def cached(self, ch: Channel, xin: Operand, route: str) -> pipeline.Plan | None:
        return None if route == pipeline.ON_NODE else cross_plan(ch, self.kind, xin)

    def across(self, ch: Channel, xin: Operand, dst: Array) -> None:
        all_to_all_across(ch, ch.comm, xin.array, dst, self.where)

    def over_mpi(self, ch: Channel, xin: Operand, dst: Array) -> None:
        send = np.array(xin.array, copy=True).view(np.uint8)  # in place: MPI needs two buffers
        signed.alltoall(ch, ch.comm, send, dst.view(np.uint8), self.where)

    def combine(self, ranks: list[int], inputs: list[Array], target: Array) -> None:
        m, me = target.shape[0] // self.size, self.rank
        for r, src in zip(ranks, inputs, strict=True):
            np.copyto(target[r * m : (r + 1) * m], src[me * m : (me + 1) * m])


def all_to_all(
    ch: Channel, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    """Chunk ``j`` of my ``x`` to rank ``j``; chunk ``i`` of ``out`` from rank ``i``."""
    return pipeline.perform(ch, AllToAll(ch), x, out)
