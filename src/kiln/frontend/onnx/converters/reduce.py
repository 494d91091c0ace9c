"""Converters of ONNX reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, and
the composites ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp.

``axes`` moved from an attribute to an optional input in opset 13 (ReduceSum) and 18 (the
others), together with ``noop_with_empty_axes``: no axes reduce over everything unless that flag
makes the op an identity (the composites still apply their elementwise parts, as ONNX's
reference does).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Expr

_INPUT_AXES_SINCE = 18  # ReduceSum: 13


def _reduce(ctx: ConvertContext, op: str, x: Expr, axes: tuple[int, ...] | None) -> Expr:
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


def _square(ctx: ConvertContext, x: Expr) -> Expr:
    return ctx.call("multiply", [x, x])


def _log_sum_exp(ctx: ConvertContext, x: Expr, axes: tuple[int, ...] | None) -> Expr:
    """log(sum(exp(x - m))) + m with m the max over the axes (no overflow for large x)."""
    if x.checked_type.dtype not in ("float32", "float64") or x.checked_type.size == 0:
        return ctx.call("log", [_reduce(ctx, "sum", ctx.call("exp", [x]), axes)])
    keep = _reduce_keepdims(ctx, "max", x, axes)
    total = _reduce(ctx, "sum", ctx.call("exp", [ctx.call("subtract", [x, keep])]), axes)
    shift = keep if bool(ctx.attr("keepdims", 1)) else ctx.reshape(keep, total.checked_type.shape)
    return ctx.call("add", [ctx.call("log", [total]), shift])


def _reduce_keepdims(ctx: ConvertContext, op: str, x: Expr, axes: tuple[int, ...] | None) -> Expr:
    ndim = x.checked_type.ndim
    norm = tuple(sorted(a % ndim for a in axes)) if axes else tuple(range(ndim))
    return ctx.call(op, [x], axis=norm, keepdims=True)


# ONNX name → (how to build it from the input and the axes, opset where axes became an input)
_REDUCE: dict[str, tuple[Callable[[ConvertContext, Expr, tuple[int, ...] | None], Expr], int]] = {
    "ReduceSum": (lambda ctx, x, a: _reduce(ctx, "sum", x, a), 13),
    "ReduceMean": (lambda ctx, x, a: _reduce(ctx, "mean", x, a), 18),
    "ReduceMax": (lambda ctx, x, a: _reduce(ctx, "max", x, a), 18),
    "ReduceMin": (lambda ctx, x, a: _reduce(ctx, "min", x, a), 18),
    "ReduceProd": (lambda ctx, x, a: _reduce(ctx, "prod", x, a), 18),
    "ReduceSumSquare": (lambda ctx, x, a: _reduce(ctx, "sum", _square(ctx, x), a), 18),
    "ReduceL1": (lambda ctx, x, a: _reduce(ctx, "sum", ctx.call("abs", [x]), a), 18),
    "ReduceL2": (lambda ctx, x, a: _sqrt(ctx, _reduce(ctx, "sum", _square(ctx, x), a)), 18),
    "ReduceLogSum": (lambda ctx, x, a: ctx.call("log", [_reduce(ctx, "sum", x, a)]), 18),
    "ReduceLogSumExp": (_log_sum_exp, 18),
}


def _sqrt(ctx: ConvertContext, x: Expr) -> Expr:
    dtype = x.checked_type.dtype
    if dtype in ("float32", "float64"):
        return ctx.call("sqrt", [x])
    # Integer L2 norms: sqrt in double, truncated back (ONNX's reference casts the same way).
    root = ctx.call("sqrt", [ctx.call("cast", [x], dtype="float64")])
    return ctx.call("cast", [root], dtype=dtype)


def _register(onnx_name: str, build, input_since: int) -> None:
    @onnx_op(onnx_name, since=1)
    def attr_axes(ctx: ConvertContext) -> Expr:
        return build(ctx, ctx.input(0), ctx.ints("axes"))

    @onnx_op(onnx_name, since=input_since)
    def input_axes(ctx: ConvertContext) -> Expr:
        axes = None if ctx.optional_input(1) is None else ctx.const_ints(1, f"{onnx_name} axes")
        return build(ctx, ctx.input(0), axes)


for _name, (_build, _since) in _REDUCE.items():
    _register(_name, _build, _since)
