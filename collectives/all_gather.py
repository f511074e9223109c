"""All-gather: every rank's ``x`` (the same count everywhere), concatenated in rank order."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer

from . import pipeline, signed
from .channel import Channel
from .cross import all_gather_across
from .cross_plan import cross_plan
from .family import family_plan
from .operand import Array, Operand

__all__ = ["AllGather", "all_gather"]


class AllGather(pipeline.Call):
    """The all-gather's steps of the pipeline (:mod:`collectives.pipeline`)."""

    kind = "all_gather"

    def out_count(self, n: int) -> int:
        return n * self.size

    def cached(self, ch: Channel, xin: Operand, route: str) -> pipeline.Plan | None:
        if route == pipeline.ON_NODE:
            return family_plan(ch, self.kind, xin)
        return cross_plan(ch, self.kind, xin)

    def across(self, ch: Channel, xin: Operand, dst: Array) -> None:
        all_gather_across(ch, ch.comm, xin.array, dst, self.where)

    def over_mpi(self, ch: Channel, xin: Operand, dst: Array) -> None:
        send = xin.array.view(np.uint8)
        if np.may_share_memory(send, dst):  # in place (one rank): MPI needs two buffers
            send = send.copy()
        signed.allgather(ch, ch.comm, send, dst.view(np.uint8), self.where)

    def combine(self, ranks: list[int], inputs: list[Array], target: Array) -> None:
        m = inputs[0].shape[0]
        for r, src in zip(ranks, inputs, strict=True):
            np.copyto(target[r * m : (r + 1) * m], src)


def all_gather(
    ch: Channel, x: SHMEMBuffer | Array, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    """``out`` (world size x count, flat) = every rank's ``x`` in rank order."""
    return pipeline.perform(ch, AllGather(ch), x, out)
