"""Image computes: ``image.resize2d`` (nearest and linear), with the coordinate formulas of
:mod:`kiln.ir.ops.image` evaluated per output pixel in float32."""

from __future__ import annotations

from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.op_registry import register_compute
from kiln.ir.ops.image import linear_taps, nearest_index, source_coordinate


def _clamp(v: L.PrimExpr, lo, hi) -> L.PrimExpr:
    return L.minimum(L.maximum(v, L.const(lo, v.dtype)), L.const(hi, v.dtype))


def _taps(pos: L.PrimExpr, attrs: dict, axis: int, in_size: int):
    """(i0, i1, weight of i1) along one axis for output index ``pos``."""
    scale = attrs["scale"][axis]
    coord = source_coordinate(L.Cast("float32", pos), attrs["coordinate_transformation_mode"],
                              scale, in_size, attrs["size"][axis],
                              lambda v, dtype: L.Cast(dtype, v))
    if attrs["method"] == "nearest_neighbor":
        rounded = nearest_index(coord, attrs["rounding_method"], scale,
                                lambda v: L.call("floor", v), lambda v: L.call("ceil", v))
        i0 = _clamp(L.Cast(L.INT, rounded), 0, in_size - 1)
        return i0, i0, None
    return linear_taps(coord, in_size, _clamp, lambda v: L.Cast(L.INT, v),
                       lambda v: L.Cast("float32", v))


@register_compute("image.resize2d")
def resize2d(inputs, attrs, out_type):
    (data,) = inputs
    h, w = data.shape[2:]
    dtype = data.dtype

    def body(n, c, y, x):
        y0, y1, wy = _taps(y, attrs, 0, h)
        x0, x1, wx = _taps(x, attrs, 1, w)
        if wy is None:
            return data[n, c, y0, x0]
        if dtype != "float32":
            wy, wx = L.Cast(dtype, wy), L.Cast(dtype, wx)
        one = L.const(1, dtype)
        top = data[n, c, y0, x0] * (one - wx) + data[n, c, y0, x1] * wx
        bottom = data[n, c, y1, x0] * (one - wx) + data[n, c, y1, x1] * wx
        return top * (one - wy) + bottom * wy

    return te.compute(out_type.shape, body, name="resize2d", tag="injective")
