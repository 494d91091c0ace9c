"""Converters of ONNX activations and unary math written with elementwise graph ops: Elu, Selu,
Celu, ThresholdedRelu, Shrink, PRelu, Softplus, Softsign, Mish, Swish, Reciprocal, Sign, Mod,
and the trigonometric and hyperbolic functions (Round and Gelu: elementwise.py).

Formulas are the ONNX operator specs' (onnx/defs/math/defs.cc); FuseOps makes each composite
one kernel.
"""

from __future__ import annotations

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr
from kiln.relay.op.common import FLOAT_DTYPES

_UNARY = {
    "Sin": ("sin", 7), "Cos": ("cos", 7), "Tan": ("tan", 7), "Asin": ("asin", 7),
    "Acos": ("acos", 7), "Atan": ("atan", 7), "Sinh": ("sinh", 9), "Cosh": ("cosh", 9),
    "Asinh": ("asinh", 9), "Acosh": ("acosh", 9), "Atanh": ("atanh", 9),
    "Sign": ("sign", 9),
}


def _unary(op: str):
    def convert(ctx: ConvertContext) -> Expr:
        return ctx.call(op, [ctx.input(0)])

    return convert


for _onnx, (_op, _since) in _UNARY.items():
    onnx_op(_onnx, since=_since)(_unary(_op))


class _Builder:
    """Elementwise arithmetic on Exprs of one dtype, for writing formulas compactly."""

    def __init__(self, ctx: ConvertContext, dtype: str):
        self.ctx, self.dtype = ctx, dtype

    def c(self, value: float) -> Expr:
        return self.ctx.scalar(value, self.dtype)

    def op(self, name: str, *args: Expr | float) -> Expr:
        return self.ctx.call(name, [self.c(a) if isinstance(a, (int, float)) else a
                                    for a in args])


def _float_input(ctx: ConvertContext) -> tuple[Expr, _Builder]:
    x = ctx.input(0)
    if x.checked_type.dtype not in FLOAT_DTYPES:
        raise ctx.unsupported(f"element type {x.checked_type.dtype}")
    return x, _Builder(ctx, x.checked_type.dtype)


def _expm1_scaled(b: _Builder, x: Expr, alpha: float) -> Expr:
    """alpha * (exp(x) - 1)."""
    return b.op("multiply", b.op("subtract", b.op("exp", x), 1.0), alpha)


@onnx_op("Elu", since=6)
def elu(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    return b.op("where", b.op("less", x, 0.0), _expm1_scaled(b, x, alpha), x)


@onnx_op("Selu", since=6)
def selu(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.6732632423543772848170429916717))
    gamma = float(ctx.attr("gamma", 1.0507009873554804934193349852946))
    inner = b.op("where", b.op("less_equal", x, 0.0), _expm1_scaled(b, x, alpha), x)
    return b.op("multiply", inner, gamma)


@onnx_op("Celu", since=12)
def celu(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    neg = _expm1_scaled(b, b.op("divide", x, alpha), alpha)
    return b.op("add", b.op("maximum", x, 0.0), b.op("minimum", neg, 0.0))


@onnx_op("ThresholdedRelu", since=10)
def thresholded_relu(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    return b.op("where", b.op("greater", x, alpha), x, 0.0)


@onnx_op("Shrink", since=9)
def shrink(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    dtype = x.checked_type.dtype
    b = _Builder(ctx, dtype)
    lambd, bias = float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0))
    if dtype not in FLOAT_DTYPES:
        lambd_c, bias_c = b.c(int(lambd)), b.c(int(bias))
    else:
        lambd_c, bias_c = b.c(lambd), b.c(bias)
    neg_lambd = b.c(-lambd) if dtype in FLOAT_DTYPES else b.c(-int(lambd))
    upper = b.op("where", b.op("greater", x, lambd_c), b.op("subtract", x, bias_c), 0.0)
    return b.op("where", b.op("less", x, neg_lambd), b.op("add", x, bias_c), upper)


@onnx_op("PRelu", since=7)
def prelu(ctx: ConvertContext) -> Expr:
    x, slope = ctx.input(0), ctx.input(1)
    b = _Builder(ctx, x.checked_type.dtype)
    return b.op("where", b.op("less", x, 0.0), b.op("multiply", x, slope), x)


@onnx_op("Softplus", since=1)
def softplus(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    return b.op("log", b.op("add", b.op("exp", x), 1.0))


@onnx_op("Softsign", since=1)
def softsign(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    return b.op("divide", x, b.op("add", b.op("abs", x), 1.0))


@onnx_op("Mish", since=18)
def mish(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    return b.op("multiply", x, b.op("tanh", softplus(ctx)))


@onnx_op("Swish", since=24)
def swish(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    scaled = x if alpha == 1.0 else b.op("multiply", x, alpha)
    return b.op("multiply", x, b.op("sigmoid", scaled))


@onnx_op("Reciprocal", since=6)
def reciprocal(ctx: ConvertContext) -> Expr:
    x, b = _float_input(ctx)
    return b.op("divide", 1.0, x)


@onnx_op("Mod", since=10)
def mod(ctx: ConvertContext) -> Expr:
    """fmod=1: the remainder with the dividend's sign (C's fmod); fmod=0: with the divisor's
    (Python's %; the spec asks fmod=1 for floats, but ONNX's reference and tests accept 0)."""
    a, b = ctx.input(0), ctx.input(1)
    fmod = bool(ctx.attr("fmod", 0))
    return ctx.call("mod" if fmod else "floor_mod", [a, b])
