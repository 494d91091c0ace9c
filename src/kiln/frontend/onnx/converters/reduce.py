"""Converters of ONNX reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, and
the composites ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp; ArgMax,
ArgMin, and Hardmax (equal(argmax, arange)).

``axes`` moved from an attribute to an optional input in opset 13 (ReduceSum) and 18 (the
others), together with ``noop_with_empty_axes``: no axes reduce over everything unless that flag
makes the op an identity (the composites still apply their elementwise parts, as ONNX's
reference does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kiln import arith
from kiln.frontend.onnx.context import ConvertContext, NotConstantError
from kiln.frontend.onnx.converters import dynamic
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.assume import Assumption, AssumptionNeeded
from kiln.relay.graph import Constant, Expr
from kiln.relay.op.common import FLOAT_DTYPES

_INPUT_AXES_SINCE = 18  # ReduceSum: 13


def _reduce(ctx: ConvertContext, op: str, x: Expr, axes: tuple[int, ...] | None) -> Expr:
    ndim = x.checked_type.ndim
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return x
        axes = tuple(range(ndim))
    return ctx.call(op, [x], axis=ctx.axes(axes, ndim), keepdims=bool(ctx.attr("keepdims", 1)))


def _square(ctx: ConvertContext, x: Expr) -> Expr:
    return ctx.call("multiply", [x, x])


def _log_sum_exp(ctx: ConvertContext, x: Expr, axes: tuple[int, ...] | None) -> Expr:
    """log(sum(exp(x - m))) + m with m the max over the axes (no overflow for large x)."""
    if x.checked_type.dtype not in FLOAT_DTYPES or x.checked_type.size == 0:
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
    if dtype in FLOAT_DTYPES:
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


def _arg(op: str):
    def convert(ctx: ConvertContext) -> Expr:
        x = ctx.input(0)
        axis = ctx.axis(int(ctx.attr("axis", 0)), x.checked_type.ndim)
        return ctx.call(op, [x], axis=axis, keepdims=bool(ctx.attr("keepdims", 1)),
                        select_last_index=bool(ctx.attr("select_last_index", 0)))

    return convert


onnx_op("ArgMax", since=1)(_arg("argmax"))
onnx_op("ArgMin", since=1)(_arg("argmin"))


def _hardmax(ctx: ConvertContext, x: Expr, axis: int) -> Expr:
    """1 at the first maximum along ``axis``, 0 elsewhere: equal(argmax, arange) cast back."""
    shape = x.checked_type.shape
    first = ctx.call("argmax", [x], axis=axis, keepdims=True, select_last_index=False)
    positions = np.arange(shape[axis], dtype=np.int64).reshape(
        tuple(n if d == axis else 1 for d, n in enumerate(shape)))
    hit = ctx.call("equal", [first, Constant(positions)])
    return ctx.call("cast", [hit], dtype=x.checked_type.dtype)


@onnx_op("Hardmax", since=1)
def hardmax_v1(ctx: ConvertContext) -> Expr:
    """Before opset 13 the input is coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])]."""
    x = ctx.input(0)
    shape = x.checked_type.shape
    axis = ctx.axis(int(ctx.attr("axis", 1)), len(shape))
    flat = ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return ctx.reshape(_hardmax(ctx, flat, 1), shape)


@onnx_op("Hardmax", since=13)
def hardmax_v13(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    return _hardmax(ctx, x, ctx.axis(int(ctx.attr("axis", -1)), x.checked_type.ndim))


def _check_k(ctx: ConvertContext, k: int, shape: tuple, axis: int) -> None:
    """``0 <= k <= shape[axis]``; over a symbolic extent whose bounds do not decide it, the
    model needs ``extent >= k``: assumed on its symbol (checked at run time, as onnxruntime
    refuses a larger k there), or an error naming the extent."""
    extent = shape[axis]
    if isinstance(k, arith.SymExpr) and arith.provably_equal(k, extent):
        return  # a sort of the whole axis
    lo, _ = arith.bounds(extent)
    if k < 0 or (isinstance(extent, int) and k > extent):
        raise ctx.unsupported(f"k={k} out of range for axis {axis} of {shape}")
    if lo is not None and lo >= k:
        return
    if isinstance(extent, arith.SymVar):
        raise AssumptionNeeded(f"TopK k={k} needs axis {axis} of {arith.shape_str(shape)} "
                               f"to hold at least {k} values",
                               [Assumption(extent.name, lo=k, where=f"TopK k={k} over "
                                           f"axis {axis} of {arith.shape_str(shape)}")])
    raise ctx.unsupported(f"k={k} over axis {axis} of {arith.shape_str(shape)}: its extent "
                          f"may be smaller than k")


def _topk(ctx: ConvertContext, k: int) -> list[Expr]:
    x = ctx.input(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), x.checked_type.ndim)
    _check_k(ctx, k, x.checked_type.shape, axis)
    indices = ctx.call("topk_indices", [x], k=k, axis=axis,
                       largest=bool(ctx.attr("largest", 1)))
    values = ctx.call("gather", [x, indices], axis=axis)
    return [values, indices]


@onnx_op("TopK", since=1)
def topk_v1(ctx: ConvertContext) -> list[Expr]:
    return _topk(ctx, int(ctx.attr("k")))


@onnx_op("TopK", since=10)
def topk_v10(ctx: ConvertContext) -> list[Expr]:
    """k became an input (opset 10); largest and sorted attributes (11). Outputs are always
    sorted (what sorted=1 asks; sorted=0 leaves the order unspecified). A ``k`` that is data
    makes the op data-dependent (``dyn.topk``, run by the VM)."""
    try:
        k = ctx.const_dims(1, "TopK k")
    except NotConstantError as err:
        dynamic.fallback(err)
        x = ctx.input(0)
        return dynamic.topk(ctx, ctx.axis(int(ctx.attr("axis", -1)), x.checked_type.ndim),
                            bool(ctx.attr("largest", 1)))
    if len(k) != 1:
        raise ctx.unsupported(f"k must have one element, got {k}")
    x = ctx.input(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), x.checked_type.ndim)
    if isinstance(k[0], arith.SymExpr) and \
            not arith.provably_equal(k[0], x.checked_type.shape[axis]):
        # k from shape arithmetic other than the whole axis: known at run time only
        return dynamic.topk(ctx, axis, bool(ctx.attr("largest", 1)))
    return _topk(ctx, k[0])  # static, or the whole axis (torch.argsort exports a full TopK)
