"""Broadcast: ``root``'s ``x`` on every rank, into ``out`` (by default ``x`` itself)."""

from __future__ import annotations

import numpy as np

from shmem import SHMEMBuffer
from shmem.errors import CollectiveArgumentError

from . import pipeline, signed
from .channel import Channel
from .cross import broadcast_across
from .cross_plan import cross_plan
from .family import family_plan
from .operand import Array, Operand

__all__ = ["Broadcast", "broadcast"]


class Broadcast(pipeline.Call):
    """The broadcast's steps of the pipeline (:mod:`collectives.pipeline`): the node-local
    route reads the root's input only."""

    kind = "broadcast"
    default_out_is_x = True

    def __init__(self, ch: Channel, root: object) -> None:
        super().__init__(ch, (int(root) if isinstance(root, int | np.integer) else root,))
        self.given = root
        self.root = -1  # (an invalid root: validate raises)
        if not isinstance(root, bool) and isinstance(root, int | np.integer) and root >= 0:
            self.root = int(root) if root < self.size else -1
        self.readers = [self.root]

    def validate(self, xin: Operand) -> None:
        if self.root < 0:
            raise CollectiveArgumentError(
                f"{self.where}: invalid root (got {self.given!r}; expected 0 <= root < {self.size})"
            )

    def cached(self, ch: Channel, xin: Operand, route: str) -> pipeline.Plan | None:
        if route == pipeline.ON_NODE:
            return family_plan(ch, self.kind, xin, self.root)
        return cross_plan(ch, self.kind, xin, self.root)

    def across(self, ch: Channel, xin: Operand, dst: Array) -> None:
        broadcast_across(ch, ch.comm, xin.array, dst, self.root, self.where)

    def over_mpi(self, ch: Channel, xin: Operand, dst: Array) -> None:
        root = self.root
        if self.rank == root and not np.shares_memory(dst, xin.array):
            np.copyto(dst, xin.array)
        # the root's data is in dst now (it is x itself by default)
        signed.bcast(ch, ch.comm, dst.view(np.uint8), root, self.where)

    def kept(self, xin: Operand, dst: Array) -> bool:
        x = xin.array
        return (
            self.rank == self.root and dst.ctypes.data == x.ctypes.data and dst.nbytes == x.nbytes
        )

    def combine(self, ranks: list[int], inputs: list[Array], target: Array) -> None:
        if not np.shares_memory(target, inputs[0]):
            np.copyto(target, inputs[0])


def broadcast(
    ch: Channel, x: SHMEMBuffer | Array, root: int, out: SHMEMBuffer | Array | None
) -> SHMEMBuffer | Array:
    """``out`` (by default ``x``) = ``root``'s ``x``, on every rank."""
    return pipeline.perform(ch, Broadcast(ch, root), x, out)
