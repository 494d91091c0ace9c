"""Broadcast indexing shared by every broadcasting compute (numpy / ONNX multidirectional rules)."""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te


def broadcast_load(t: te.Tensor, out_idx: tuple[L.PrimExpr, ...]) -> L.PrimExpr:
    """Read ``t`` at the output index ``out_idx``, aligning dimensions right; size-1 dims read 0."""
    offset = len(out_idx) - len(t.shape)
    idx = [L.IntImm(0) if extent == 1 else out_idx[offset + k] for k, extent in enumerate(t.shape)]
    return t[tuple(idx)]
