"""Shape dims inside compute bodies: a static dim is a constant, a symbolic one (kiln.arith)
its loop-IR expression over the shape variables that MakePackedAPI binds."""

from __future__ import annotations

from kiln import arith
from kiln.tir import te
from kiln.tir import loop as L


def dim_value(dim: arith.Dim | float, dtype: str) -> L.PrimExpr:
    """``dim`` as a value of ``dtype``: a constant when static (any Python number), else its
    index expression cast to ``dtype`` (e.g. the float divisor of a mean over a symbolic
    axis)."""
    if not isinstance(dim, arith.SymExpr):
        return L.const(dim, dtype)
    expr = te.dim_expr(dim)
    return expr if expr.dtype == dtype else L.Cast(dtype, expr)
