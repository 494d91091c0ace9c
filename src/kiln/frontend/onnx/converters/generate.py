"""Converters of ONNX ops whose values come from positions: Range, EyeLike, Trilu, OneHot, and
Det (Leibniz's sum over permutations).

Range and EyeLike produce constants (their inputs are compile-time constants in a static
graph); Trilu selects by a constant mask (``where``; over symbolic extents the mask compares two
``arange``); OneHot compares the indices with a constant ``arange`` along the new axis.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kiln import arith
from kiln.frontend.onnx.context import ConvertContext, NotConstantError
from kiln.frontend.onnx.converters import dynamic
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Call, Constant, Expr, symbolic_array


@onnx_op("Range", since=11)
def range_(ctx: ConvertContext) -> Expr:
    """ONNX's formula: n = max(ceil((limit - start) / delta), 0) values start + k * delta;
    bounds that are data make it data-dependent (``dyn.range``, run by the VM)."""
    try:
        start, limit, delta = (_range_bound(ctx, k, what)
                               for k, what in enumerate(("start", "limit", "delta")))
    except NotConstantError as err:
        dynamic.fallback(err)
        return dynamic.range_(ctx)
    # shape values (symbolic constants) are object arrays: the inputs' declared type decides
    dtype = np.dtype(ctx.input(0).checked_type.dtype)
    if dtype.name not in ("float16", "float32", "float64", "int16", "int32", "int64"):
        raise ctx.unsupported(f"element type {dtype}")
    s, lim, d = (v.reshape(()).item() for v in (start, limit, delta))
    if d == 0:
        raise ctx.unsupported("delta 0")
    if any(isinstance(v, arith.SymExpr) for v in (s, lim, d)):
        return _symbolic_range(ctx, s, lim, d, dtype)
    count = max(math.ceil((lim - s) / d), 0)
    values = np.array([s + k * d for k in range(count)], dtype=dtype)
    return Constant(values.reshape(count), name=ctx.node.output[0])


def _range_bound(ctx: ConvertContext, index: int, what: str) -> np.ndarray:
    """Range input ``index`` as a constant; a float cast of a symbolic shape value (YOLOv8's
    anchor grid: ``arange(float(w))``) is that integer-valued symbolic dim."""
    expr = ctx.input(index)
    if isinstance(expr, Call) and expr.op.name == "cast" and \
            np.dtype(expr.checked_type.dtype).kind == "f" and ctx.folds_to_constant(expr.args[0]):
        inner = ctx.const_value(expr.args[0], f"Range {what}")
        if inner.dtype == object:
            return inner
    return ctx.const_value(index, f"Range {what}")


def _symbolic_range(ctx: ConvertContext, s, lim, d, dtype) -> Expr:
    """Range over shape values (``Range(past, total)`` in a causal mask): ``arange`` with a
    symbolic count; the step must be a static integer (a float Range: integer-valued static
    start and step, and a symbolic limit cast from a shape value)."""
    if dtype.kind == "f" and not isinstance(s, arith.SymExpr) and not isinstance(d, arith.SymExpr) \
            and float(s).is_integer() and float(d).is_integer() and d != 0:
        return _symbolic_float_range(ctx, int(s), lim, int(d), dtype)
    if isinstance(d, arith.SymExpr) or dtype.kind != "i":
        raise ctx.unsupported("a symbolic Range needs integer bounds and a static step")
    span = arith.sub(lim, s) if d > 0 else arith.sub(s, lim)
    count = arith.maximum(arith.floordiv(arith.add(span, abs(d) - 1), abs(d)), 0)
    if isinstance(s, arith.SymExpr):  # a symbolic start is an int64 shape value
        start = Constant(symbolic_array([s]).reshape(()), name=ctx.node.input[0])
        values = ctx.call("arange", [start, ctx.scalar(d, "int64")], count=count)
        return values if dtype == np.int64 else ctx.call("cast", [values], dtype=str(dtype))
    start = Constant(np.array(s, dtype=dtype), name=ctx.node.input[0])
    return ctx.call("arange", [start, ctx.scalar(d, str(dtype))], count=count)


def _symbolic_float_range(ctx: ConvertContext, s: int, lim, d: int, dtype) -> Expr:
    """``arange(s, lim, d)`` in a float dtype whose limit is an integer-valued symbolic dim:
    the count is integer arithmetic (``ceil((lim - s) / d)``, at least 0), the values ``s + k·d``
    are exact in float32 below 2**24."""
    span = arith.sub(lim, s) if d > 0 else arith.sub(s, lim)
    count = arith.maximum(arith.floordiv(arith.add(span, abs(d) - 1), abs(d)), 0)
    return ctx.call("arange", [ctx.scalar(s, str(dtype)), ctx.scalar(d, str(dtype))],
                    count=count)


@onnx_op("EyeLike", since=9)
def eye_like(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    if len(shape) != 2:
        raise ctx.unsupported(f"needs a 2-D input, got shape {shape}")
    dtype = x.checked_type.dtype
    if ctx.has_attr("dtype"):
        from kiln.frontend.onnx.context import onnx_dtype

        dtype = onnx_dtype(int(ctx.attr("dtype")), "dtype")
    eye = np.eye(shape[0], shape[1], k=int(ctx.attr("k", 0)), dtype=dtype)
    return Constant(eye, name=ctx.node.output[0])


@onnx_op("Trilu", since=14)
def trilu(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    shape = x.checked_type.shape
    if len(shape) < 2:
        raise ctx.unsupported(f"needs rank >= 2, got shape {shape}")
    k = 0
    if ctx.optional_input(1) is not None:
        (k,) = ctx.const_ints(1, "Trilu k")
    rows, cols = shape[-2:]
    upper = bool(ctx.attr("upper", 1))
    if isinstance(rows, arith.SymExpr) or isinstance(cols, arith.SymExpr):
        mask = _symbolic_triangle(ctx, rows, cols, k, upper)
    else:
        mask = Constant(np.triu(np.ones((rows, cols), bool), k) if upper else
                        np.tril(np.ones((rows, cols), bool), k))
    zero = ctx.scalar(0, x.checked_type.dtype)
    return ctx.call("where", [mask, x, zero])


def _symbolic_triangle(ctx: ConvertContext, rows, cols, k: int, upper: bool) -> Expr:
    """The [rows, cols] bool mask of Trilu over symbolic extents (a causal mask over the
    sequence length): element (i, j) is kept when j - i >= k (upper) or j - i <= k (lower),
    computed as ``arange(-k, cols)[None, :]`` compared with ``arange(0, rows)[:, None]``."""
    one = ctx.scalar(1, "int64")
    i = ctx.reshape(ctx.call("arange", [ctx.scalar(0, "int64"), one], count=rows), (rows, 1))
    j = ctx.call("arange", [ctx.scalar(-k, "int64"), one], count=cols)
    return ctx.call("greater_equal" if upper else "less_equal", [j, i])


@onnx_op("OneHot", since=9)
def one_hot(ctx: ConvertContext) -> Expr:
    """where(indices' == arange(depth), on, off) with the new axis at ``axis``; negative indices
    count from ``depth`` (opset 11)."""
    indices, values = ctx.input(0), ctx.input(2)
    depth_value = ctx.const_value(1, "OneHot depth").reshape(-1)
    if depth_value.size != 1:
        raise ctx.unsupported("depth must have one element")
    depth = int(depth_value[0])
    if values.checked_type.shape != (2,):
        raise ctx.unsupported(f"values must have shape (2,), got {values.checked_type.shape}")
    in_shape = indices.checked_type.shape
    out_ndim = len(in_shape) + 1
    axis = ctx.axis(int(ctx.attr("axis", -1)), out_ndim)
    idx = indices
    if idx.checked_type.dtype != "int64":
        idx = ctx.call("cast", [idx], dtype="int64")
    if np.dtype(indices.checked_type.dtype).kind != "u":
        negative = ctx.call("less", [idx, ctx.scalar(0, "int64")])
        idx = ctx.call("where", [negative, ctx.call("add", [idx, ctx.scalar(depth, "int64")]),
                                 idx])
    idx = ctx.reshape(idx, in_shape[:axis] + (1,) + in_shape[axis:])
    positions = np.arange(depth, dtype=np.int64).reshape(
        tuple(depth if d == axis else 1 for d in range(out_ndim)))
    hit = ctx.call("equal", [idx, Constant(positions)])
    off = ctx.call("take", [values, Constant(np.array(0, np.int64))], axis=0)
    on = ctx.call("take", [values, Constant(np.array(1, np.int64))], axis=0)
    return ctx.call("where", [hit, on, off])


@onnx_op("Det", since=11)
def det(ctx: ConvertContext) -> Expr:
    """Leibniz's formula over the permutations (matrices up to 4 x 4): sum of sign(p) times the
    product of a[i, p(i)], each element a strided slice."""
    x = ctx.input(0)
    shape = x.checked_type.shape
    if len(shape) < 2 or shape[-1] != shape[-2] or not 1 <= shape[-1] <= 4:
        raise ctx.unsupported(f"only square matrices up to 4 x 4, got shape {shape}")
    n = shape[-1]
    lead = shape[:-2]

    def element(i: int, j: int) -> Expr:
        begin = (0,) * len(lead) + (i, j)
        part = ctx.call("strided_slice", [x], begin=begin, end=lead + (i + 1, j + 1),
                        strides=(1,) * len(shape))
        return ctx.reshape(part, lead)

    total = None
    for perm in itertools.permutations(range(n)):
        term = element(0, perm[0])
        for i in range(1, n):
            term = ctx.call("multiply", [term, element(i, perm[i])])
        inversions = sum(perm[a] > perm[b] for a in range(n) for b in range(a + 1, n))
        if total is None:
            total = term
        else:
            total = ctx.call("subtract" if inversions % 2 else "add", [total, term])
    return total
