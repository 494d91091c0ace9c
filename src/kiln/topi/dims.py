"""Shape dims inside compute bodies: a static dim is a constant, a symbolic one (kiln.arith)
its loop-IR expression over the shape variables that MakePackedAPI binds."""

from __future__ import annotations

from kiln import arith
from kiln.tir import loop as L
from kiln.tir import te


def dim_value(dim: arith.Dim | float, dtype: str) -> L.PrimExpr:
    """``dim`` as a value of ``dtype``: a constant when static, else its index expression cast.

    Parameters
    ----------
    dim : arith.Dim or float
        A static dim (any Python number) or a symbolic one (a :class:`kiln.arith.SymExpr`
        over the shape variables that MakePackedAPI binds).
    dtype : str
        The value's dtype (e.g. ``"float32"`` for the divisor of a mean over a symbolic
        axis).

    Returns
    -------
    PrimExpr
        ``L.const(dim, dtype)``, or the dim's index expression (int64), cast to ``dtype``
        when it differs.
    """
    if not isinstance(dim, arith.SymExpr):
        return L.const(dim, dtype)
    expr = te.dim_expr(dim)
    return expr if expr.dtype == dtype else L.Cast(dtype, expr)
