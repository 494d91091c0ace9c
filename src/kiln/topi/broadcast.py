"""Broadcast indexing shared by every broadcasting compute (numpy / ONNX multidirectional rules)."""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te


def broadcast_load(t: te.Tensor, out_idx: tuple[L.PrimExpr, ...]) -> L.PrimExpr:
    """Read ``t`` at the output index ``out_idx``, aligning dimensions right; size-1 dims read 0.

    The numpy / ONNX multidirectional broadcasting rule
    (https://github.com/onnx/onnx/blob/main/docs/Broadcasting.md): ``t`` of rank ``r`` is read
    at the last ``r`` output coordinates, index 0 along each of its static size-1 dimensions.

    Parameters
    ----------
    t : te.Tensor
        Any rank up to ``len(out_idx)``, each dimension 1 or the output's.
    out_idx : tuple of PrimExpr
        One coordinate per output dimension.

    Returns
    -------
    PrimExpr
        The load ``t[idx]``, of ``t``'s dtype.
    """
    offset = len(out_idx) - len(t.shape)
    idx = [L.IntImm(0) if extent == 1 else out_idx[offset + k] for k, extent in enumerate(t.shape)]
    return t[tuple(idx)]
