"""Converters of ONNX index-driven ops: GatherElements, ScatterElements (and the deprecated
Scatter), GatherND, ScatterND, CumSum, CumProd."""

from __future__ import annotations

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Expr


def _axis(ctx: ConvertContext, ndim: int, default: int = 0) -> int:
    axis = int(ctx.attr("axis", default))
    if not -ndim <= axis < ndim:
        raise ctx.unsupported(f"axis {axis} out of range for rank {ndim}")
    return axis % ndim


@onnx_op("GatherElements", since=11)
def gather_elements(ctx: ConvertContext) -> Expr:
    data, indices = ctx.input(0), ctx.input(1)
    return ctx.call("gather_elements", [data, indices], axis=_axis(ctx, data.checked_type.ndim))


def _reduction(ctx: ConvertContext) -> str:
    reduction = ctx.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ctx.unsupported(f"reduction={reduction!r}")
    return reduction


@onnx_op("Scatter", since=9)
@onnx_op("ScatterElements", since=11)
def scatter_elements(ctx: ConvertContext) -> Expr:
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    return ctx.call("scatter_elements", [data, indices, updates],
                    axis=_axis(ctx, data.checked_type.ndim), reduction=_reduction(ctx))


@onnx_op("GatherND", since=11)
def gather_nd(ctx: ConvertContext) -> Expr:
    return ctx.call("gather_nd", [ctx.input(0), ctx.input(1)],
                    batch_dims=int(ctx.attr("batch_dims", 0)))


@onnx_op("ScatterND", since=11)
def scatter_nd(ctx: ConvertContext) -> Expr:
    return ctx.call("scatter_nd", [ctx.input(0), ctx.input(1), ctx.input(2)],
                    reduction=_reduction(ctx))


def _cumulative(op: str):
    def convert(ctx: ConvertContext) -> Expr:
        x = ctx.input(0)
        (axis,) = ctx.const_ints(1, f"{ctx.node.op_type} axis")
        ndim = x.checked_type.ndim
        if not -ndim <= axis < ndim:
            raise ctx.unsupported(f"axis {axis} out of range for rank {ndim}")
        return ctx.call(op, [x], axis=axis % ndim, exclusive=bool(ctx.attr("exclusive", 0)),
                        reverse=bool(ctx.attr("reverse", 0)))

    return convert


onnx_op("CumSum", since=11)(_cumulative("cumsum"))
onnx_op("CumProd", since=26)(_cumulative("cumprod"))
