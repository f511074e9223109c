"""The flight recorder's ring format (:mod:`shmem.flight`), shared by its writers (the
recorder, the C replay of ``collectives._replay``) and its reader."""

from __future__ import annotations

import struct

__all__ = ["LAYOUT", "MAX_RECORDS", "OPS", "STATES", "WAITS", "op_code"]

MAGIC = b"SHFLIGHT"
VERSION = 2
HEADER_BYTES = 128
MAX_STREAMS = 64
RECORD_BYTES = 64
_HEADER = struct.Struct("=8siiiiqqqq")  # magic version record_size capacity rank pid next ...
_RECORD = struct.Struct("=qqddqihhi12s")
assert _RECORD.size == RECORD_BYTES
_T_END_AT, _NUMBER_AT, _STATE_AT = 24, 32, 46  # byte offsets in a record
_MEMBERS_AT = HEADER_BYTES + MAX_STREAMS * 8  # the streams' members, after their counters
_RECORDS_AT = _MEMBERS_AT + MAX_STREAMS * 8
# the word indices of the header's int64 view (the C replay and this module count on them)
_NEXT_WORD, _ENABLED_WORD = 4, 5
LAYOUT = {
    "header_bytes": HEADER_BYTES,
    "records_at": _RECORDS_AT,
    "max_streams": MAX_STREAMS,
    "record_bytes": RECORD_BYTES,
    "next_word": _NEXT_WORD,
    "enabled_word": _ENABLED_WORD,
}
"""The ring's offsets, as the C replay writes it (its constants must match these)."""

EMPTY, PENDING, DONE, FAILED = 0, 1, 2, 3
STATES = {EMPTY: "empty", PENDING: "pending", DONE: "done", FAILED: "failed"}

OPS = (
    "unknown",
    "init",
    "barrier",
    "sync_all",
    "wait_until",
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
    "collect",
    "alltoalls",
    "all_to_allv",
    "sequence_parallel_attention",
    "sequence_parallel_attention_backward",
    "finalize",
    "alloc",
    "free",
    "set_lock",
    "communicator",
)
"""The operations a record names, by code (the C replay is given the code)."""
_OP_CODE = {name: i for i, name in enumerate(OPS)}
WAITS = frozenset({"wait_until", "set_lock"})
"""The operations that are no collectives: a rank's own waits, numbered apart from its
collectives (every rank makes the same collectives, in order, not the same waits)."""
WAIT_COUNTER = MAX_STREAMS - 1  # their counter: no stream's
MAX_RECORDS = 1 << 20


def op_code(op: str) -> int:
    """The code of an operation, as records (and the C replay) store it.

    Parameters
    ----------
    op : str
        A name of ``OPS``.

    Returns
    -------
    int
        Its index in ``OPS`` (0, ``"unknown"``, for a name not there).
    """
    return _OP_CODE.get(op, 0)


_DTYPE_BYTES: dict[object, bytes] = {}


def _dtype_bytes(dtype: object) -> bytes:
    # Cached per dtype: numpy's ``dtype.name`` builds its string on every call (~1 us, on
    # every recorded collective).
    try:
        return _DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        pass
    name = str(getattr(dtype, "name", dtype) or "").removeprefix("torch.")
    field = name.encode("ascii", "replace")[:12]
    try:
        if len(_DTYPE_BYTES) < 256:
            _DTYPE_BYTES[dtype] = field
    except TypeError:  # an unhashable dtype-like: named each time
        pass
    return field
