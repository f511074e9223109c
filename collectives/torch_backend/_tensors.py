"""torch tensors as the numpy arrays the Communicator takes, and torch's reduce ops as ours.

A contiguous CPU tensor becomes a numpy view of the same memory (zero-copy; bfloat16 and
float8 through ``ml_dtypes``, which numpy lacks); a non-contiguous one is staged through a
contiguous copy and written back (:class:`Staged`), so results land in the caller's tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist

from shmem.errors import CollectiveArgumentError, OpError

__all__ = ["Staged", "as_array", "check_tensors", "factor_of", "op_name"]

# torch dtype -> (numpy dtype, the same-width torch dtype that ``.numpy()`` accepts, or None
# when ``.numpy()`` takes the tensor as it is)
_DTYPES: dict[torch.dtype, tuple[np.dtype[Any], torch.dtype | None]] = {
    torch.float32: (np.dtype(np.float32), None),
    torch.float64: (np.dtype(np.float64), None),
    torch.float16: (np.dtype(np.float16), None),
    torch.bfloat16: (np.dtype(ml_dtypes.bfloat16), torch.int16),
    torch.float8_e4m3fn: (np.dtype(ml_dtypes.float8_e4m3fn), torch.uint8),
    torch.float8_e5m2: (np.dtype(ml_dtypes.float8_e5m2), torch.uint8),
    torch.complex64: (np.dtype(np.complex64), None),
    torch.complex128: (np.dtype(np.complex128), None),
    torch.int8: (np.dtype(np.int8), None),
    torch.int16: (np.dtype(np.int16), None),
    torch.int32: (np.dtype(np.int32), None),
    torch.int64: (np.dtype(np.int64), None),
    torch.uint8: (np.dtype(np.uint8), None),
    torch.uint16: (np.dtype(np.uint16), None),
    torch.uint32: (np.dtype(np.uint32), None),
    torch.uint64: (np.dtype(np.uint64), None),
    torch.bool: (np.dtype(np.bool_), None),
}

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
    dist.ReduceOp.PREMUL_SUM: "sum",  # the factor is applied to the input first
}


def check_tensors(where: str, tensors: Sequence[torch.Tensor], device: str = "cpu") -> None:
    """Raise unless every tensor is a dense tensor on ``device`` of a supported dtype."""
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise CollectiveArgumentError(
                f"{where}: tensor {i} is not a torch.Tensor (got {type(t).__name__})"
            )
        if t.layout != torch.strided:
            raise CollectiveArgumentError(
                f"{where}: tensor {i} has layout {t.layout} (expected a dense tensor, "
                "torch.strided; call .to_dense() first)"
            )
        if t.device.type != device:
            why = (
                "a CPU tensor: this World runs the host backend; CUDA tensors need the nvshmem "
                "backend"
                if device == "cpu"
                else "a CUDA tensor: this World runs the nvshmem backend"
            )
            raise CollectiveArgumentError(f"{where}: tensor {i} is on {t.device} (expected {why})")
        if t.dtype not in _DTYPES:
            raise CollectiveArgumentError(
                f"{where}: tensor {i} has dtype {t.dtype} (expected one of "
                f"{sorted(str(d).removeprefix('torch.') for d in _DTYPES)})"
            )


def _numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    dt, carrier = _DTYPES[t.dtype]
    if carrier is None:
        return t.detach().numpy()
    return t.detach().view(carrier).numpy().view(dt)


class Staged:
    """What a collective reads or writes for tensor ``t`` (:func:`as_array`): ``t``'s own
    memory when it is contiguous, else a contiguous copy (``writeback()`` stores it into
    ``t``)."""

    __slots__ = ("array", "copy", "tensor")

    def __init__(self, t: torch.Tensor, *, read: bool = True) -> None:
        self.tensor = t
        if t.is_contiguous() and not t.is_conj() and not t.is_neg():
            self.copy: torch.Tensor | None = None
            self.array = as_array(t)
        else:
            if read:
                copy = t.detach().resolve_conj().resolve_neg().contiguous()
                self.copy = copy.clone() if copy.data_ptr() == t.data_ptr() else copy
            else:
                self.copy = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            self.array = as_array(self.copy)

    def writeback(self) -> None:
        if self.copy is not None:
            with torch.no_grad():
                self.tensor.copy_(self.copy)


def as_array(t: torch.Tensor) -> Any:
    """A contiguous tensor as the Communicator takes it, zero-copy: a numpy view of a CPU
    tensor's memory; a CUDA tensor itself (the nvshmem backend reads it through DLPack)."""
    return t.detach() if t.device.type == "cuda" else _numpy(t)


def op_name(where: str, op: Any) -> str:
    """Our name for torch's reduce op (``opts.reduceOp``, a wrapper, or a ``ReduceOp``)."""
    kind = getattr(op, "op", op)
    name = _OPS.get(kind)
    if name is None:
        raise OpError(f"{where}: unsupported reduce op (got {op!r}; expected one of {list(_OPS)})")
    return name


def factor_of(op: Any) -> float | torch.Tensor | None:
    """PREMUL_SUM's factor (a number or a one-element tensor), else None."""
    if getattr(op, "op", op) != dist.ReduceOp.PREMUL_SUM:
        return None
    factor = getattr(op, "factor", None)
    if factor is None:
        raise OpError("PREMUL_SUM: the op carries no factor (make it with _make_nccl_premul_sum)")
    return factor  # type: ignore[no-any-return]
