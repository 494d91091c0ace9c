"""Converters of ONNX quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger.

Integer convolutions and matrix products run exactly, in int32: both operands are widened to
int32 and their zero points subtracted (``nn.conv2d`` / ``nn.matmul`` over int32; zero-point
subtraction before the convolution makes zero padding equal to padding with the zero point).
QLinearConv and QLinearMatMul then requantize as onnxruntime does (``MlasRequantizeOutput``):
``y = saturate(round_half_even(float(acc) * (x_scale * w_scale / y_scale)) + y_zero_point)``,
the multiplier formed in float32 in that order; here that is ``qnn.quantize`` of
``float(acc) * multiplier`` with scale 1 (dividing by 1 is exact). Weight-only int8 graphs
(Cast → Mul) and QDQ graphs need nothing more: DequantizeLinear of a constant weight folds at
compile time and the float ops between DequantizeLinear and QuantizeLinear run in float
(docs/decisions/011).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.context import ConvertContext, onnx_dtype
from kiln.frontend.onnx.converters.nn import conv2d_call, matmul_call
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Constant, Expr
from kiln.relay.op.qnn import DEQUANT_DTYPES, QUANT_DTYPES


def _params(ctx: ConvertContext, x: Expr, scale: Expr, zero_point: Expr | None,
            zp_dtype: str) -> tuple[Expr, Expr, dict]:
    """(scale, zero point, attrs ``axis`` and ``block_size``) normalized for ``qnn.*``: rank 0
    per tensor (a 1-element vector is a scalar), 1-D per axis, ``x``'s rank per block; an
    omitted zero point is 0 of ``zp_dtype``."""
    if zero_point is None:
        zero_point = Constant(np.zeros(scale.checked_type.shape, zp_dtype))
    block = int(ctx.attr("block_size", 0))
    st, zt = scale.checked_type, zero_point.checked_type
    if st.size == zt.size == 1 and st.ndim <= 1 and zt.ndim <= 1 and not block:
        return ctx.reshape(scale, ()), ctx.reshape(zero_point, ()), {"axis": 0, "block_size": 0}
    if zt.shape != st.shape:
        raise ctx.unsupported(f"scale {st.shape} and zero point {zt.shape} differ in shape")
    ndim = x.checked_type.ndim
    axis = int(ctx.attr("axis", 1))
    if st.ndim != (ndim if block else 1) or not -ndim <= axis < ndim:
        raise ctx.unsupported(f"scale of shape {st.shape} for axis {axis} of "
                              f"{x.checked_type.shape}" + (f", blocks of {block}" if block else ""))
    return scale, zero_point, {"axis": axis % ndim, "block_size": block}


def _quantize(ctx: ConvertContext, x: Expr, scale: Expr, zero_point: Expr | None,
             out_dtype: str = "uint8") -> Expr:
    """``qnn.quantize`` of float ``x``; without a zero point the output is ``out_dtype``."""
    dtype = zero_point.checked_type.dtype if zero_point is not None else out_dtype
    if dtype not in QUANT_DTYPES:
        raise ctx.unsupported(f"quantization to {dtype}")
    scale, zero_point, attrs = _params(ctx, x, scale, zero_point, dtype)
    return ctx.call("qnn.quantize", [x, scale, zero_point], out_dtype=dtype, **attrs)


def _dequantize(ctx: ConvertContext, x: Expr, scale: Expr, zero_point: Expr | None) -> Expr:
    """``qnn.dequantize`` of integer ``x`` (float result of ``scale``'s dtype)."""
    if x.checked_type.dtype not in DEQUANT_DTYPES:
        raise ctx.unsupported(f"dequantization of {x.checked_type.dtype}")
    scale, zero_point, attrs = _params(ctx, x, scale, zero_point, x.checked_type.dtype)
    return ctx.call("qnn.dequantize", [x, scale, zero_point], **attrs)


def _dtype_attr(ctx: ConvertContext, name: str) -> str | None:
    """A TensorProto element-type attribute (``output_dtype``, ``precision``) as a numpy dtype
    name; None when absent or 0."""
    if not ctx.attr(name, 0):
        return None
    try:
        return onnx_dtype(int(ctx.attr(name)), name)
    except UnsupportedOpError as err:
        raise ctx.unsupported(str(err)) from None


def _as(ctx: ConvertContext, x: Expr, dtype: str) -> Expr:
    return x if x.checked_type.dtype == dtype else ctx.call("cast", [x], dtype=dtype)


@onnx_op("QuantizeLinear", since=10)
def quantize_linear(ctx: ConvertContext) -> Expr:
    """The division runs in ``precision`` (opset 23; default: the scale's type, so an input of
    another type, e.g. int32 from opset 19, is converted to it)."""
    if ctx.attr("saturate", 1) != 1:
        raise ctx.unsupported("saturate=0 (float8 outputs)")
    scale = ctx.input(1)
    precision = _dtype_attr(ctx, "precision") or scale.checked_type.dtype
    x, scale = _as(ctx, ctx.input(0), precision), _as(ctx, scale, precision)
    out_dtype = _dtype_attr(ctx, "output_dtype") or "uint8"  # without a zero point (opset 21)
    return _quantize(ctx, x, scale, ctx.optional_input(2), out_dtype)


@onnx_op("DequantizeLinear", since=10)
def dequantize_linear(ctx: ConvertContext) -> Expr:
    """The result has the scale's type, or ``output_dtype`` (opset 23)."""
    y = _dequantize(ctx, ctx.input(0), ctx.input(1), ctx.optional_input(2))
    return _as(ctx, y, _dtype_attr(ctx, "output_dtype") or y.checked_type.dtype)


@onnx_op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: ConvertContext) -> list[Expr]:
    """uint8 quantization with a scale and zero point from the input's range (extended to 0):
    ``scale = (max(x, 0) - min(x, 0)) / 255`` (1 when that is 0, as onnxruntime),
    ``zero_point = saturate(round(0 - min(x, 0) / scale))``, ``y = QuantizeLinear(x)``."""
    x = ctx.input(0)
    if x.checked_type.dtype != "float32":
        raise ctx.unsupported(f"input of dtype {x.checked_type.dtype}")
    every = tuple(range(x.checked_type.ndim))
    zero = ctx.scalar(0.0, "float32")
    lo = ctx.call("minimum", [ctx.call("min", [x], axis=every, keepdims=False), zero])
    hi = ctx.call("maximum", [ctx.call("max", [x], axis=every, keepdims=False), zero])
    spread = ctx.call("divide", [ctx.call("subtract", [hi, lo]), ctx.scalar(255.0, "float32")])
    nonzero = ctx.call("cast", [spread], dtype="bool")
    scale = ctx.call("where", [nonzero, spread, ctx.scalar(1.0, "float32")])
    initial = ctx.call("subtract", [zero, ctx.call("divide", [lo, scale])])
    zp = ctx.call("cast", [ctx.call("round", [ctx.call("clip", [initial], a_min=0.0,
                                                         a_max=255.0)])], dtype="uint8")
    return [_quantize(ctx, x, scale, zp), scale, zp]


def _int32(ctx: ConvertContext, x: Expr, zero_point: Expr | None, axis: int | None) -> Expr:
    """``int32(x) - int32(zero_point)``, a per-index zero point broadcast along ``axis``."""
    if x.checked_type.dtype not in ("int8", "uint8"):
        raise ctx.unsupported(f"integer operand of dtype {x.checked_type.dtype}")
    wide = ctx.call("cast", [x], dtype="int32")
    if zero_point is None:
        return wide
    if zero_point.checked_type.dtype != x.checked_type.dtype:
        raise ctx.unsupported(f"zero point of dtype {zero_point.checked_type.dtype} for an "
                              f"operand of dtype {x.checked_type.dtype}")
    zp = ctx.call("cast", [zero_point], dtype="int32")
    zt = zp.checked_type
    if zt.size == 1:
        zp = ctx.reshape(zp, ())
    elif axis is not None and zt.ndim == 1:
        ndim = x.checked_type.ndim
        zp = ctx.reshape(zp, (zt.shape[0],) + (1,) * (ndim - axis % ndim - 1))
    else:
        raise ctx.unsupported(f"zero point of shape {zt.shape} for an operand of shape "
                              f"{x.checked_type.shape}")
    return ctx.call("subtract", [wide, zp])


def _requantize(ctx: ConvertContext, acc: Expr, in_scale: Expr, w_scale: Expr, y_scale: Expr,
                y_zero_point: Expr | None, w_axis: int) -> Expr:
    """Quantized output of an int32 accumulator (module doc): per-tensor scales, or a per-index
    ``w_scale`` along ``w_axis`` of the accumulator."""
    ndim = acc.checked_type.ndim
    scales = []
    for s, axis in ((in_scale, None), (w_scale, w_axis), (y_scale, None)):
        if s.checked_type.dtype != "float32":  # float16 scales (opset 21)
            s = ctx.call("cast", [s], dtype="float32")
        if s.checked_type.size == 1:
            scales.append(ctx.reshape(s, ()))
        elif axis is not None and s.checked_type.ndim == 1:
            scales.append(ctx.reshape(s, (s.checked_type.size,) + (1,) * (ndim - axis - 1)))
        else:
            raise ctx.unsupported(f"scale of shape {s.checked_type.shape}")
    multiplier = ctx.call("divide", [ctx.call("multiply", scales[:2]), scales[2]])
    value = ctx.call("multiply", [ctx.call("cast", [acc], dtype="float32"), multiplier])
    return _quantize(ctx, value, ctx.scalar(1.0, "float32"), y_zero_point)


@onnx_op("ConvInteger", since=10)
def conv_integer(ctx: ConvertContext) -> Expr:
    x = _int32(ctx, ctx.input(0), ctx.optional_input(2), None)
    w = _int32(ctx, ctx.input(1), ctx.optional_input(3), 0)
    return conv2d_call(ctx, x, w)


@onnx_op("QLinearConv", since=10)
def qlinear_conv(ctx: ConvertContext) -> Expr:
    x = _int32(ctx, ctx.input(0), ctx.input(2), None)
    w = _int32(ctx, ctx.input(3), ctx.input(5), 0)
    acc = conv2d_call(ctx, x, w)
    bias = ctx.optional_input(8)
    if bias is not None:
        if bias.checked_type.dtype != "int32":
            raise ctx.unsupported(f"bias of dtype {bias.checked_type.dtype}")
        acc = ctx.call("nn.bias_add", [acc, bias], axis=1)
    return _requantize(ctx, acc, ctx.input(1), ctx.input(4), ctx.input(6), ctx.input(7), 1)


@onnx_op("MatMulInteger", since=10)
def matmul_integer(ctx: ConvertContext) -> Expr:
    """Zero points: A's per tensor or per row (axis -2), B's per tensor or per column."""
    a, b = ctx.input(0), ctx.input(1)
    a = _int32(ctx, a, ctx.optional_input(2), a.checked_type.ndim - 2 if a.checked_type.ndim
               >= 2 else None)
    b = _int32(ctx, b, ctx.optional_input(3), b.checked_type.ndim - 1)
    return matmul_call(ctx, a, b)


@onnx_op("QLinearMatMul", since=10)
def qlinear_matmul(ctx: ConvertContext) -> Expr:
    """Scales and zero points of A and Y per tensor; B's per tensor or per column."""
    a, b = ctx.input(0), ctx.input(3)
    acc = matmul_call(ctx, _int32(ctx, a, ctx.input(2), None),
                      _int32(ctx, b, ctx.input(5), b.checked_type.ndim - 1))
    return _requantize(ctx, acc, ctx.input(1), ctx.input(4), ctx.input(6), ctx.input(7),
                       acc.checked_type.ndim - 1)
