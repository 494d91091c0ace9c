"""Converters of ONNX index-driven ops: GatherElements, ScatterElements (and the deprecated
Scatter), GatherND, ScatterND, CumSum, CumProd, Compress, ReverseSequence, MaxUnpool,
TensorScatter."""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.context import ConvertContext, NotConstantError
from kiln.frontend.onnx.converters import dynamic
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Constant, Expr


def _axis(ctx: ConvertContext, ndim: int, default: int = 0) -> int:
    return ctx.axis(int(ctx.attr("axis", default)), ndim)


@onnx_op("GatherElements", since=11)
def gather_elements(ctx: ConvertContext) -> Expr:
    data, indices = ctx.input(0), ctx.input(1)
    return ctx.call("gather", [data, indices], axis=_axis(ctx, data.checked_type.ndim))


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
        return ctx.call(op, [x], axis=ctx.axis(axis, x.checked_type.ndim),
                        exclusive=bool(ctx.attr("exclusive", 0)),
                        reverse=bool(ctx.attr("reverse", 0)))

    return convert


onnx_op("CumSum", since=11)(_cumulative("cumsum"))
onnx_op("CumProd", since=26)(_cumulative("cumprod"))


@onnx_op("Compress", since=9)
def compress(ctx: ConvertContext) -> Expr:
    """A constant condition makes the op a ``take`` of the selected positions; a condition
    that is data makes it data-dependent (``dyn.compress``, run by the VM)."""
    x = ctx.input(0)
    axis = ctx.attr("axis", None)
    if axis is not None:
        axis = _axis(ctx, x.checked_type.ndim, int(axis))
    try:
        cond = ctx.const_value(1, "Compress condition").reshape(-1).astype(bool)
    except NotConstantError as err:
        dynamic.fallback(err)
        return dynamic.compress(ctx, x, axis)
    if axis is None:
        x = ctx.reshape(x, (x.checked_type.size,))
        axis = 0
    extent = x.checked_type.shape[axis]
    if cond.size > extent:
        raise ctx.unsupported(f"condition of {cond.size} entries for an axis of {extent}")
    picked = np.nonzero(cond)[0].astype(np.int64)
    return ctx.call("take", [x, Constant(picked)], axis=axis)


@onnx_op("ReverseSequence", since=10)
def reverse_sequence(ctx: ConvertContext) -> Expr:
    """gather_elements along the time axis with constant indices built from the (compile-time)
    sequence lengths: position t of batch b reads lens[b] - 1 - t while t < lens[b]."""
    x = ctx.input(0)
    lens = ctx.const_value(1, "ReverseSequence sequence_lens").reshape(-1)
    shape = x.checked_type.shape
    batch_axis, time_axis = int(ctx.attr("batch_axis", 1)), int(ctx.attr("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1} or len(shape) < 2 or lens.size != shape[batch_axis]:
        raise ctx.unsupported(f"batch_axis={batch_axis}, time_axis={time_axis}, "
                              f"sequence_lens of {lens.size} for shape {shape}")
    steps = np.arange(shape[time_axis])
    index = np.empty(shape[:2], dtype=np.int64)
    for b, n in enumerate(lens.astype(np.int64)):
        source = np.where(steps < n, n - 1 - steps, steps)
        if batch_axis == 0:
            index[b, :] = source
        else:
            index[:, b] = source
    index = np.broadcast_to(index.reshape(shape[:2] + (1,) * (len(shape) - 2)), shape)
    return ctx.call("gather", [x, Constant(np.ascontiguousarray(index))],
                    axis=time_axis)


@onnx_op("MaxUnpool", since=9)
def max_unpool(ctx: ConvertContext) -> Expr:
    """Zeros of the pool's input shape with X scattered at I, the flat indices MaxPool's
    Indices output gives (scatter_nd on the flattened tensor); a larger ``output_shape`` pads
    zeros after (ONNX's reference)."""
    x, indices = ctx.input(0), ctx.input(1)
    shape = x.checked_type.shape
    kernel = ctx.ints("kernel_shape")
    nsp = len(shape) - 2
    strides = ctx.ints("strides", (1,) * nsp)
    pads = ctx.ints("pads", (0,) * (2 * nsp))
    inferred = shape[:2] + tuple((n - 1) * s - pads[k] - pads[k + nsp] + kern
                                 for k, (n, s, kern) in enumerate(zip(shape[2:], strides,
                                                                      kernel)))
    out_shape = inferred
    if ctx.optional_input(2) is not None:
        out_shape = ctx.const_ints(2, "MaxUnpool output_shape")
    if len(out_shape) != len(shape) or indices.checked_type.shape != shape or \
            any(o < i for o, i in zip(out_shape, inferred)):
        raise ctx.unsupported(f"output_shape {out_shape} for X {shape}, I "
                              f"{indices.checked_type.shape}")
    zeros = Constant(np.zeros(int(np.prod(inferred)), dtype=x.checked_type.dtype))
    flat_i = ctx.reshape(indices, (x.checked_type.size, 1))
    flat_x = ctx.reshape(x, (x.checked_type.size,))
    out = ctx.reshape(ctx.call("scatter_nd", [zeros, flat_i, flat_x], reduction="none"),
                      inferred)
    if tuple(out_shape) == tuple(inferred):
        return out
    width = tuple((0, o - i) for o, i in zip(out_shape, inferred))
    return ctx.call("nn.pad", [out], pad_width=width, pad_value=0.0, pad_mode="constant")


@onnx_op("TensorScatter", since=24)
def tensor_scatter(ctx: ConvertContext) -> Expr:
    """A KV-cache write: position s of batch b along ``axis`` takes update[.., s - w[b], ..]
    when 0 <= s - w[b] < len(update) (mod the cache length in circular mode), else keeps the
    cache: gather_elements of the update with those offsets, then where."""
    past, update = ctx.input(0), ctx.input(1)
    shape, ushape = past.checked_type.shape, update.checked_type.shape
    axis = _axis(ctx, len(shape), int(ctx.attr("axis", -2)))
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular") or axis == 0 or len(ushape) != len(shape):
        raise ctx.unsupported(f"mode={mode!r}, axis {axis} for {shape} / {ushape}")
    cache, new = shape[axis], ushape[axis]
    positions = np.arange(cache, dtype=np.int64).reshape(
        tuple(cache if d == axis else 1 for d in range(len(shape))))
    writes = ctx.optional_input(2)
    if writes is None:
        offset: Expr = Constant(positions)
    else:
        w = ctx.reshape(ctx.call("cast", [writes], dtype="int64")
                        if writes.checked_type.dtype != "int64" else writes,
                        (shape[0],) + (1,) * (len(shape) - 1))
        offset = ctx.call("subtract", [Constant(positions), w])
    if mode == "circular":
        offset = ctx.call("floor_mod", [offset, ctx.scalar(cache, "int64")])
    inside = ctx.call("logical_and", [
        ctx.call("greater_equal", [offset, ctx.scalar(0, "int64")]),
        ctx.call("less", [offset, ctx.scalar(new, "int64")])])
    safe = ctx.call("minimum", [ctx.call("maximum", [offset, ctx.scalar(0, "int64")]),
                                ctx.scalar(new - 1, "int64")])
    index_shape = shape[:axis] + (cache,) + shape[axis + 1:]
    index = ctx.call("expand", [safe], newshape=index_shape)
    picked = ctx.call("gather", [update, index], axis=axis)
    return ctx.call("where", [inside, picked, past])
