"""Converters of neural-network ONNX ops: Conv, ConvTranspose, Gemm, MatMul, pooling,
BatchNormalization,
LayerNormalization, LRN, Softmax/LogSoftmax and Dropout.

Padding follows the ONNX spec: explicit ``pads`` ``[x1_begin, x2_begin, x1_end, x2_end]``
become ``(top, left, bottom, right)``; ``auto_pad`` SAME_UPPER/SAME_LOWER pad so that the output
is ``ceil(in / stride)`` (the odd pixel at the end / beginning), VALID pads nothing.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import ShapeError
from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.converters.conv3d import conv3d_as_2d, conv_transpose3d_as_2d
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Constant, Expr
from kiln.relay.op.common import broadcast_shapes


def _spatial_2d(ctx: ConvertContext, x: Expr) -> None:
    if x.checked_type.ndim != 4:
        raise ctx.unsupported(f"only 2-D spatial inputs (NCHW) are supported, got shape "
                              f"{x.checked_type.shape}")


def _padding_nd(ctx: ConvertContext, in_sizes: tuple[int, ...], kernel: tuple[int, ...],
                strides: tuple[int, ...],
                dilation: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(heads, tails): the padding before and after each spatial axis."""
    nsp = len(in_sizes)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = ctx.ints("pads", (0,) * (2 * nsp))
        if len(pads) != 2 * nsp:
            raise ctx.unsupported(f"pads {pads} do not have {2 * nsp} entries")
        return pads[:nsp], pads[nsp:]
    if auto_pad == "VALID":
        return (0,) * nsp, (0,) * nsp
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto_pad}")
    head, tail = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilation):
        # out = ceil(size / s) and total = (out - 1) s + (k - 1) d + 1 - size, which depends
        # only on size mod s: a symbolic size needs a known remainder (a declared divisor)
        rem = size % s
        if not isinstance(rem, int):
            raise ShapeError(
                f"auto_pad={auto_pad} with stride {s} over the symbolic size {size}: its padding "
                f"depends on {size} modulo {s}; declare the dim a multiple of {s} "
                f"(--dim NAME=LO..HI:{s}) or fix it (--input-shape)")
        total = max(0, (k - 1) * d + 1 - (rem if rem else s))
        small, big = total // 2, total - total // 2
        head.append(small if auto_pad == "SAME_UPPER" else big)
        tail.append(big if auto_pad == "SAME_UPPER" else small)
    return tuple(head), tuple(tail)


def _window_nd(ctx: ConvertContext, kernel: tuple[int, ...],
               in_sizes: tuple[int, ...]) -> dict:
    """Kernel, strides, dilations and (heads, tails) of an N-d window op."""
    nsp = len(in_sizes)
    strides = ctx.ints("strides", (1,) * nsp)
    dilation = ctx.ints("dilations", (1,) * nsp)
    if not len(kernel) == len(strides) == len(dilation) == nsp:
        raise ctx.unsupported(f"kernel {kernel}, strides {strides}, dilations {dilation} do "
                              f"not fit {nsp} spatial axes")
    heads, tails = _padding_nd(ctx, in_sizes, kernel, strides, dilation)
    return {"kernel": kernel, "strides": strides, "dilation": dilation, "heads": heads,
            "tails": tails}


def _as_2d(win: dict) -> dict:
    """N-d window attributes (N = 1 or 2) as the 2-D ops' attributes; 1-D puts a size-1 axis
    first (an input [N, C, W] runs as [N, C, 1, W])."""
    lift = 2 - len(win["kernel"])
    one = (1,) * lift
    zero = (0,) * lift
    heads, tails = zero + win["heads"], zero + win["tails"]
    return {"strides": one + win["strides"], "dilation": one + win["dilation"],
            "padding": (heads[0], heads[1], tails[0], tails[1])}, one + win["kernel"]


def _window_attrs(ctx: ConvertContext, kernel: tuple[int, ...], in_hw: tuple[int, ...]) -> dict:
    """strides, padding (top, left, bottom, right) and dilation of a 2-D window op."""
    if len(kernel) != 2:
        raise ctx.unsupported("only 2-D kernels are supported")
    return _as_2d(_window_nd(ctx, kernel, in_hw))[0]


def _spatial_1d_2d_or_3d(ctx: ConvertContext, x: Expr) -> int:
    nsp = x.checked_type.ndim - 2
    if nsp not in (1, 2, 3):
        raise ctx.unsupported(f"only 1-D, 2-D and 3-D spatial inputs are supported, got shape "
                              f"{x.checked_type.shape}")
    return nsp


def _conv_kernel(ctx: ConvertContext, x: Expr, w: Expr) -> tuple[int, ...]:
    """kernel_shape of a Conv or ConvTranspose, checked: 2-D spatial, and the attribute, if
    given, equal to the weight's spatial shape."""
    _spatial_2d(ctx, x)
    kernel = ctx.ints("kernel_shape", w.checked_type.shape[2:])
    if kernel != w.checked_type.shape[2:]:
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the weight shape")
    return kernel


def conv2d_call(ctx: ConvertContext, x: Expr, w: Expr) -> Expr:
    """``nn.conv2d(x, w)`` with the node's Conv attributes (kernel_shape, strides, pads,
    auto_pad, dilations, group); shared by Conv and the integer convolutions."""
    kernel = _conv_kernel(ctx, x, w)
    attrs = _window_attrs(ctx, kernel, x.checked_type.shape[2:])
    return ctx.call("nn.conv2d", [x, w], groups=int(ctx.attr("group", 1)), **attrs)


def _with_bias(ctx: ConvertContext, out: Expr) -> Expr:
    """``out`` plus the optional per-channel bias input B (input 2)."""
    bias = ctx.optional_input(2)
    return out if bias is None else ctx.call("nn.bias_add", [out, bias], axis=1)


@onnx_op("Conv", since=1)
def conv(ctx: ConvertContext) -> Expr:
    """Conv over 1-D, 2-D or 3-D spatial inputs; 1-D runs as 2-D with a size-1 height, 3-D as
    a 2-D conv over the output depths (:mod:`kiln.frontend.onnx.converters.conv3d`)."""
    x, w = ctx.input(0), ctx.input(1)
    nsp = _spatial_1d_2d_or_3d(ctx, x)
    if nsp == 2:
        return _with_bias(ctx, conv2d_call(ctx, x, w))
    shape, wshape = x.checked_type.shape, w.checked_type.shape
    kernel = ctx.ints("kernel_shape", wshape[2:])
    if kernel != wshape[2:]:
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the weight shape")
    if nsp == 3:
        return _with_bias(ctx, conv3d_as_2d(ctx, x, w, _window_nd(ctx, kernel, shape[2:])))
    attrs, _ = _as_2d(_window_nd(ctx, kernel, shape[2:]))
    x = ctx.reshape(x, shape[:2] + (1,) + shape[2:])
    w = ctx.reshape(w, wshape[:2] + (1,) + wshape[2:])
    out = _with_bias(ctx, ctx.call("nn.conv2d", [x, w], groups=int(ctx.attr("group", 1)),
                                   **attrs))
    oshape = out.checked_type.shape
    return ctx.reshape(out, oshape[:2] + oshape[3:])


def _transpose_padding(ctx: ConvertContext, size: int, kernel: int, stride: int, dilation: int,
                       adj: int, out_size: int | None) -> tuple[int, int, int]:
    """(pad_head, pad_tail, extra output rows) of one ConvTranspose axis given ``output_shape``
    or ``auto_pad`` SAME_*, as the ONNX spec and onnxruntime do: the odd pad goes to the tail
    for SAME_UPPER, to the head otherwise; an ``output_shape`` larger than the natural size
    adds rows at the end."""
    natural = (size - 1) * stride + adj + (kernel - 1) * dilation + 1
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    target = out_size if out_size is not None else size * stride
    total = max(0, natural - target)
    small, big = total // 2, total - total // 2
    head, tail = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    return head, tail, max(0, target - natural)


@onnx_op("ConvTranspose", since=1)
def conv_transpose(ctx: ConvertContext) -> Expr:
    """2-D; 1-D lifted to 2-D with a height-1 input and kernel (attributes get the identity
    entry of the added axis); 3-D as one 2-D transposed conv over the input depths
    (:mod:`kiln.frontend.onnx.converters.conv3d`)."""
    x, w = ctx.input(0), ctx.input(1)
    if x.checked_type.ndim == 5 and w.checked_type.ndim == 5:
        return _with_bias(ctx, _conv_transpose_3d(ctx, x, w))
    one_d = x.checked_type.ndim == 3 and w.checked_type.ndim == 3

    def ints(name: str, default: tuple[int, ...], lifted: tuple[int, ...]):
        value = ctx.ints(name)
        if value is None:
            return default
        if not one_d:
            return value
        if name == "pads":  # [begin, end] → (top, left, bottom, right)
            return (0, value[0], 0, value[1]) if len(value) == 2 else value
        return lifted + value

    if one_d:
        n, c, width = x.checked_type.shape
        x = ctx.reshape(x, (n, c, 1, width))
        w = ctx.reshape(w, w.checked_type.shape[:2] + (1,) + w.checked_type.shape[2:])
        kernel = w.checked_type.shape[2:]
        if ints("kernel_shape", kernel, (1,)) != kernel:
            raise ctx.unsupported("kernel_shape differs from the weight shape")
    else:
        kernel = _conv_kernel(ctx, x, w)
    strides = ints("strides", (1, 1), (1,))
    dilation = ints("dilations", (1, 1), (1,))
    adj = ints("output_padding", (0, 0), (0,))
    if not len(strides) == len(dilation) == len(adj) == 2:
        raise ctx.unsupported("only 1-D and 2-D kernels are supported")
    in_hw = x.checked_type.shape[2:]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    out_shape = ints("output_shape", None, (1,))
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto_pad}")
    if out_shape is None and auto_pad in ("NOTSET", "VALID"):
        padding = (0, 0, 0, 0) if auto_pad == "VALID" else ints("pads", (0, 0, 0, 0), ())
        if len(padding) != 4:
            raise ctx.unsupported(f"pads {padding} do not have one begin and end per axis")
        extra = adj
    else:
        wanted = (None, None) if out_shape is None else out_shape[-2:]
        per_axis = [_transpose_padding(ctx, *args) for args in
                    zip(in_hw, kernel, strides, dilation, adj, wanted)]
        padding = (per_axis[0][0], per_axis[1][0], per_axis[0][1], per_axis[1][1])
        extra = (adj[0] + per_axis[0][2], adj[1] + per_axis[1][2])
    out = ctx.call("nn.conv2d_transpose", [x, w], strides=strides, padding=tuple(padding),
                   dilation=dilation, groups=int(ctx.attr("group", 1)),
                   output_padding=tuple(extra))
    out = _with_bias(ctx, out)
    if one_d:
        n, o, _, width = out.checked_type.shape
        out = ctx.reshape(out, (n, o, width))
    return out


def _conv_transpose_3d(ctx: ConvertContext, x: Expr, w: Expr) -> Expr:
    """ConvTranspose over [N, C, D, H, W]: the attributes per axis (pads, or auto_pad SAME_* /
    output_shape as the 2-D converter reads them), then
    :func:`~kiln.frontend.onnx.converters.conv3d.conv_transpose3d_as_2d`."""
    kernel = w.checked_type.shape[2:]
    if ctx.ints("kernel_shape", kernel) != kernel:
        raise ctx.unsupported("kernel_shape differs from the weight shape")
    strides = ctx.ints("strides", (1, 1, 1))
    dilation = ctx.ints("dilations", (1, 1, 1))
    adj = ctx.ints("output_padding", (0, 0, 0))
    if not len(strides) == len(dilation) == len(adj) == 3:
        raise ctx.unsupported(f"strides {strides}, dilations {dilation}, output_padding {adj} "
                              "do not fit 3 spatial axes")
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto_pad}")
    out_shape = ctx.ints("output_shape")
    if out_shape is None and auto_pad in ("NOTSET", "VALID"):
        pads = (0,) * 6 if auto_pad == "VALID" else ctx.ints("pads", (0,) * 6)
        if len(pads) != 6:
            raise ctx.unsupported(f"pads {pads} do not have one begin and end per axis")
        return conv_transpose3d_as_2d(ctx, x, w, strides, dilation, pads[:3], pads[3:], adj)
    wanted = (None,) * 3 if out_shape is None else out_shape[-3:]
    per_axis = [_transpose_padding(ctx, *args) for args in
                zip(x.checked_type.shape[2:], kernel, strides, dilation, adj, wanted)]
    heads, tails, more = zip(*per_axis)
    extra = tuple(a + m for a, m in zip(adj, more))
    return conv_transpose3d_as_2d(ctx, x, w, strides, dilation, heads, tails, extra)


def _pool(ctx: ConvertContext, op: str, x: Expr, extra: dict) -> Expr:
    """A 1-D, 2-D or 3-D pooling. 1-D runs as 2-D with a size-1 height; 3-D is separable (max
    and average windows are boxes, average counts are products per axis): depth first, as a
    2-D pool over [N, C, D, H*W] with a (kd, 1) window, then height and width over
    [N, C*D', H, W]."""
    shape = x.checked_type.shape
    nsp = len(shape) - 2
    kernel = ctx.ints("kernel_shape")
    if kernel is None:
        raise ctx.unsupported("missing required attribute 'kernel_shape'")
    if nsp not in (1, 2, 3):
        raise ctx.unsupported(f"{nsp}-D spatial inputs are not supported")
    win = _window_nd(ctx, kernel, shape[2:])
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    if nsp < 3:
        attrs, pool_size = _as_2d(win)
        x2 = ctx.reshape(x, shape[:2] + (1,) * (2 - nsp) + shape[2:])
        out = ctx.call(op, [x2], pool_size=pool_size, ceil_mode=ceil_mode, **attrs, **extra)
        oshape = out.checked_type.shape
        return ctx.reshape(out, oshape[:2] + oshape[4 - nsp:])
    n, c, d, h, w = shape

    def axis_win(axes: tuple[int, ...]) -> dict:
        return {k: tuple(v[a] for a in axes) for k, v in win.items()}

    depth_attrs, depth_size = _as_2d(axis_win((0,)))
    # the depth pass as [N, C, D, H*W] with window (kd, 1): swap the lifted axis order
    depth_attrs = {"strides": depth_attrs["strides"][::-1],
                   "dilation": depth_attrs["dilation"][::-1],
                   "padding": (depth_attrs["padding"][1], 0, depth_attrs["padding"][3], 0)}
    step = ctx.call(op, [ctx.reshape(x, (n, c, d, h * w))], pool_size=depth_size[::-1],
                    ceil_mode=ceil_mode, **depth_attrs, **extra)
    d2 = step.checked_type.shape[2]
    hw_attrs, hw_size = _as_2d(axis_win((1, 2)))
    out = ctx.call(op, [ctx.reshape(step, (n, c * d2, h, w))], pool_size=hw_size,
                   ceil_mode=ceil_mode, **hw_attrs, **extra)
    return ctx.reshape(out, (n, c, d2) + out.checked_type.shape[2:])


@onnx_op("MaxPool", since=1)
def max_pool(ctx: ConvertContext) -> list[Expr]:
    x = ctx.input(0)
    out = _pool(ctx, "nn.max_pool2d", x, {})
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return [out]
    if x.checked_type.ndim != 4:
        raise ctx.unsupported("the Indices output of a pool that is not 2-D")
    attrs, pool_size = _as_2d(_window_nd(ctx, ctx.ints("kernel_shape"), x.checked_type.shape[2:]))
    indices = ctx.call("nn.max_pool2d_indices", [x], pool_size=pool_size,
                       ceil_mode=bool(ctx.attr("ceil_mode", 0)),
                       storage_order=int(ctx.attr("storage_order", 0)), **attrs)
    return [out, indices]


@onnx_op("AveragePool", since=1)
def avg_pool(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    return _pool(ctx, "nn.avg_pool2d", x,
                 {"count_include_pad": bool(ctx.attr("count_include_pad", 0))})


def _global_pool(ctx: ConvertContext, pool2d: str, reduce: str) -> Expr:
    """A global pool over every axis after N and C: the 2-D pool op for NCHW (its layout
    passes and schedule), a keepdims reduction over axes 2.. for any other rank (N, C, L...)."""
    x = ctx.input(0)
    ndim = x.checked_type.ndim
    if ndim < 3:
        raise ctx.unsupported(f"an input of rank {ndim}; a global pool needs N, C and at least "
                              "one spatial axis")
    if ndim == 4:
        return ctx.call(pool2d, [x])
    return ctx.call(reduce, [x], axis=tuple(range(2, ndim)), keepdims=True)


@onnx_op("GlobalAveragePool", since=1)
def global_avg_pool(ctx: ConvertContext) -> Expr:
    return _global_pool(ctx, "nn.global_avg_pool2d", "mean")


@onnx_op("GlobalMaxPool", since=1)
def global_max_pool(ctx: ConvertContext) -> Expr:
    return _global_pool(ctx, "nn.global_max_pool2d", "max")


@onnx_op("LRN", since=1)
def lrn(ctx: ConvertContext) -> Expr:
    return ctx.call("nn.lrn", [ctx.input(0)], size=int(ctx.attr("size")), axis=1,
                    alpha=float(ctx.attr("alpha", 1e-4)), beta=float(ctx.attr("beta", 0.75)),
                    bias=float(ctx.attr("bias", 1.0)))


@onnx_op("BatchNormalization", since=1)
def batch_norm(ctx: ConvertContext) -> list[Expr]:
    if not ctx.attr("spatial", 1):
        raise ctx.unsupported("spatial=0")
    if ctx.attr("training_mode", 0):
        from kiln.frontend.onnx.converters.normalization import batch_norm_training

        return batch_norm_training(ctx)
    args = [ctx.input(k) for k in range(5)]
    # Only the inference output Y; running mean/var outputs raise if used.
    return [ctx.call("nn.batch_norm", args, epsilon=float(ctx.attr("epsilon", 1e-5)), axis=1)]


@onnx_op("LayerNormalization", since=17)
def layer_norm(ctx: ConvertContext) -> list[Expr]:
    """Normalize over the trailing axes ``[axis, rank)``: they are flattened into one so that
    ``nn.layer_norm`` (TVM's op, one axis) applies; Scale and B are broadcast to the normalized
    shape. The optional outputs Mean and InvStdDev (shape of X with the normalized axes 1) are
    built from reductions and arithmetic; unused, they are dead code."""
    x = ctx.input(0)
    shape = x.checked_type.shape
    ndim = len(shape)
    axis = ctx.axis(int(ctx.attr("axis", -1)), ndim)
    if int(ctx.attr("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {ctx.attr('stash_type')} (only 1, float32 statistics)")
    norm_shape = shape[axis:]
    size = math.prod(norm_shape)

    def per_channel(t: Expr) -> Expr:
        if t.checked_type.shape != norm_shape:
            try:
                wide = broadcast_shapes(t.checked_type.shape, norm_shape)
            except ShapeError:
                wide = None
            if wide != norm_shape:
                raise ctx.unsupported(f"Scale/B shape {t.checked_type.shape} does not broadcast "
                                      f"to the normalized shape {norm_shape}")
            t = ctx.call("expand", [t], newshape=norm_shape)
        return ctx.reshape(t, (size,))

    dtype = x.checked_type.dtype
    epsilon = float(ctx.attr("epsilon", 1e-5))
    gamma = per_channel(ctx.input(1))
    bias = ctx.optional_input(2)
    beta = per_channel(bias) if bias is not None else Constant(np.zeros(size, dtype))
    flat = ctx.reshape(x, shape[:axis] + (size,))
    out = ctx.call("nn.layer_norm", [flat, gamma, beta], axis=axis, epsilon=epsilon)
    axes = tuple(range(axis, ndim))
    mean = ctx.call("mean", [x], axis=axes, keepdims=True)
    centered = ctx.call("subtract", [x, mean])
    var = ctx.call("mean", [ctx.call("multiply", [centered, centered])], axis=axes, keepdims=True)
    std = ctx.call("sqrt", [ctx.call("add", [var, ctx.scalar(epsilon, dtype)])])
    inv_std = ctx.call("divide", [ctx.scalar(1.0, dtype), std])
    return [ctx.reshape(out, shape), mean, inv_std]


@onnx_op("Gemm", since=7)
def gemm(ctx: ConvertContext) -> Expr:
    """Y = alpha * A' @ B' + beta * C, with B' as a dense weight [N, K]."""
    a, b = ctx.input(0), ctx.input(1)
    if a.checked_type.ndim != 2 or b.checked_type.ndim != 2:
        raise ctx.unsupported("A and B must be 2-D")
    if ctx.attr("transA", 0):
        a = ctx.call("transpose", [a], axes=(1, 0))
    if not ctx.attr("transB", 0):
        b = ctx.call("transpose", [b], axes=(1, 0))
    out = ctx.call("nn.dense", [a, b])
    dtype = out.checked_type.dtype
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        out = ctx.call("multiply", [out, ctx.scalar(alpha, dtype)])
    c = ctx.optional_input(2)
    if c is None or beta == 0.0:
        return out
    if beta != 1.0:
        c = ctx.call("multiply", [c, ctx.scalar(beta, dtype)])
    n = out.checked_type.shape[1]
    if c.checked_type.shape == (n,):
        return ctx.call("nn.bias_add", [out, c], axis=1)
    return ctx.call("add", [out, c])


@onnx_op("MatMul", since=1)
def matmul(ctx: ConvertContext) -> Expr:
    return matmul_call(ctx, ctx.input(0), ctx.input(1))


def matmul_call(ctx: ConvertContext, a: Expr, b: Expr) -> Expr:
    """numpy matmul: 1-D operands are promoted to matrices and the added axis removed after;
    shared by MatMul and the integer matrix products."""
    a_shape, b_shape = a.checked_type.shape, b.checked_type.shape
    if not a_shape or not b_shape:
        raise ctx.unsupported("scalar operands")
    if len(a_shape) == 1:
        a = ctx.reshape(a, (1,) + a_shape)
    if len(b_shape) == 1:
        b = ctx.reshape(b, b_shape + (1,))
    if b.checked_type.ndim == 2 and ctx.folds_to_constant(b):
        # A weight operand: dense over the transposed weight, which FoldConstant precomputes
        # (and AlterOpLayout packs); the leading axes of A fold into its rows.
        rows = a.checked_type.shape[:-1]
        flat = ctx.reshape(a, (math.prod(rows), a.checked_type.shape[-1]))
        out = ctx.call("nn.dense", [flat, ctx.call("transpose", [b], axes=(1, 0))])
        out = ctx.reshape(out, rows + (b.checked_type.shape[1],))
    else:
        out = ctx.call("nn.matmul", [a, b])
    shape = out.checked_type.shape
    if len(a_shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b_shape) == 1:
        shape = shape[:-1]
    return ctx.reshape(out, shape)


def _softmax_v1(op: str, ctx: ConvertContext) -> Expr:
    """Before opset 13 the input is coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])]."""
    x = ctx.input(0)
    shape = x.checked_type.shape
    ndim = len(shape)
    axis = ctx.axis(int(ctx.attr("axis", 1)), ndim)
    if ndim == 2 and axis == 1:
        return ctx.call(op, [x], axis=1)
    flat = ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return ctx.reshape(ctx.call(op, [flat], axis=1), shape)


def _softmax_v13(op: str, ctx: ConvertContext) -> Expr:
    """From opset 13 the op normalizes along ``axis`` alone (default -1)."""
    x = ctx.input(0)
    ndim = x.checked_type.ndim
    return ctx.call(op, [x], axis=ctx.axis(int(ctx.attr("axis", -1)), ndim))


for _onnx_name, _op in (("Softmax", "nn.softmax"), ("LogSoftmax", "nn.log_softmax")):
    onnx_op(_onnx_name, since=1)(lambda ctx, op=_op: _softmax_v1(op, ctx))
    onnx_op(_onnx_name, since=13)(lambda ctx, op=_op: _softmax_v13(op, ctx))


@onnx_op("Dropout", since=1)
def dropout(ctx: ConvertContext) -> list[Expr]:
    """Dropout at inference (or training with ratio 0) is the identity and its mask all true;
    training with a positive ratio is random and not supported."""
    if ctx.attr("is_test", 1) == 0 and ctx.opset < 7:
        raise ctx.unsupported("is_test=0")
    rate = float(ctx.attr("ratio", 0.5))
    if ctx.opset >= 12:
        ratio = ctx.optional_input(1)
        if ratio is not None:
            rate = float(ctx.const_value(ratio, "Dropout ratio").reshape(()))
        training = ctx.optional_input(2)
        if training is not None and rate != 0.0 and \
                bool(ctx.const_value(training, "training_mode").reshape(())):
            raise ctx.unsupported("training_mode=true with a nonzero ratio (random)")
    x = ctx.input(0)
    shape = x.checked_type.shape
    if x.checked_type.is_static:
        mask = Constant(np.ones(shape, dtype=bool))
    else:  # a symbolic shape has no constant of its own: broadcast one true
        mask = ctx.call("expand", [Constant(np.ones((), dtype=bool))], newshape=shape)
    return [ctx.call("nn.dropout", [x], rate=rate), mask]
