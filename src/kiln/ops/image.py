"""Image computes: ``image.resize2d`` (nearest, linear, cubic), with the tap formulas of
:mod:`kiln.ir.ops.image` (:func:`~kiln.ir.ops.image.axis_taps`) evaluated per output pixel in
float32."""

from __future__ import annotations

from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.op_registry import register_compute
from kiln.ir.ops.image import Arith, axis_taps


def _clamp(v: L.PrimExpr, lo, hi) -> L.PrimExpr:
    return L.minimum(L.maximum(v, L.const(lo, v.dtype)), L.const(hi, v.dtype))


def _select(cond: L.PrimExpr, a, b) -> L.PrimExpr:
    return L.Select(cond, a, L.const(b, a.dtype) if not isinstance(b, L.PrimExpr) else b)


LOOP_ARITH = Arith(lambda v: L.call("floor", v), lambda v: L.call("ceil", v), _clamp,
                   lambda v: L.Cast(L.INT, v), lambda v, dtype: L.Cast(dtype, v),
                   lambda v, lo, hi: L.logical_and(v >= lo, v <= hi), _select)


@register_compute("image.resize2d")
def resize2d(inputs, attrs, out_type):
    (data,) = inputs
    h, w = data.shape[2:]
    dtype = data.dtype

    def weight(wy: L.PrimExpr, wx: L.PrimExpr) -> L.PrimExpr:
        both = wy * wx
        return both if dtype == "float32" else L.Cast(dtype, both)

    def body(n, c, y, x):
        rows, valid_y = axis_taps(L.Cast("float32", y), attrs, 0, h, LOOP_ARITH)
        cols, valid_x = axis_taps(L.Cast("float32", x), attrs, 1, w, LOOP_ARITH)
        total = None
        for iy, wy in rows:
            for ix, wx in cols:
                term = data[n, c, iy, ix]
                if wy is not None:
                    term = term * weight(wy, wx)
                total = term if total is None else total + term
        if valid_y is None:
            return total
        outside = L.const(attrs["extrapolation_value"], dtype)
        return L.Select(L.logical_and(valid_y, valid_x), total, outside)

    return te.compute(out_type.shape, body, name="resize2d", tag="injective")
