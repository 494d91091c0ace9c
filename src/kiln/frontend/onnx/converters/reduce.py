"""Converters of ONNX reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin.

``axes`` moved from an attribute to an optional input in opset 13 (ReduceSum) and 18 (the
others), together with ``noop_with_empty_axes``: no axes reduce over everything unless that flag
makes the op an identity.
"""

from __future__ import annotations

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Expr

_REDUCE = {"ReduceSum": ("sum", 13), "ReduceMean": ("mean", 18), "ReduceMax": ("max", 18),
           "ReduceMin": ("min", 18)}


def _reduce(ctx: ConvertContext, op: str, axes: tuple[int, ...] | None) -> Expr:
    x = ctx.input(0)
    ndim = x.checked_type.ndim
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return x
        axes = tuple(range(ndim))
    norm = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ctx.unsupported(f"axis {a} out of range for rank {ndim}")
        norm.append(a % ndim)
    if len(set(norm)) != len(norm):
        raise ctx.unsupported(f"repeated axes {axes}")
    return ctx.call(op, [x], axis=tuple(sorted(norm)), keepdims=bool(ctx.attr("keepdims", 1)))


def _register(onnx_name: str, op: str, input_since: int) -> None:
    @onnx_op(onnx_name, since=1)
    def attr_axes(ctx: ConvertContext) -> Expr:
        return _reduce(ctx, op, ctx.ints("axes"))

    @onnx_op(onnx_name, since=input_since)
    def input_axes(ctx: ConvertContext) -> Expr:
        axes = None if ctx.optional_input(1) is None else ctx.const_ints(1, f"{onnx_name} axes")
        return _reduce(ctx, op, axes)


for _name, (_op, _since) in _REDUCE.items():
    _register(_name, _op, _since)
