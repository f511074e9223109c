"""Call signatures: always-on detection of mismatched collectives, at no extra exchange.

Every collective packs what all ranks must agree on (the collective, element count, dtype,
op, root) into one int64 and publishes it in its ``SIG`` flag before it raises ``READY``.
A rank that has waited for a peer's ``READY`` compares the peer's signature with its own
before it reads anything of the peer's, and raises :class:`CollectiveMismatchError` naming
each node-local rank's call (then retracts its flags, so the peers stop too). The check costs
a load and a compare per peer: no message, no barrier.

Layout (low bit first): collective 4 bits (``alltoalls`` counts ``nelems``, ``collect`` no
count, as its ranks' counts may differ), dtype 5, op 4, root + 1 12 (0: no root), count 38
(counts beyond 2**38 - 1 share the top value). Bit 63 stays clear: a signature is positive.
"""

from __future__ import annotations

from shmem import SUPPORTED_DTYPES

from .ops import OPS

__all__ = ["COLLECTIVES", "describe", "signature"]

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
    "collect",
    "alltoalls",
)
_NO_COUNT = ("collect",)  # counts may differ between ranks: not part of the call
_DTYPES = tuple(sorted(SUPPORTED_DTYPES))
_MAX_ROOT = (1 << 12) - 2
_MAX_COUNT = (1 << 38) - 1


def signature(record: tuple[object, ...]) -> int:
    """The signature of an agreed argument record ``(name, count, dtype name, *extra)``
    (the record :func:`collectives.operand.agree` compares); 0 when it is not one."""
    if len(record) < 3:
        return 0
    name = str(record[0]).rsplit(".", 1)[-1]
    count, dtype = record[1], record[2]
    if name not in COLLECTIVES or not isinstance(count, int) or dtype not in _DTYPES:
        return 0
    op = root = 0
    if name == "alltoalls":  # (where, count of x, dtype, nelems, strides...): x's size is local
        count = record[3] if len(record) > 3 and isinstance(record[3], int) else 0
        record = record[:3]
    elif name in _NO_COUNT:
        count = 0
    for extra in record[3:]:
        if isinstance(extra, str) and extra in OPS:
            op = OPS.index(extra) + 1
        elif isinstance(extra, int) and not isinstance(extra, bool) and 0 <= extra <= _MAX_ROOT:
            root = extra + 1
        elif isinstance(extra, str) and extra.isdigit() and int(extra) <= _MAX_ROOT:
            root = int(extra) + 1  # a root recorded by its repr
    return (
        (COLLECTIVES.index(name) + 1)
        | _DTYPES.index(str(dtype)) << 4
        | op << 9
        | root << 13
        | min(count, _MAX_COUNT) << 25
    )


def describe(sig: int) -> str:
    """A signature as a call: ``all_reduce(1000 float32, op=sum)``; any int64 (a word
    that is not a signature reads as ``?`` fields, never an error)."""
    if sig <= 0:
        return "no collective" if sig == 0 else "an abandoned call"
    if not 0 < (sig & 0xF) <= len(COLLECTIVES) or (sig >> 4) & 0x1F >= len(_DTYPES):
        # bytes that are not a signature: a member whose block had another size
        return "another call (its exchange had another size)"
    name = COLLECTIVES[(sig & 0xF) - 1]
    dtype_idx = (sig >> 4) & 0x1F
    dtype = _DTYPES[dtype_idx] if dtype_idx < len(_DTYPES) else "?"
    op = (sig >> 9) & 0xF
    root = (sig >> 13) & 0xFFF
    count = sig >> 25
    parts = [dtype if name in _NO_COUNT else f"{count}{'+' if count == _MAX_COUNT else ''} {dtype}"]
    if op:
        parts.append(f"op={OPS[op - 1] if op <= len(OPS) else '?'}")
    if root:
        parts.append(f"root={root - 1}")
    return f"{name}({', '.join(parts)})"
