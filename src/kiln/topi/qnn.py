"""Quantization computes: ``qnn.quantize`` and ``qnn.dequantize`` (ONNX QuantizeLinear /
DequantizeLinear; the formulas are on :mod:`kiln.relay.op.qnn`).

Quantize saturates in the float domain before the conversion (a float-to-integer conversion of
an out-of-range value is undefined in C and poison in LLVM), then converts an exact integer
value. Rounding is the ``nearbyint`` intrinsic: round half to even under the default
floating-point environment.
"""

from __future__ import annotations

import numpy as np

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.registry import register_compute


def _param(t: te.Tensor, index: tuple, attrs: dict) -> L.PrimExpr:
    """A per-tensor (rank 0), per-axis (1-D) or per-block scale or zero point at output
    ``index``."""
    axis, block = attrs["axis"], attrs["block_size"]
    if block:
        return t[index[:axis] + (index[axis] // block,) + index[axis + 1:]]
    return t[()] if not t.shape else t[index[axis]]


def _as(dtype: str, v: L.PrimExpr) -> L.PrimExpr:
    return v if v.dtype == dtype else L.Cast(dtype, v)


@register_compute("qnn.quantize")
def quantize(inputs, attrs, out_type):
    """ONNX QuantizeLinear: ``saturate(nearbyint(x / scale) + zero_point)`` of the output dtype.

    https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html; the division is a float division
    and the zero point is added in x's dtype, then clamped to the output range and converted
    (module docstring). ``unit_scale`` skips the division.

    Parameters
    ----------
    x : te.Tensor
        Any shape, float.
    scale : te.Tensor
        x's dtype: rank 0 (per tensor), 1-D ``[x.shape[axis]]`` (per axis), or x's shape with
        ``ceil(x.shape[axis] / block_size)`` along ``axis`` (blocked).
    zero_point : te.Tensor
        scale's shape, the output dtype (int8, uint8, int16 or uint16).
    axis, block_size : int
        attrs: the quantized axis (normalized); the block length along it (0: not blocked).
    unit_scale : bool, optional
        attrs: the scale is 1 (a requantizing epilogue whose multiplier is already applied).

    Returns
    -------
    te.Tensor
        x's shape, ``out_type.dtype``; tag ``elemwise``.
    """
    x, scale, zero_point = inputs
    out = out_type.dtype
    info = np.iinfo(out)

    def body(*i):
        # unit_scale: the scale is 1 (a requantizing epilogue's, its multiplier already
        # applied): no division (a vdivps per 8 values, as slow as the rest of the epilogue)
        value = x[i] if attrs.get("unit_scale") else x[i] / _param(scale, i, attrs)
        q = L.call("nearbyint", value) \
            + _as(x.dtype, _param(zero_point, i, attrs))
        q = L.minimum(L.maximum(q, L.const(info.min, x.dtype)), L.const(info.max, x.dtype))
        return L.Cast(out, q)

    return te.compute(x.shape, body, name="quantize", tag="elemwise")


@register_compute("qnn.dequantize")
def dequantize(inputs, attrs, out_type):
    """ONNX DequantizeLinear: ``float(int32(x) - int32(zero_point)) · scale``, in scale's dtype.

    Parameters
    ----------
    x : te.Tensor
        Any shape, int8, uint8, int16, uint16 or int32.
    scale : te.Tensor
        Float; shaped as :func:`quantize`'s.
    zero_point : te.Tensor
        scale's shape, x's dtype.
    axis, block_size : int
        attrs, as :func:`quantize`'s.

    Returns
    -------
    te.Tensor
        x's shape, scale's dtype; tag ``elemwise``.
    """
    x, scale, zero_point = inputs

    def body(*i):
        diff = _as("int32", x[i]) - _as("int32", _param(zero_point, i, attrs))
        return _as(scale.dtype, diff) * _param(scale, i, attrs)

    return te.compute(x.shape, body, name="dequantize", tag="elemwise")
