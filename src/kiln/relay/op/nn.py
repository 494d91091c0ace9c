"""Neural-network graph ops (NCHW data, OIHW weights): conv2d, conv2d_transpose (IOHW weights),
dense, matmul, pooling, softmax,
LRN, layer_norm, and the inference-only ops batch_norm and dropout (removed by SimplifyInference).

Output sizes follow the ONNX operator specs (Conv, ConvTranspose, Gemm, MatMul, MaxPool,
AveragePool, Softmax,
LRN, LayerNormalization, BatchNormalization) as implemented by onnxruntime; ``ceil_mode`` pooling
drops a last window
that would start in the bottom/right padding (onnxruntime ``PoolAttributes::ComputeOutputSize``).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from kiln import arith
from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import (
    broadcast_shapes,
    expect_arity,
    expect_float,
    expect_rank,
    lowest,
    normalize_axis,
    same_dtype,
    surely_less,
)
from kiln.relay.op_registry import OpPattern, register_op
from kiln.tir.layout import transform_array


def _windows(x: np.ndarray, out_hw: tuple[int, int], kernel: tuple[int, int],
             strides: tuple[int, int], dilation: tuple[int, int]) -> np.ndarray:
    """A read-only view ``[N, C, OH, OW, KH, KW]`` of the sliding windows of padded NCHW ``x``."""
    n, c = x.shape[:2]
    s = x.strides
    return as_strided(x, (n, c, out_hw[0], out_hw[1], kernel[0], kernel[1]),
                      (s[0], s[1], s[2] * strides[0], s[3] * strides[1], s[2] * dilation[0],
                       s[3] * dilation[1]), writeable=False)


def _pad_hw(x: np.ndarray, padding: tuple[int, int, int, int], value) -> np.ndarray:
    pt, pl, pb, pr = padding
    if not any(padding):
        return x
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=value)


# ---------------------------------------------------------------------------------------------
# conv2d


def _conv_types(arg_types: list[TensorType]) -> tuple[TensorType, TensorType, str]:
    """(data, weight, dtype) of a 2-D convolution: two rank-4 operands of one dtype."""
    expect_arity(arg_types, 2)
    data, weight = arg_types
    dtype = same_dtype(arg_types)
    expect_rank(data, 4, "data")
    expect_rank(weight, 4, "weight")
    return data, weight, dtype


def _conv2d_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    data, weight, dtype = _conv_types(arg_types)
    n, c, h, w = data.shape
    o, i, kh, kw = weight.shape
    groups = attrs["groups"]
    if groups < 1 or c != i * groups or o % groups:
        raise ShapeError(f"data {data.shape} and weight {weight.shape} do not fit groups={groups}")
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if surely_less(oh, 1) or surely_less(ow, 1):
        raise ShapeError(f"kernel {(kh, kw)} larger than padded input {data.shape}")
    return TensorType((n, o, oh, ow), dtype)


def _conv2d_ref(data: np.ndarray, weight: np.ndarray, strides, padding, dilation,
                groups: int) -> np.ndarray:
    n = data.shape[0]
    o, i, kh, kw = weight.shape
    out = _conv2d_infer([TensorType(data.shape, str(data.dtype)),
                         TensorType(weight.shape, str(weight.dtype))],
                        {"strides": strides, "padding": padding, "dilation": dilation,
                         "groups": groups}).shape
    oh, ow = out[2:]
    win = _windows(_pad_hw(data, padding, 0), (oh, ow), (kh, kw), strides, dilation)
    # [G, N*OH*OW, I*KH*KW] @ [G, I*KH*KW, O/G] -> [G, N*OH*OW, O/G]
    cols = win.reshape(n, groups, i, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    cols = cols.reshape(groups, n * oh * ow, i * kh * kw)
    wmat = weight.reshape(groups, o // groups, i * kh * kw).transpose(0, 2, 1)
    res = np.matmul(cols, wmat)
    res = res.reshape(groups, n, oh, ow, o // groups).transpose(1, 0, 4, 2, 3)
    return np.ascontiguousarray(res.reshape(n, o, oh, ow)).astype(data.dtype, copy=False)


register_op("nn.conv2d", _conv2d_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _conv2d_ref)

# ---------------------------------------------------------------------------------------------
# conv2d_transpose


def _conv2d_transpose_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    """Data ``[N, C, H, W]``, weight ``[C, O/groups, KH, KW]`` (ONNX ConvTranspose's, TVM's
    ``IOHW``) → ``[N, O, OH, OW]`` with ``OH = (H - 1) * sh + (KH - 1) * dh + 1 +
    output_padding_h - pad_top - pad_bottom``."""
    data, weight, dtype = _conv_types(arg_types)
    n, c, h, w = data.shape
    i, o_per_group, kh, kw = weight.shape
    groups = attrs["groups"]
    if groups < 1 or c != i or c % groups:
        raise ShapeError(f"data {data.shape} and weight {weight.shape} do not fit groups={groups}")
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oph, opw = attrs["output_padding"]
    oh = (h - 1) * sh + (kh - 1) * dh + 1 + oph - pt - pb
    ow = (w - 1) * sw + (kw - 1) * dw + 1 + opw - pl - pr
    if surely_less(oh, 1) or surely_less(ow, 1) or min(sh, sw, dh, dw) < 1 or \
            min(pt, pl, pb, pr, oph, opw) < 0:
        raise ShapeError(f"conv2d_transpose of {data.shape} by {weight.shape} with {attrs} has "
                         f"no output")
    return TensorType((n, o_per_group * groups, oh, ow), dtype)


def _conv2d_transpose_ref(data: np.ndarray, weight: np.ndarray, strides, padding, dilation,
                          groups: int, output_padding) -> np.ndarray:
    """Scatter form: every input pixel adds its weighted kernel into the (padded) output."""
    out_shape = _conv2d_transpose_infer(
        [TensorType(data.shape, str(data.dtype)), TensorType(weight.shape, str(weight.dtype))],
        {"strides": strides, "padding": padding, "dilation": dilation, "groups": groups,
         "output_padding": output_padding}).shape
    n, c, h, w = data.shape
    _, opg, kh, kw = weight.shape
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl = padding[0], padding[1]
    full = np.zeros((n, out_shape[1], out_shape[2] + pt + padding[2],
                     out_shape[3] + pl + padding[3]), dtype=np.float64)
    cpg = c // groups
    for g in range(groups):
        x = data[:, g * cpg:(g + 1) * cpg].astype(np.float64)
        wg = weight[g * cpg:(g + 1) * cpg].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                contrib = np.einsum("nchw,co->nohw", x, wg[:, :, ky, kx])
                full[:, g * opg:(g + 1) * opg, ky * dh: ky * dh + (h - 1) * sh + 1: sh,
                     kx * dw: kx * dw + (w - 1) * sw + 1: sw] += contrib
    out = full[:, :, pt: pt + out_shape[2], pl: pl + out_shape[3]]
    return np.ascontiguousarray(out).astype(data.dtype)


register_op("nn.conv2d_transpose", _conv2d_transpose_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            _conv2d_transpose_ref)

# ---------------------------------------------------------------------------------------------
# dense / matmul


def _dense_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, weight = arg_types
    dtype = same_dtype(arg_types)
    expect_rank(data, 2, "data")
    expect_rank(weight, 2, "weight")
    if data.shape[1] != weight.shape[1]:
        raise ShapeError(f"data {data.shape} and weight {weight.shape}: K differs")
    return TensorType((data.shape[0], weight.shape[0]), dtype)


register_op("nn.dense", _dense_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            lambda data, weight: np.matmul(data, weight.T).astype(data.dtype, copy=False))


def _dense_pack_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, weight = arg_types
    dtype = same_dtype(arg_types)
    expect_rank(data, 2, "data")
    expect_rank(weight, 3, "weight")
    if data.shape[1] != weight.shape[1]:
        raise ShapeError(f"data {data.shape} and packed weight {weight.shape}: K differs")
    return TensorType((data.shape[0], weight.shape[0] * weight.shape[2]), dtype)


def unpack_dense_weight(weight: np.ndarray) -> np.ndarray:
    """``[N/b, K, b]`` → ``[N, K]`` (the inverse of :func:`pack_dense_weight`)."""
    nb, k, b = weight.shape
    return np.ascontiguousarray(weight.transpose(0, 2, 1).reshape(nb * b, k))


def pack_dense_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """``[N, K]`` → ``[N/b, K, b]``: ``b`` consecutive outputs' weights side by side for each
    ``k``, so a vector of ``b`` accumulators reads one contiguous row per ``k`` (TVM's
    ``dense_pack`` weight layout ``NK{b}n``)."""
    n, k = weight.shape
    return np.ascontiguousarray(weight.reshape(n // block, block, k).transpose(0, 2, 1))


register_op("nn.dense_pack", _dense_pack_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            lambda data, weight: np.matmul(data, unpack_dense_weight(weight).T)
            .astype(data.dtype, copy=False))


def _matmul_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    a, b = arg_types
    dtype = same_dtype(arg_types)
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"operands must have rank >= 2, got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"operands {a.shape} and {b.shape}: inner dimensions differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (a.shape[-2], b.shape[-1]), dtype)


register_op("nn.matmul", _matmul_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            lambda a, b: np.matmul(a, b).astype(a.dtype, copy=False))

# ---------------------------------------------------------------------------------------------
# pooling


def pool_output_size(size: arith.Dim, kernel: int, stride: int, pad_head: int, pad_tail: int,
                     dilation: int, ceil_mode: bool) -> arith.Dim:
    """Output length of one pooled dimension (ONNX MaxPool/AveragePool, onnxruntime rounding);
    symbolic for a symbolic ``size``."""
    span = size + pad_head + pad_tail - dilation * (kernel - 1) - 1
    if surely_less(span, 0):
        raise ShapeError(f"pooling window {kernel} larger than padded input {size}")
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if not isinstance(out, int):
        # The last window must start before the tail padding: (out - 1) * stride < size +
        # pad_head. It always does when pad_tail + stride <= dilation * (kernel - 1) + 1,
        # since (out - 1) * stride <= span + stride - 1 (squeezenet's 3-window, stride 2, no
        # padding): no min, which the bounds could not decide. Else onnxruntime drops at most
        # one window, and so does this bound: span < size + pad_head + stride whenever a
        # window fits the padding (pad_tail < kernel).
        if pad_tail + stride <= dilation * (kernel - 1) + 1:
            return out
        return arith.minimum(out, (size + pad_head - 1) // stride + 1)
    if (out - 1) * stride >= size + pad_head:
        out -= 1  # the last window would start inside the tail padding
    return out


def pool_layout_check(data: TensorType, attrs: dict) -> None:
    """Check a pool's data against its ``layout`` attr: ``"NCHW"`` (default, 4-D data) or the
    blocked ``"NCHW{b}c"`` AlterOpLayout gives it (5-D data ``[N, C/b, H, W, b]``; TVM's pool
    ``layout`` attr). Pooling is per channel, so only the axes of H and W matter.

    Raises
    ------
    ShapeError
        Rank or block that differ from the layout.
    """
    layout = attrs.get("layout", "NCHW")
    if layout == "NCHW":
        expect_rank(data, 4, "data")
        return
    expect_rank(data, 5, "data")
    if layout != f"NCHW{data.shape[4]}c":
        raise ShapeError(f"pool layout {layout} does not match data shape {data.shape}")


def in_nchw(ref):
    """A numpy reference over NCHW data, run on data in the op's ``layout`` attr."""
    def run(data: np.ndarray, layout: str = "NCHW", **attrs) -> np.ndarray:
        if layout == "NCHW":
            return ref(data, **attrs)
        return transform_array(ref(transform_array(data, layout, "NCHW"), **attrs), "NCHW",
                               layout)
    return run


def _pool_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (data,) = arg_types
    pool_layout_check(data, attrs)
    n, c, h, w = data.shape[:4]
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh = pool_output_size(h, kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = pool_output_size(w, kw, sw, pl, pr, dw, attrs["ceil_mode"])
    return TensorType((n, c, oh, ow, *data.shape[4:]), data.dtype)


def _pool_setup(data: np.ndarray, attrs: dict, value):
    """Pad ``data`` so that every window of the output lies inside; returns (padded, windows)."""
    out = _pool_infer([TensorType(data.shape, str(data.dtype))], attrs).shape
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    h, w = data.shape[2:]
    # ceil_mode windows may run past the bottom/right padding: extend with the neutral value.
    eb = max(0, (out[2] - 1) * sh + dh * (kh - 1) + 1 - (h + pt + pb))
    er = max(0, (out[3] - 1) * sw + dw * (kw - 1) + 1 - (w + pl + pr))
    padded = _pad_hw(data, (pt, pl, pb + eb, pr + er), value)
    return padded, _windows(padded, out[2:], (kh, kw), (sh, sw), (dh, dw)), (eb, er)


def _max_pool_ref(data: np.ndarray, **attrs) -> np.ndarray:
    _, win, _ = _pool_setup(data, attrs, lowest(str(data.dtype)))
    return np.ascontiguousarray(win.max(axis=(4, 5)))


def _avg_pool_ref(data: np.ndarray, **attrs) -> np.ndarray:
    _, win, (eb, er) = _pool_setup(data, attrs, 0)
    total = win.sum(axis=(4, 5), dtype=data.dtype)
    h, w = data.shape[2:]
    pt, pl, pb, pr = attrs["padding"]
    # The divisor counts the window's taps inside the padded input (count_include_pad) or inside
    # the real input; taps in the ceil_mode extension never count.
    mask = np.zeros((1, 1, h + pt + pb + eb, w + pl + pr + er), dtype=data.dtype)
    if attrs["count_include_pad"]:
        mask[..., : h + pt + pb, : w + pl + pr] = 1
    else:
        mask[..., pt: pt + h, pl: pl + w] = 1
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    count = _windows(mask, total.shape[2:], (kh, kw), (sh, sw), (dh, dw)).sum(axis=(4, 5))
    return (total / count).astype(data.dtype, copy=False)


register_op("nn.max_pool2d", _pool_infer, OpPattern.OUT_ELEMWISE_FUSABLE, in_nchw(_max_pool_ref))
register_op("nn.avg_pool2d", _pool_infer, OpPattern.OUT_ELEMWISE_FUSABLE, in_nchw(_avg_pool_ref))


def _global_pool_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (data,) = arg_types
    pool_layout_check(data, attrs)
    return TensorType(data.shape[:2] + (1, 1) + data.shape[4:], data.dtype)


register_op("nn.global_avg_pool2d", _global_pool_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            in_nchw(lambda x: x.mean(axis=(2, 3), keepdims=True, dtype=x.dtype)))
register_op("nn.global_max_pool2d", _global_pool_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            in_nchw(lambda x: x.max(axis=(2, 3), keepdims=True)))

# ---------------------------------------------------------------------------------------------
# softmax, log_softmax, lrn


def _axis_op_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    expect_float(arg_types[0])
    normalize_axis(attrs["axis"], arg_types[0].ndim)
    return arg_types[0]


def _softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def _log_softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


register_op("nn.softmax", _axis_op_infer, OpPattern.OPAQUE, _softmax_ref)
register_op("nn.log_softmax", _axis_op_infer, OpPattern.OPAQUE, _log_softmax_ref)


def _lrn_ref(x: np.ndarray, size: int, axis: int, alpha: float, beta: float,
             bias: float) -> np.ndarray:
    axis %= x.ndim
    sq = np.moveaxis(x * x, axis, -1)
    lo = (size - 1) // 2
    padded = np.pad(sq, [(0, 0)] * (sq.ndim - 1) + [(lo, size - 1 - lo)])
    csum = np.concatenate([np.zeros(sq.shape[:-1] + (1,), x.dtype),
                           np.cumsum(padded, axis=-1, dtype=np.float64)], axis=-1)
    window = (csum[..., size:] - csum[..., :-size]).astype(x.dtype)
    window = np.moveaxis(window, -1, axis)
    t = x.dtype.type
    return (x / (t(bias) + t(alpha / size) * window) ** t(beta)).astype(x.dtype, copy=False)


register_op("nn.lrn", _axis_op_infer, OpPattern.OPAQUE, _lrn_ref)

# ---------------------------------------------------------------------------------------------
# layer_norm


def _per_channel_infer(count: int, what: str):
    """The type relation of an op over ``x`` and ``count - 1`` 1-D per-channel operands whose
    length is that of ``x``'s axis ``attrs["axis"]``: the result has ``x``'s type."""

    def infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
        expect_arity(arg_types, count)
        x = arg_types[0]
        same_dtype(arg_types)
        expect_float(x)
        axis = normalize_axis(attrs["axis"], x.ndim)
        for t in arg_types[1:]:
            if t.shape != (x.shape[axis],):
                raise ShapeError(f"{what} shape {t.shape} does not match axis {axis} of "
                                 f"{x.shape}")
        return x

    return infer


#: ``nn.layer_norm(data, gamma, beta)``, TVM's op: normalize along the one axis ``axis``, then
#: scale by ``gamma`` and shift by ``beta`` (both 1-D, that axis' length).
_layer_norm_infer = _per_channel_infer(3, "gamma/beta")


def _layer_norm_ref(x, gamma, beta, axis: int, epsilon: float) -> np.ndarray:
    axis %= x.ndim
    shape = (-1,) + (1,) * (x.ndim - axis - 1)
    mean = x.mean(axis=axis, keepdims=True, dtype=x.dtype)
    centered = x - mean
    var = (centered * centered).mean(axis=axis, keepdims=True, dtype=x.dtype)
    y = centered / np.sqrt(var + x.dtype.type(epsilon))
    return (y * gamma.reshape(shape) + beta.reshape(shape)).astype(x.dtype, copy=False)


register_op("nn.layer_norm", _layer_norm_infer, OpPattern.OPAQUE, _layer_norm_ref)

# ---------------------------------------------------------------------------------------------
# inference-only: batch_norm, dropout


_batch_norm_infer = _per_channel_infer(5, "statistics")


def _batch_norm_ref(x, gamma, beta, mean, var, epsilon: float, axis: int) -> np.ndarray:
    shape = (-1,) + (1,) * (x.ndim - axis % x.ndim - 1)
    t = x.dtype.type
    scale = (gamma / np.sqrt(var + t(epsilon))).reshape(shape)
    return ((x - mean.reshape(shape)) * scale + beta.reshape(shape)).astype(x.dtype, copy=False)


register_op("nn.batch_norm", _batch_norm_infer, OpPattern.OPAQUE, _batch_norm_ref)


def _dropout_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    if not 0.0 <= attrs["rate"] < 1.0 or math.isnan(attrs["rate"]):
        raise ShapeError(f"dropout rate {attrs['rate']} not in [0, 1)")
    return arg_types[0]


register_op("nn.dropout", _dropout_infer, OpPattern.OPAQUE, lambda x, rate: x.copy())
