"""Converters of ONNX comparison and logical ops: Equal, Less, LessOrEqual, Greater,
GreaterOrEqual, And, Or, Xor, Not, IsNaN, IsInf (all produce bool tensors); and the bitwise
ones: BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot, BitShift."""

from __future__ import annotations

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.converters.elementwise import binary_converter
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr

_BINARY = {
    "Equal": ("equal", 7),
    "Less": ("less", 7),
    "Greater": ("greater", 7),
    "LessOrEqual": ("less_equal", 12),
    "GreaterOrEqual": ("greater_equal", 12),
    "And": ("logical_and", 7),
    "Or": ("logical_or", 7),
    "Xor": ("logical_xor", 7),
}


for _onnx, (_op, _since) in _BINARY.items():
    onnx_op(_onnx, since=_since)(binary_converter(_op))


@onnx_op("Not", since=1)
def logical_not(ctx: ConvertContext) -> Expr:
    return ctx.call("logical_not", [ctx.input(0)])


@onnx_op("IsNaN", since=9)
def isnan(ctx: ConvertContext) -> Expr:
    return ctx.call("isnan", [ctx.input(0)])


@onnx_op("IsInf", since=10)
def isinf(ctx: ConvertContext) -> Expr:
    return ctx.call("isinf", [ctx.input(0)],
                    detect_positive=bool(ctx.attr("detect_positive", 1)),
                    detect_negative=bool(ctx.attr("detect_negative", 1)))


for _onnx, _op in (("BitwiseAnd", "bitwise_and"), ("BitwiseOr", "bitwise_or"),
                   ("BitwiseXor", "bitwise_xor")):
    onnx_op(_onnx, since=18)(binary_converter(_op))


@onnx_op("BitwiseNot", since=18)
def bitwise_not(ctx: ConvertContext) -> Expr:
    return ctx.call("bitwise_not", [ctx.input(0)])


@onnx_op("BitShift", since=11)
def bit_shift(ctx: ConvertContext) -> Expr:
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.unsupported(f"direction={direction!r}")
    op = "left_shift" if direction == "LEFT" else "right_shift"
    return ctx.call(op, [ctx.input(0), ctx.input(1)])
