"""When the explicit vectors of a ``vectorized`` loop (:mod:`kiln.codegen.llvm.vector`) may widen
loads narrower than their lanes (float16 scales, int8 weights, each cast to float32 lanes)."""

from __future__ import annotations

from kiln.tir import loop as L


def widens(stores: list[L.BufferStore]) -> bool:
    """Whether a vectorized loop may widen narrow loads: no store reads its own buffer (the
    quantized dense's dequantized panel does, docs/decisions/053; the one-row quantized GEMVs'
    accumulations keep LLVM's vectorizer, faster there: int8 576x1536, 117 vs 122 us)."""
    return not any(_reads(st.value, st.buffer) for st in stores)


def _reads(e: L.PrimExpr, buf: L.Buffer) -> bool:
    return any(isinstance(x, L.BufferLoad) and x.buffer is buf for x in L.walk_exprs(e))
