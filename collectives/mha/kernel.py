"""The host flash-attention tile kernel: one work item (a query tile of one head).

FlashAttention-2 forward (Dao, 2023, Algorithm 1) in the paper's notation, float32
accumulation. For query rows ``Q_i`` (``BLOCK_M`` x d) and key/value tiles ``K_j``, ``V_j``
(``BLOCK_N`` x d)::

    S_ij  = Q_i K_j^T * scale            (+ mask: -inf where a key is not visible)
    m_new = max(m_i, rowmax(S_ij))
    P_ij  = exp(S_ij - m_new)
    l_i   = exp(m_i - m_new) * l_i + rowsum(P_ij)
    acc   = exp(m_i - m_new) * acc + P_ij V_j
    m_i   = m_new
    O_i = acc / l_i,   LSE_i = m_i + log(l_i)

KV tiles that the mask hides completely are skipped (the scheduler's ``kv_start``/``kv_end``
bound them); tiles it hides partly are masked. Rows that see no key at all get ``O = 0`` and
``LSE = -inf``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .scheduler import MaskSpec

__all__ = ["attention_tile", "attention_tile_backward"]

_F32 = np.dtype(np.float32)


def attention_tile(
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    *,
    q_offset: int,
    kv_start: int,
    kv_end: int,
    block_n: int,
    scale: float,
    mask: MaskSpec,
    k_offset: int = 0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Attention of query rows ``q`` (BLOCK_M x d, rows ``q_offset ...`` of the sequence) over
    keys ``[kv_start, kv_end)`` of ``k``/``v`` (n x d, key ``i`` at row ``i - k_offset``).

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Query rows (BLOCK_M x d), keys and values (n x d).
    q_offset : int
        The sequence position of ``q``'s first row (for the mask).
    kv_start, kv_end : int
        The keys to attend to, ``[kv_start, kv_end)`` (the scheduler's bounds).
    block_n : int
        Keys per inner step (``BLOCK_N``).
    scale : float
        The softmax scale.
    mask : MaskSpec
        Causal and sliding-window visibility.
    k_offset : int
        The sequence position of ``k``'s and ``v``'s first row.

    Returns
    -------
    O, LSE : numpy.ndarray
        float32 (BLOCK_M x d) and (BLOCK_M,).
    """
    rows = q.shape[0]
    d_v = v.shape[1]
    q32 = q if q.dtype == _F32 else q.astype(_F32)
    q32 = q32 * np.float32(scale)  # scale once, on the small side
    m_i = np.full(rows, -np.inf, _F32)
    l_i = np.zeros(rows, _F32)
    acc = np.zeros((rows, d_v), _F32)
    tiles = _scored_tiles(q32, k, v, q_offset, kv_start, kv_end, block_n, mask, k_offset)
    for _, _, _, v_j, s_ij in tiles:
        m_new = np.maximum(m_i, s_ij.max(axis=1))
        safe = np.where(np.isneginf(m_new), np.float32(0), m_new)  # rows with nothing yet
        p_ij = np.exp(s_ij - safe[:, None])
        alpha = np.exp(m_i - safe)
        l_i = alpha * l_i + p_ij.sum(axis=1)
        acc *= alpha[:, None]
        acc += p_ij @ v_j
        m_i = m_new
    seen = l_i > 0
    out = np.zeros_like(acc)
    np.divide(acc, l_i[:, None], out=out, where=seen[:, None])
    lse = np.full(rows, -np.inf, _F32)
    lse[seen] = m_i[seen] + np.log(l_i[seen])
    return out, lse


def attention_tile_backward(
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    do: np.ndarray[Any, Any],
    lse: np.ndarray[Any, Any],
    delta: np.ndarray[Any, Any],
    *,
    q_offset: int,
    kv_start: int,
    kv_end: int,
    block_n: int,
    scale: float,
    mask: MaskSpec,
    k_offset: int = 0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Gradients of one query tile over keys ``[kv_start, kv_end)`` (FlashAttention-2
    backward, Algorithm 2, recomputing ``P`` from the forward's ``LSE``)::

        P_ij = exp(S_ij - LSE_i)        dV_j += P_ij^T dO_i
        dP_ij = dO_i V_j^T              dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += dS_ij K_j * scale       dK_j += dS_ij^T Q_i * scale

    ``do`` is dL/dO of these rows, ``lse`` their forward LSE and ``delta`` their
    ``D_i = rowsum(dO_i * O_i)``. Returns float32 ``(dQ, dK, dV)``: dQ for the rows
    (BLOCK_M x d), dK and dV for keys ``[kv_start, kv_end)`` only.

    Parameters
    ----------
    q, k, v : numpy.ndarray
        Query rows (BLOCK_M x d), keys and values (n x d), as in :func:`attention_tile`.
    do, lse, delta : numpy.ndarray
        dL/dO (BLOCK_M x d), the forward's LSE and ``D_i`` of the rows (BLOCK_M,).
    q_offset : int
        The sequence position of ``q``'s first row (for the mask).
    kv_start, kv_end : int
        The keys to attend to, ``[kv_start, kv_end)`` (the scheduler's bounds).
    block_n : int
        Keys per inner step (``BLOCK_N``).
    scale : float
        The softmax scale.
    mask : MaskSpec
        Causal and sliding-window visibility.
    k_offset : int
        The sequence position of ``k``'s and ``v``'s first row.

    Returns
    -------
    dQ, dK, dV : numpy.ndarray
        float32, as above.
    """
    rows = q.shape[0]
    q32 = q if q.dtype == _F32 else q.astype(_F32)
    do32 = do if do.dtype == _F32 else do.astype(_F32)
    sc = np.float32(scale)
    qs = q32 * sc
    lse32 = np.where(np.isneginf(lse), np.float32(np.inf), lse).astype(_F32)  # P = 0 there
    d32 = np.asarray(delta, _F32)
    dq = np.zeros((rows, q.shape[1]), _F32)
    dk = np.zeros((kv_end - kv_start, k.shape[1]), _F32)
    dv = np.zeros((kv_end - kv_start, v.shape[1]), _F32)
    tiles = _scored_tiles(qs, k, v, q_offset, kv_start, kv_end, block_n, mask, k_offset)
    for j0, j1, k_j, v_j, s_ij in tiles:
        p_ij = np.exp(s_ij - lse32[:, None])
        dv[j0 - kv_start : j1 - kv_start] += p_ij.T @ do32
        ds_ij = p_ij * (do32 @ v_j.T - d32[:, None])
        dq += ds_ij @ k_j
        dk[j0 - kv_start : j1 - kv_start] += ds_ij.T @ qs
    dq *= sc
    return dq, dk, dv


def _scored_tiles(
    qs: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    q_offset: int,
    kv_start: int,
    kv_end: int,
    block_n: int,
    mask: MaskSpec,
    k_offset: int,
) -> Iterator[tuple[int, int, Any, Any, Any]]:
    """``(j0, j1, K_j, V_j, S_ij)`` for each KV tile ``[j0, j1)`` of ``[kv_start, kv_end)``:
    K/V as float32, scores ``qs K_j^T`` (``qs`` already scaled) with hidden pairs at -inf.
    Tiles the mask hides completely from every row are skipped."""
    rows = qs.shape[0]
    row_idx = np.arange(q_offset, q_offset + rows)[:, None]
    needs_mask = mask.causal or mask.left is not None or mask.right is not None
    for j0 in range(kv_start, kv_end, block_n):
        j1 = min(j0 + block_n, kv_end)
        k_j = k[j0 - k_offset : j1 - k_offset]
        v_j = v[j0 - k_offset : j1 - k_offset]
        if k_j.dtype != _F32:
            k_j = k_j.astype(_F32)
            v_j = v_j.astype(_F32)
        s_ij = qs @ k_j.T
        if needs_mask:
            cols = np.arange(j0, j1)[None, :]
            hidden = _hidden(row_idx, cols, mask, q_offset, rows, j0, j1)
            if hidden is not None:
                if hidden.all():
                    continue  # the whole tile is hidden from these rows
                s_ij[hidden] = -np.inf
        yield j0, j1, k_j, v_j, s_ij


def _hidden(
    rows: np.ndarray[Any, Any],
    cols: np.ndarray[Any, Any],
    mask: MaskSpec,
    q0: int,
    nrows: int,
    j0: int,
    j1: int,
) -> np.ndarray[Any, Any] | None:
    """Boolean (rows x cols) of hidden pairs, or None when the tile is fully visible."""
    q_last = q0 + nrows - 1
    visible_all = True
    if mask.causal and j1 - 1 > q0:
        visible_all = False
    if mask.left is not None and j0 < q_last - mask.left:
        visible_all = False
    if mask.right is not None and j1 - 1 > q0 + mask.right:
        visible_all = False
    if visible_all:
        return None
    hidden = np.zeros((nrows, j1 - j0), dtype=bool)
    if mask.causal:
        hidden |= cols > rows
    if mask.left is not None:
        hidden |= cols < rows - mask.left
    if mask.right is not None:
        hidden |= cols > rows + mask.right
    return hidden
