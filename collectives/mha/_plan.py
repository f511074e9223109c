"""Work units of sequence-parallel attention: the plan every rank builds alike (pure).

A *chunk* is a run of one rank's local rows (its *home*). A *unit* is one query chunk, one
key/value chunk and one KV head (with the query heads of its GQA group); units whose chunks
the mask keeps apart are never made. Every rank builds the same :class:`UnitPlan` from the
shard lengths, so unit ids, queues and slot offsets agree without communication.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .scheduler import MaskSpec

__all__ = ["Chunk", "Unit", "UnitPlan", "doc_runs", "pieces", "runs"]


def runs(pos: np.ndarray[Any, Any]) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` local index ranges of consecutive global positions."""
    if pos.size == 0:
        return []
    breaks = np.nonzero(np.diff(pos) != 1)[0] + 1
    edges = [0, *breaks.tolist(), int(pos.size)]
    return list(itertools.pairwise(edges))


def doc_runs(
    pos: np.ndarray[Any, Any], lo: int, hi: int, docs: np.ndarray[Any, Any] | None
) -> list[tuple[int, int]]:
    """Runs of consecutive positions in ``pos[lo:hi]``, also cut at document boundaries."""
    out = []
    for run_a, run_b in runs(pos[lo:hi]):
        start, stop = run_a + lo, run_b + lo
        if docs is not None:
            g0, g1 = int(pos[start]), int(pos[stop - 1]) + 1
            for cut in (int(c) for c in docs if g0 < c < g1):
                mid = start + (cut - int(pos[start]))
                out.append((start, mid))
                start = mid
        out.append((start, stop))
    return out


def pieces(
    q_pos: np.ndarray[Any, Any],
    lo: int,
    hi: int,
    kv_pos: np.ndarray[Any, Any],
    kv_runs: list[tuple[int, int]],
    mask: MaskSpec,
    docs: np.ndarray[Any, Any] | None,
) -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """The tiles of query rows ``q_pos[lo:hi]`` against keys at ``kv_pos`` that the mask
    leaves visible: ``(qa, qb, q_global, ra, g0, s0, s1)``: query rows ``[qa, qb)`` (global
    ``q_global ...``) see keys ``[s0, s1)``, found at local key rows from ``ra`` (global
    ``g0``)."""
    for qa, qb in doc_runs(q_pos, lo, hi, docs):
        q_global = int(q_pos[qa])
        doc_lo, doc_hi = 0, 1 << 62
        if docs is not None:  # runs never cross a document boundary
            d = int(np.searchsorted(docs, q_global, side="right") - 1)
            doc_lo, doc_hi = int(docs[d]), int(docs[d + 1])
        k0, k1 = mask.kv_range(q_global, q_global + qb - qa, 1 << 62)
        for ra, rb in kv_runs:
            g0 = int(kv_pos[ra])
            s0, s1 = max(k0, g0, doc_lo), min(k1, g0 + rb - ra, doc_hi)
            if s1 > s0:
                yield qa, qb, q_global, ra, g0, s0, s1


@dataclass(frozen=True)
class Chunk:
    rank: int  # home
    lo: int  # local rows [lo, hi) of the home rank
    hi: int
    pos: np.ndarray[Any, Any]  # their global positions

    @property
    def rows(self) -> int:
        return self.hi - self.lo


def _chunks(positions: list[np.ndarray[Any, Any]], rows: int | None) -> list[Chunk]:
    """Each rank's rows cut into chunks of ``rows`` (None: one chunk per rank)."""
    chunks = []
    for r, pos in enumerate(positions):
        step = pos.size if rows is None else rows
        for lo in range(0, pos.size, max(step, 1)):
            hi = min(lo + step, pos.size)
            chunks.append(Chunk(r, lo, hi, pos[lo:hi]))
    return chunks


@dataclass(frozen=True)
class Unit:
    id: int  # position in the canonical order (query chunk, KV head, KV chunk)
    q: int  # chunk ids
    kv: int
    head: int  # KV head
    cost: int  # visible (query, key) pairs, tile-rounded: the longest-first key


class UnitPlan:
    """Chunks, units, queues and result-slot layout, the same on every rank (pure).

    ``positions[r]``: global positions of rank ``r``'s rows. ``chunk_rows``: rows per query
    chunk (None: one chunk per rank); ``kv_chunk_rows``: rows per key/value chunk (default
    the same; then one list of chunks serves both sides, else the key/value chunks follow the
    query chunks in :attr:`chunks`). ``order``: ``"lpt"`` (longest first) or ``"ring"`` (by
    ring step: a rank's own keys first, then rank ``r - 1``'s, ...).
    """

    def __init__(
        self,
        positions: list[np.ndarray[Any, Any]],
        chunk_rows: int | None,
        kv_heads: int,
        mask: MaskSpec,
        docs: np.ndarray[Any, Any] | None,
        block_m: int,
        order: str,
        kv_chunk_rows: int | str | None = "same",
    ) -> None:
        size = len(positions)
        self.size = size
        q_chunks = _chunks(positions, chunk_rows)
        if kv_chunk_rows in ("same", chunk_rows):
            chunks, kv_ids = q_chunks, range(len(q_chunks))
        else:
            kv_chunks = _chunks(positions, cast("int | None", kv_chunk_rows))
            chunks = q_chunks + kv_chunks
            kv_ids = range(len(q_chunks), len(chunks))
        self.chunks = chunks
        pairs: list[tuple[int, int, int]] = []
        for qi, qc in enumerate(q_chunks):
            for ki in kv_ids:
                kc = chunks[ki]
                kv_runs = runs(kc.pos)
                cost = 0
                for lo in range(0, qc.rows, block_m):
                    for qa, qb, _, _, _, s0, s1 in pieces(
                        qc.pos, lo, min(lo + block_m, qc.rows), kc.pos, kv_runs, mask, docs
                    ):
                        cost += (qb - qa) * (s1 - s0)
                if cost:
                    pairs.append((qi, ki, cost))
        units = [Unit(0, qi, ki, h, cost) for qi, ki, cost in pairs for h in range(kv_heads)]
        units.sort(key=lambda u: (u.q, u.head, u.kv))
        self.units = [Unit(i, u.q, u.kv, u.head, u.cost) for i, u in enumerate(units)]
        self.by_q_home: list[list[Unit]] = [[] for _ in range(size)]
        self.by_kv_home: list[list[Unit]] = [[] for _ in range(size)]
        for u in self.units:
            self.by_q_home[chunks[u.q].rank].append(u)
        for u in sorted(self.units, key=lambda u: (u.kv, u.head, u.q)):
            self.by_kv_home[chunks[u.kv].rank].append(u)
        self.queues: list[list[Unit]] = []
        for r in range(size):
            mine = self.by_q_home[r]
            if order == "lpt":
                self.queues.append(sorted(mine, key=lambda u: (-u.cost, u.id)))
            else:
                self.queues.append(
                    sorted(mine, key=lambda u: ((r - chunks[u.kv].rank) % size, u.id))
                )

    def slots(
        self, home_units: list[list[Unit]], floats: Callable[[Unit], int]
    ) -> list[dict[int, int]]:
        """Per rank: unit id -> float offset of its slot, laid out in ``home_units`` order."""
        out = []
        for mine in home_units:
            offsets, at = {}, 0
            for u in mine:
                offsets[u.id] = at
                at += floats(u)
            out.append(offsets)
        return out
