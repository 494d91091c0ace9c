"""Converters of ONNX normalizations and Lp pooling written with reductions and elementwise
ops: LpNormalization, InstanceNormalization, BatchNormalization in training mode, LpPool and
GlobalLpPool (formulas: the ONNX operator specs)."""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.converters.nn import _as_2d, _window_nd
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Constant, Expr
from kiln.relay.op.common import FLOAT_DTYPES


def _float(ctx: ConvertContext, x: Expr) -> str:
    dtype = x.checked_type.dtype
    if dtype not in FLOAT_DTYPES:
        raise ctx.unsupported(f"element type {dtype}")
    return dtype


def _lp_sum(ctx: ConvertContext, x: Expr, p: int) -> Expr:
    """|x|^p elementwise."""
    if p == 1:
        return ctx.call("abs", [x])
    if p == 2:
        return ctx.call("multiply", [x, x])
    if p < 1:
        raise ctx.unsupported(f"p={p}")
    return ctx.call("power", [ctx.call("abs", [x]), ctx.scalar(p, x.checked_type.dtype)])


def _lp_root(ctx: ConvertContext, total: Expr, p: int) -> Expr:
    if p == 1:
        return total
    if p == 2:
        return ctx.call("sqrt", [total])
    return ctx.call("power", [total, ctx.scalar(1.0 / p, total.checked_type.dtype)])


@onnx_op("LpNormalization", since=1)
def lp_normalization(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    _float(ctx, x)
    ndim = x.checked_type.ndim
    axis = ctx.axis(int(ctx.attr("axis", -1)), ndim)
    p = int(ctx.attr("p", 2))
    total = ctx.call("sum", [_lp_sum(ctx, x, p)], axis=(axis,), keepdims=True)
    norm = _lp_root(ctx, total, p)
    # A zero norm means a zero vector: divide by 1 so it stays 0 (ONNX's reference), not NaN.
    dtype = x.checked_type.dtype
    zero = ctx.call("equal", [norm, ctx.scalar(0, dtype)])
    safe = ctx.call("where", [zero, ctx.scalar(1, dtype), norm])
    return ctx.call("divide", [x, safe])


def _moments(ctx: ConvertContext, x: Expr, axes: tuple[int, ...]) -> tuple[Expr, Expr]:
    """Mean and population variance over ``axes`` (kept as size-1 axes)."""
    mean = ctx.call("mean", [x], axis=axes, keepdims=True)
    centered = ctx.call("subtract", [x, mean])
    var = ctx.call("mean", [ctx.call("multiply", [centered, centered])], axis=axes,
                   keepdims=True)
    return mean, var


def _per_channel(ctx: ConvertContext, v: Expr, ndim: int) -> Expr:
    return ctx.reshape(v, v.checked_type.shape + (1,) * (ndim - 2))


def _normalize(ctx: ConvertContext, x: Expr, mean: Expr, var: Expr, scale: Expr, bias: Expr,
               eps: float) -> Expr:
    dtype = x.checked_type.dtype
    ndim = x.checked_type.ndim
    std = ctx.call("sqrt", [ctx.call("add", [var, ctx.scalar(eps, dtype)])])
    y = ctx.call("divide", [ctx.call("subtract", [x, mean]), std])
    y = ctx.call("multiply", [y, _per_channel(ctx, scale, ndim)])
    return ctx.call("add", [y, _per_channel(ctx, bias, ndim)])


@onnx_op("InstanceNormalization", since=6)
def instance_norm(ctx: ConvertContext) -> Expr:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    _float(ctx, x)
    ndim = x.checked_type.ndim
    mean, var = _moments(ctx, x, tuple(range(2, ndim)))
    return _normalize(ctx, x, mean, var, scale, bias, float(ctx.attr("epsilon", 1e-5)))


def batch_norm_training(ctx: ConvertContext) -> list[Expr]:
    """BatchNormalization-15 with training_mode=1: batch statistics over all axes but the
    channel; outputs Y, running_mean, running_var (momentum-averaged)."""
    x, scale, bias, in_mean, in_var = (ctx.input(k) for k in range(5))
    dtype = _float(ctx, x)
    ndim = x.checked_type.ndim
    axes = (0,) + tuple(range(2, ndim))
    mean, var = _moments(ctx, x, axes)
    y = _normalize(ctx, x, mean, var, scale, bias, float(ctx.attr("epsilon", 1e-5)))
    momentum = float(ctx.attr("momentum", 0.9))
    channels = in_mean.checked_type.shape

    def running(old: Expr, batch: Expr) -> Expr:
        kept = ctx.call("multiply", [old, ctx.scalar(momentum, dtype)])
        new = ctx.call("multiply", [ctx.reshape(batch, channels),
                                    ctx.scalar(1.0 - momentum, dtype)])
        return ctx.call("add", [kept, new])

    return [y, running(in_mean, mean), running(in_var, var)]


@onnx_op("LpPool", since=2)
def lp_pool(ctx: ConvertContext) -> Expr:
    """(sum over the window of |x|^p)^(1/p): a depthwise convolution with a kernel of ones
    (padding adds zeros, dilations and strides as Conv)."""
    x = ctx.input(0)
    dtype = _float(ctx, x)
    shape = x.checked_type.shape
    nsp = len(shape) - 2
    if nsp not in (1, 2):
        raise ctx.unsupported(f"{nsp}-D spatial inputs are not supported")
    if ctx.attr("ceil_mode", 0):
        raise ctx.unsupported("ceil_mode=1")
    kernel = ctx.ints("kernel_shape")
    if kernel is None:
        raise ctx.unsupported("missing required attribute 'kernel_shape'")
    attrs, kernel2 = _as_2d(_window_nd(ctx, kernel, shape[2:]))
    p = int(ctx.attr("p", 2))
    x2 = ctx.reshape(x, shape[:2] + (1,) * (2 - nsp) + shape[2:])
    channels = shape[1]
    ones = Constant(np.ones((channels, 1) + tuple(kernel2), dtype=dtype))
    total = ctx.call("nn.conv2d", [_lp_sum(ctx, x2, p), ones], groups=channels, **attrs)
    out = _lp_root(ctx, total, p)
    oshape = out.checked_type.shape
    return ctx.reshape(out, oshape[:2] + oshape[4 - nsp:])


@onnx_op("GlobalLpPool", since=2)
def global_lp_pool(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    _float(ctx, x)
    p = int(ctx.attr("p", 2))
    axes = tuple(range(2, x.checked_type.ndim))
    return _lp_root(ctx, ctx.call("sum", [_lp_sum(ctx, x, p)], axis=axes, keepdims=True), p)
