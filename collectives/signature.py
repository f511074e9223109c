"""Call signatures: always-on detection of mismatched collectives, at no extra exchange.

Every collective packs what all ranks must agree on (the collective, element count, dtype,
op, root, the all-reduce's algorithm) into one int64 and publishes it in its ``SIG`` flag
before it raises ``READY``. A rank that has waited for a peer's ``READY`` compares the
peer's signature with its own before it reads anything of the peer's, and raises
:class:`CollectiveMismatchError` (then retracts its flags, so the peers stop too); the
Communicator then has every rank describe its own call (:mod:`shmem.callreport`). The check
costs a load and a compare per peer: no message, no barrier.

Layout (low bit first): collective 4 bits (``alltoalls`` counts ``nelems``; ``collect`` and
``all_to_allv`` no count, as their ranks' counts may differ), dtype 5, op 4, root + 1 12
(0: no root), algorithm 2 (the one that runs: ``"auto"`` resolved, 0 where none), count 36
(counts beyond 2**36 - 1 share the top value). Bit 63 stays clear: a signature is positive.

:func:`describe_call` is the other half: a call as its rank describes it, from the caller's
own arguments, for the report.
"""

from __future__ import annotations

from typing import Any

from shmem import SUPPORTED_DTYPES
from shmem.dtypes import as_dtype, dtype_name

from .ops import OPS
from .schedule import ALGORITHMS

__all__ = [
    "BARRIER",
    "CALLS",
    "COLLECTIVES",
    "collective_of",
    "describe",
    "describe_args",
    "describe_call",
    "signature",
]

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
    "collect",
    "alltoalls",
    "barrier",
    "all_to_allv",
)
# every call a signature names: the Communicator's collectives, then the calls made of
# several steps whose first one all ranks make together (collectives.barrier.meet)
CALLS = (*COLLECTIVES, "sequence_parallel_attention", "sequence_parallel_attention_backward")
_NO_COUNT = (  # counts may differ between ranks: not part of the call
    "collect",
    "barrier",
    "all_to_allv",
    "sequence_parallel_attention",
    "sequence_parallel_attention_backward",
)
_DTYPES = tuple(sorted(SUPPORTED_DTYPES))
_MAX_ROOT = (1 << 12) - 2
_COUNT_SHIFT = 27
_MAX_COUNT = (1 << 36) - 1


def signature(record: tuple[object, ...]) -> int:
    """The signature of an agreed argument record ``(name, count, dtype name, *extra)``
    (the record :func:`collectives.operand.agree` compares); 0 when it is not one."""
    if len(record) < 3:
        return 0
    name = str(record[0]).rsplit(".", 1)[-1]
    count, dtype = record[1], record[2]
    if name not in CALLS or not isinstance(count, int) or dtype not in _DTYPES:
        return 0
    op = root = algorithm = 0
    if name == "alltoalls":  # (where, count of x, dtype, nelems, strides...): x's size is local
        count = record[3] if len(record) > 3 and isinstance(record[3], int) else 0
        record = record[:3]
    elif name in _NO_COUNT:
        count = 0
    for extra in record[3:]:
        if isinstance(extra, str) and extra in OPS:
            op = OPS.index(extra) + 1
        elif isinstance(extra, str) and extra in ALGORITHMS:
            algorithm = ALGORITHMS.index(extra) + 1
        elif isinstance(extra, int) and not isinstance(extra, bool) and 0 <= extra <= _MAX_ROOT:
            root = extra + 1
        elif isinstance(extra, str) and extra.isdigit() and int(extra) <= _MAX_ROOT:
            root = int(extra) + 1  # a root recorded by its repr
    return (
        (CALLS.index(name) + 1)
        | _DTYPES.index(str(dtype)) << 4
        | op << 9
        | root << 13
        | algorithm << 25
        | min(count, _MAX_COUNT) << _COUNT_SHIFT
    )


def collective_of(sig: int) -> str:
    """The collective a signature names ("" for a word that is not a signature)."""
    return CALLS[(sig & 0xF) - 1] if sig > 0 and 0 < sig & 0xF <= len(CALLS) else ""


BARRIER = signature(("barrier", 0, "uint8"))
"""The signature of a Communicator's barrier."""


# the engine methods' arguments after ``x``, as a report shows them (None: not shown)
_SHOWN: dict[str, tuple[str | None, ...]] = {
    "all_reduce": ("op", None, "algorithm", None, "out_dtype", "scale"),
    "reduce_scatter": ("op",),
    "broadcast": ("root",),
    "alltoalls": ("nelems", "dst_stride", "src_stride"),
    "all_to_allv": ("send_counts", "recv_counts"),
}


def describe_args(name: str, args: tuple[object, ...]) -> str:
    """:func:`describe_call` of an engine method's positional arguments ``args`` (``x``
    first; none for a barrier): ``describe_args("broadcast", (x, 0))`` is
    ``broadcast(16 float32, root=0)``."""
    if name == "barrier" or not args:
        return f"{name}()"
    shown = zip(_SHOWN.get(name, ()), args[1:], strict=False)
    return describe_call(name, args[0], **{k: v for k, v in shown if k is not None})


def describe_call(name: str, x: object = None, **options: Any) -> str:
    """A call as its rank describes it, from the caller's own arguments:
    ``all_reduce(16 float32, op=sum, algorithm=auto)`` (options that are None are left out;
    ``x``: the input, counted and typed; None: no input, as a barrier).

    Parameters
    ----------
    name : str
        The collective.
    x : SHMEMBuffer, numpy.ndarray or Buffer, optional
        Its input.
    **options
        Its other arguments, in the order to show them.

    Returns
    -------
    str
    """
    parts = [] if x is None else [_operand(x)]
    parts += [f"{key}={_option(key, value)}" for key, value in options.items() if value is not None]
    return f"{name}({', '.join(parts)})"


def _option(key: str, value: object) -> str:
    """An option's value as a report shows it (long lists cut, dtypes by name, enums by
    value)."""
    if isinstance(value, list | tuple) and len(value) > 8:
        return f"[{', '.join(map(str, value[:8]))}, ... ({len(value)} in all)]"
    if key.endswith("dtype"):
        return _dtype_text(value)
    if not isinstance(value, str | int | float | list | tuple):
        return str(getattr(value, "value", type(value).__name__))  # an enum, or an object
    return str(value)


def _operand(x: object) -> str:
    """``16 float32`` for an array-like ``x`` (its element count and dtype), else its type."""
    count = getattr(x, "size", None)
    if count is None:
        count = getattr(x, "count", None)
    dtype = getattr(x, "dtype", None)
    if not isinstance(count, int) or dtype is None:
        return f"a {type(x).__name__}"
    return f"{count} {_dtype_text(dtype)}"


def _dtype_text(dtype: object) -> str:
    """A dtype by its canonical name (``bfloat16``), anything else as it prints."""
    try:
        return dtype_name(as_dtype(dtype, "describe_call"))
    except (TypeError, ValueError, KeyError):
        return str(dtype)


def describe(sig: int) -> str:
    """A signature as a call: ``all_reduce(1000 float32, op=sum)``; any int64 (a word
    that is not a signature reads as ``?`` fields, never an error)."""
    if sig <= 0:
        if sig == 0:
            return "no collective"
        return "an abandoned call" + (" (ranks called different collectives)" if sig == -2 else "")
    if not 0 < (sig & 0xF) <= len(CALLS) or (sig >> 4) & 0x1F >= len(_DTYPES):
        # bytes that are not a signature: a member whose block had another size
        return "another call (its exchange had another size)"
    name = CALLS[(sig & 0xF) - 1]
    if name == "barrier" or name.startswith("sequence_parallel"):
        return f"{name}()"
    dtype_idx = (sig >> 4) & 0x1F
    dtype = _DTYPES[dtype_idx] if dtype_idx < len(_DTYPES) else "?"
    op = (sig >> 9) & 0xF
    root = (sig >> 13) & 0xFFF
    algorithm = (sig >> 25) & 0x3
    count = sig >> _COUNT_SHIFT
    parts = [dtype if name in _NO_COUNT else f"{count}{'+' if count == _MAX_COUNT else ''} {dtype}"]
    if op:
        parts.append(f"op={OPS[op - 1] if op <= len(OPS) else '?'}")
    if root:
        parts.append(f"root={root - 1}")
    if algorithm:
        parts.append(f"algorithm={ALGORITHMS[algorithm - 1]}")
    return f"{name}({', '.join(parts)})"
