"""Image computes: ``image.resize2d`` (nearest, linear, cubic), with the tap formulas of
:mod:`kiln.relay.op.image` (:func:`~kiln.topi.resize_taps.axis_taps`) evaluated per output pixel in
float32."""

from __future__ import annotations

import dataclasses

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.dims import dim_value
from kiln.topi.registry import register_compute
from kiln.topi.resize_taps import Arith, axis_taps


def _clamp(v: L.PrimExpr, lo, hi) -> L.PrimExpr:
    return L.minimum(L.maximum(v, dim_value(lo, v.dtype)), dim_value(hi, v.dtype))


def _select(cond: L.PrimExpr, a, b) -> L.PrimExpr:
    return L.Select(cond, a, L.const(b, a.dtype) if not isinstance(b, L.PrimExpr) else b)


def _within(v: L.PrimExpr, lo, hi) -> L.PrimExpr:
    return L.logical_and(v >= dim_value(lo, v.dtype), v <= dim_value(hi, v.dtype))


LOOP_ARITH = Arith(lambda v: L.call("floor", v), lambda v: L.call("ceil", v),
                   lambda v: L.call("fabs", v), _clamp,
                   lambda v: L.Cast(L.INT, v), lambda v, dtype: L.Cast(dtype, v),
                   _within, _select, dim_value, L.eq)


def _axis_tables(attrs: dict, axis: int, in_size: int, out_size: int):
    """Per output index of one axis, as small materialized stages (tag ``resize_table``): each
    tap's input index and weight, and the in-crop flag (1.0 / 0.0) in tf_crop_and_resize mode.

    Tables keep the per-pixel body to loads and multiply-adds: the coordinate arithmetic runs
    once per row and column. The tap formulas are built once over a probe index; the weights a
    normalization divides by their sum are tables of their own (``Arith.stage``), so each table
    is a small expression whatever the number of taps."""
    name = "hw"[axis]
    probe = L.Var(f"resize_{name}")

    def table(value: L.PrimExpr, what: str) -> te.Tensor:
        return te.compute((out_size,), lambda i: L.substitute(value, {probe: i}),
                          name=f"resize_{name}{what}", tag="resize_table")

    def stage(values: list[L.PrimExpr]) -> list[L.PrimExpr]:
        return [table(v, f"{k}_term")[probe] for k, v in enumerate(values)]

    arith = dataclasses.replace(LOOP_ARITH, stage=stage)
    taps, has_valid = axis_taps(L.Cast("float32", probe), attrs, axis, in_size, arith)
    tables = [(table(index, f"{k}_index"), None if weight is None else table(weight, f"{k}_weight"))
              for k, (index, weight) in enumerate(taps)]
    valid = None
    if has_valid is not None:
        valid = table(L.Select(has_valid, L.FloatImm(1.0), 0.0), "_valid")
    return tables, valid


@register_compute("image.resize2d")
def resize2d(inputs, attrs, out_type):
    """ONNX Resize of the H and W axes: per output pixel, the sum over taps of ``wy · wx · data``.

    ``out[n, c, y, x] = Σ_{i, j} wy_i[y] · wx_j[x] · data[n, c, iy_i[y], ix_j[x]]``, the tap
    indices and weights per row and per column being small materialized tables (tag
    ``resize_table``, :func:`_axis_tables`) built from :func:`kiln.topi.resize_taps.axis_taps` in
    float32: onnxruntime's semantics (``onnxruntime/core/providers/cpu/tensor/upsamplebase.h``,
    ``upsample.cc``); cubic: Keys 1981. In ``tf_crop_and_resize`` mode a pixel whose source
    coordinate is outside the input is ``extrapolation_value``.

    Parameters
    ----------
    data : te.Tensor
        4-D, [batch, channel, in_height, in_width] (NCHW), float.
    size : tuple of int
        attrs: ``(out_height, out_width)``.
    scale : tuple of float
        attrs: ``(scale_h, scale_w)``, the float32 scales of the coordinate transform.
    method, coordinate_transformation_mode, rounding_method : str
        attrs: ``nearest_neighbor`` / ``linear`` / ``cubic``; ONNX Resize's modes
        (:mod:`kiln.relay.op.image`); nearest's rounding.
    cubic_alpha, exclude_outside, antialias, roi, extrapolation_value
        attrs: Keys' ``A``; zero weight outside the input; a filter widened by ``1 / scale``
        when downsampling; the normalized crop ``(h0, w0, h1, w1)`` and the value outside it
        (tf_crop_and_resize).

    Returns
    -------
    te.Tensor
        4-D, [batch, channel, out_height, out_width] (``out_type.shape``), data's dtype; tag
        ``injective``.
    """
    (data,) = inputs
    h, w = data.shape[2:]
    oh, ow = out_type.shape[2:]
    dtype = data.dtype
    rows, valid_y = _axis_tables(attrs, 0, h, oh)
    cols, valid_x = _axis_tables(attrs, 1, w, ow)

    def body(n, c, y, x):
        total = None
        for iy, wy in rows:
            for ix, wx in cols:
                term = data[n, c, iy[y], ix[x]]
                if wy is not None:
                    both = wy[y] * wx[x]
                    term = term * (both if dtype == "float32" else L.Cast(dtype, both))
                total = term if total is None else total + term
        valid = [v[i] for v, i in ((valid_y, y), (valid_x, x)) if v is not None]
        if not valid:  # no crop, or neither axis resized
            return total
        inside = (valid[0] if len(valid) == 1 else valid[0] * valid[1]) > 0.5
        return L.Select(inside, total, L.const(attrs["extrapolation_value"], dtype))

    return te.compute(out_type.shape, body, name="resize2d", tag="injective")
