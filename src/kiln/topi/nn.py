"""Neural-network computes: conv2d, conv2d_transpose, dense (plain and packed), matmul,
pooling, softmax, LRN, layer_norm (NCHW / OIHW layouts).

Formulas follow the ONNX operator specs (Conv, Gemm, MatMul, MaxPool, AveragePool, Softmax, LRN)
and TVM's topi/nn; padding is an explicit "pad" stage so schedules can materialize it.
"""

from __future__ import annotations

from kiln import arith
from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.dims import dim_value
from kiln.topi.registry import register_compute


def pad_hw(data: te.Tensor, padding: tuple[int, int, int, int], value: float = 0.0,
           tag: str = "pad") -> te.Tensor:
    """Pad axes 2 and 3 (H, W) of an NCHW or NCHWc tensor by (top, left, bottom, right).

    Parameters
    ----------
    data : te.Tensor
        4-D [batch, channel, height, width] (NCHW) or 5-D [.., width, block] (NCHW{b}c).
    padding : tuple of int
        ``(pad_top, pad_left, pad_bottom, pad_right)``, in pixels, each >= 0.
    value, tag
        The padding's value (a zero point for integer convs); the stage's tag (``"pad"``: the
        conv schedules materialize it).

    Returns
    -------
    te.Tensor
        ``data`` itself without padding; else [batch, channel, height + pad_top + pad_bottom,
        width + pad_left + pad_right(, block)], data's dtype.
    """
    pt, pl, pb, pr = padding
    if not any(padding):
        return data
    h, w = data.shape[2], data.shape[3]
    shape = data.shape[:2] + (h + pt + pb, w + pl + pr) + data.shape[4:]

    def body(n, c, y, x, *rest):
        inside = L.logical_and(y >= pt, y < h + pt, x >= pl, x < w + pl)
        return L.Select(inside, data[(n, c, y - pt, x - pl, *rest)], L.const(value, data.dtype))

    return te.compute(shape, body, name="pad", tag=tag)


@register_compute("nn.conv2d")
def conv2d(inputs, attrs, out_type):
    """2-D convolution, NCHW data and OIHW weight, any groups (ONNX Conv).

    ``out[n, o, y, x] = Σ_{rc, ry, rx} pad(data)[n, g·(C/G) + rc, y·stride_h + ry·dilation_h,
    x·stride_w + rx·dilation_w] · weight[o, rc, ry, rx]`` with ``g = o // (O/G)``. TVM's
    ``python/tvm/topi/nn/conv2d.py`` (``conv2d_nchw``, ``group_conv2d_nchw``); padding is a
    ``pad`` stage (:func:`pad_hw`). Sums accumulate in data's dtype.

    Parameters
    ----------
    data : te.Tensor
        4-D, [batch, in_channel, in_height, in_width] (NCHW), float32, or int32 (integer convs
        on widened operands, docs/decisions/011).
    weight : te.Tensor
        4-D, [out_channel, in_channel // groups, kernel_h, kernel_w] (OIHW), data's dtype.
    strides, padding, dilation : tuple of int
        attrs, in input pixels: ``(stride_h, stride_w)``; ``(pad_top, pad_left, pad_bottom,
        pad_right)``; ``(dilation_h, dilation_w)``.
    groups : int
        attrs: ONNX ``group``; in_channel and out_channel are multiples of it.

    Returns
    -------
    te.Tensor
        4-D, [batch, out_channel, out_height, out_width], data's dtype, tag ``conv2d``;
        ``out_height = (in_height + pad_top + pad_bottom - dilation_h * (kernel_h - 1) - 1)
        // stride_h + 1``, out_width likewise.
    """
    data, weight = inputs
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    groups = attrs["groups"]
    out_c, in_per_group, kh, kw = weight.shape
    out_per_group = out_c // groups
    padded = pad_hw(data, attrs["padding"])
    rc, ry, rx = te.reduce_axis(in_per_group, "rc"), te.reduce_axis(kh, "ry"), \
        te.reduce_axis(kw, "rx")

    def body(n, o, y, x):
        c = (o // out_per_group) * in_per_group + rc.var if groups > 1 else rc.var
        return te.sum(padded[n, c, y * sh + ry.var * dh, x * sw + rx.var * dw]
                      * weight[o, rc.var, ry.var, rx.var], [rc, ry, rx])

    return te.compute(out_type.shape, body, name="conv2d", tag="conv2d")


@register_compute("nn.conv2d_transpose")
def conv2d_transpose(inputs, attrs, out_type):
    """2-D transposed convolution, NCHW data and IOHW weight (ONNX ConvTranspose).

    ``out[n, o, y, x] = Σ_{c, ky, kx} data[n, c, iy, ix] · weight[c, o % (O/G), ky, kx]`` over
    ``c`` in o's group and the taps where ``y + pad_top = iy·stride_h + ky·dilation_h`` (columns
    likewise). Without dilation, output row ``y`` has phase ``p = (y + pad_top) % stride_h`` and
    only kernel rows ``ky = p + stride_h·j`` land on it, from input row ``(y + pad_top) //
    stride_h - j``: the reduction runs per phase (the sub-pixel view, Shi et al. 2016, "Is the
    deconvolution layer the same as a convolutional layer?") into ``[N, O, stride_h, stride_w,
    ceil((OH + pad_top) / stride_h), ceil((OW + pad_left) / stride_w)]`` (tag
    ``conv2d_transpose``), which the output gathers (tag ``injective``): a stride-2 2×2 kernel
    does one tap per output, not four masked ones. With dilation every tap is tested
    (:func:`_conv2d_transpose_dilated`). Input indices are clamped for the masked taps.

    Parameters
    ----------
    data : te.Tensor
        4-D, [batch, in_channel, in_height, in_width] (NCHW), float.
    weight : te.Tensor
        4-D, [in_channel, out_channel // groups, kernel_h, kernel_w] (IOHW), data's dtype.
    strides, padding, dilation, groups
        attrs, as :func:`conv2d`'s (``output_padding`` only enters ``out_type``).

    Returns
    -------
    te.Tensor
        4-D, [batch, out_channel, out_height, out_width] (``out_type.shape``), data's dtype;
        ``out_height = (in_height - 1) * stride_h + (kernel_h - 1) * dilation_h + 1 +
        output_padding_h - pad_top - pad_bottom``.
    """
    data, weight = inputs
    if tuple(attrs["dilation"]) != (1, 1):
        return _conv2d_transpose_dilated(data, weight, attrs, out_type)
    sh, sw = attrs["strides"]
    pt, pl = attrs["padding"][:2]
    groups = attrs["groups"]
    n, in_c, h, w = data.shape
    _, out_per_group, kh, kw = weight.shape
    out_c, oh, ow = out_type.shape[1:]
    in_per_group = in_c // groups
    rc = te.reduce_axis(in_per_group, "rc")
    ry, rx = te.reduce_axis(-(-kh // sh), "ry"), te.reduce_axis(-(-kw // sw), "rx")
    rows, cols = -(-(oh + pt) // sh), -(-(ow + pl) // sw)

    def tap(phase, q, j, k: int, stride: int, extent: arith.Dim):
        kidx = phase + j * stride
        src = q - j
        conds = [src >= 0, src < extent] + ([kidx < k] if k % stride else [])
        return conds, kidx, L.minimum(L.maximum(src, 0), te.dim_expr(extent - 1))

    def phases(b, o, py, px, qy, qx):
        cy, ky, iy = tap(py, qy, ry.var, kh, sh, h)
        cx, kx, ix = tap(px, qx, rx.var, kw, sw, w)
        c = (o // out_per_group) * in_per_group + rc.var if groups > 1 else rc.var
        value = data[b, c, iy, ix] * weight[c, o % out_per_group, ky, kx]
        return te.sum(L.Select(L.logical_and(*cy, *cx), value, L.const(0, data.dtype)),
                      [rc, ry, rx])

    per_phase = te.compute((n, out_c, sh, sw, rows, cols), phases,
                           name="conv2d_transpose", tag="conv2d_transpose")
    return te.compute(out_type.shape, lambda b, o, y, x: per_phase[
        b, o, (y + pt) % sh, (x + pl) % sw, (y + pt) // sh, (x + pl) // sw],
        name="conv2d_transpose_interleave", tag="injective")


def _conv2d_transpose_dilated(data, weight, attrs, out_type):
    """Every tap, masked where ``y + pad_top - ky * dh`` is not a multiple of the stride."""
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl = attrs["padding"][:2]
    groups = attrs["groups"]
    _, in_c, h, w = data.shape
    _, out_per_group, kh, kw = weight.shape
    in_per_group = in_c // groups
    rc, ry, rx = (te.reduce_axis(in_per_group, "rc"), te.reduce_axis(kh, "ry"),
                  te.reduce_axis(kw, "rx"))

    def tap(pos, pad: int, k, dil: int, stride: int, extent: arith.Dim):
        t = pos + pad - k * dil
        src = t // stride
        return [t >= 0, L.eq(t % stride, 0), src < extent], L.minimum(
            L.maximum(src, 0), te.dim_expr(extent - 1))

    def body(n, o, y, x):
        cy, iy = tap(y, pt, ry.var, dh, sh, h)
        cx, ix = tap(x, pl, rx.var, dw, sw, w)
        c = (o // out_per_group) * in_per_group + rc.var if groups > 1 else rc.var
        value = data[n, c, iy, ix] * weight[c, o % out_per_group, ry.var, rx.var]
        return te.sum(L.Select(L.logical_and(*cy, *cx), value, L.const(0, data.dtype)),
                      [rc, ry, rx])

    return te.compute(out_type.shape, body, name="conv2d_transpose", tag="conv2d_transpose")


@register_compute("nn.dense")
def dense(inputs, attrs, out_type):
    """``out[i, j] = Σ_k data[i, k] · weight[j, k]`` (ONNX Gemm with transB; TVM's topi.nn.dense).

    Parameters
    ----------
    data, weight : te.Tensor
        2-D, [M, K] and [N, K], of one dtype.

    Returns
    -------
    te.Tensor
        2-D, [M, N], data's dtype; tag ``dense``.
    """
    data, weight = inputs
    k = te.reduce_axis(data.shape[1], "k")
    return te.compute(out_type.shape,
                      lambda i, j: te.sum(data[i, k.var] * weight[j, k.var], [k]),
                      name="dense", tag="dense")


@register_compute("nn.dense_pack")
def dense_pack(inputs, attrs, out_type):
    """``out[i, j] = Σ_k data[i, k] · weight[j // b, k, j % b]`` (weight packed at compile time).

    TVM's ``python/tvm/topi/x86/dense.py`` ``dense_pack`` layout (``NK{b}n``,
    :func:`kiln.relay.op.nn.pack_dense_weight`; docs/decisions/003).

    Parameters
    ----------
    data : te.Tensor
        2-D, [M, K].
    weight : te.Tensor
        3-D, [N // b, K, b], data's dtype.

    Returns
    -------
    te.Tensor
        2-D, [M, N] with ``N = weight.shape[0] * b``, data's dtype; tag ``dense_pack``.
    """
    data, weight = inputs
    k = te.reduce_axis(data.shape[1], "k")
    b = weight.shape[2]
    return te.compute(out_type.shape,
                      lambda i, j: te.sum(data[i, k.var] * weight[j // b, k.var, j % b], [k]),
                      name="dense_pack", tag="dense_pack")


@register_compute("nn.matmul")
def matmul(inputs, attrs, out_type):
    """ONNX MatMul (numpy ``matmul``) of operands of rank >= 2, batch dims broadcast.

    ``out[*batch, i, j] = Σ_k a[*batch_a, i, k] · b[*batch_b, k, j]``, each operand's batch
    index aligned right and read at 0 along its size-1 dims.

    Parameters
    ----------
    a : te.Tensor
        [*batch_a, M, K].
    b : te.Tensor
        [*batch_b, K, N], a's dtype.

    Returns
    -------
    te.Tensor
        [*broadcast(batch_a, batch_b), M, N] (``out_type.shape``), a's dtype; tag ``matmul``.
    """
    a, b = inputs
    k = te.reduce_axis(a.shape[-1], "k")
    nbatch = len(out_type.shape) - 2

    def operand_index(t: te.Tensor, batch: tuple, last2: tuple) -> tuple:
        offset = nbatch - (len(t.shape) - 2)
        lead = tuple(L.IntImm(0) if t.shape[d] == 1 else batch[offset + d]
                     for d in range(len(t.shape) - 2))
        return lead + last2

    def body(*idx):
        batch, i, j = idx[:-2], idx[-2], idx[-1]
        return te.sum(a[operand_index(a, batch, (i, k.var))]
                      * b[operand_index(b, batch, (k.var, j))], [k])

    return te.compute(out_type.shape, body, name="matmul", tag="matmul")


def _pool_window(attrs):
    kh, kw = attrs["pool_size"]
    sh, sw = attrs["strides"]
    dh, dw = attrs.get("dilation", (1, 1))
    return kh, kw, sh, sw, dh, dw


@register_compute("nn.max_pool2d")
def max_pool2d(inputs, attrs, out_type):
    """ONNX MaxPool over H and W: the maximum of each (dilated) window, padding excluded.

    Taps in the padding (or past the input: ``ceil_mode``) read the dtype's lowest value.

    Parameters
    ----------
    data : te.Tensor
        4-D, [batch, channel, in_height, in_width] (NCHW), or 5-D NCHW{b}c
        [batch, channel // b, in_height, in_width, b] (``layout`` attr).
    pool_size, strides, dilation, padding : tuple of int
        attrs, in pixels: ``(kernel_h, kernel_w)``, ``(stride_h, stride_w)``, ``(dilation_h,
        dilation_w)`` (default (1, 1)), ``(pad_top, pad_left, pad_bottom, pad_right)``.

    Returns
    -------
    te.Tensor
        [batch, data.shape[1], out_height, out_width(, b)] (``out_type.shape``), data's
        dtype, tag ``pool``; :func:`kiln.relay.op.nn.pool_output_size`: ``(in_height + pad_top +
        pad_bottom - dilation_h * (kernel_h - 1) - 1) // stride_h + 1`` (``ceil_mode``: rounded
        up, less a last window that would start in the bottom padding).
    """
    (data,) = inputs
    kh, kw, sh, sw, dh, dw = _pool_window(attrs)
    pt, pl, _, _ = attrs["padding"]
    h, w = data.shape[2:4]
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    lowest = te.lowest(data.dtype)

    def body(n, c, y, x, *block):  # block: the channel-in-block axis of NCHW{b}c
        iy = y * sh + ry.var * dh - pt
        ix = x * sw + rx.var * dw - pl
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < w)
        value = L.Select(inside, data[(n, c, iy, ix, *block)], L.const(lowest, data.dtype))
        return te.max_reduce(value, [ry, rx])

    return te.compute(out_type.shape, body, name="max_pool2d", tag="pool")


@register_compute("nn.avg_pool2d")
def avg_pool2d(inputs, attrs, out_type):
    """ONNX AveragePool over H and W: each window's sum over the taps it counts.

    The sum (stage ``pool_sum``, tag ``pool``) over the taps inside the input, divided (stage
    ``avg_pool2d``, tag ``elemwise``) by the taps inside the padded input when
    ``count_include_pad``, inside the input otherwise; taps of ``ceil_mode``'s extension never
    count (onnxruntime's rule).

    Parameters
    ----------
    data : te.Tensor
        As :func:`max_pool2d`'s, float.
    pool_size, strides, dilation, padding, count_include_pad
        attrs, as :func:`max_pool2d`'s; whether padding taps count in the divisor.

    Returns
    -------
    te.Tensor
        As :func:`max_pool2d`'s (tag ``elemwise``).
    """
    (data,) = inputs
    kh, kw, sh, sw, dh, dw = _pool_window(attrs)
    pt, pl, pb, pr = attrs["padding"]
    h, w = data.shape[2:4]
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

    def body(n, c, y, x, *block):
        iy, ix = y * sh + ry.var * dh - pt, x * sw + rx.var * dw - pl
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < w)
        return te.sum(L.Select(inside, data[(n, c, iy, ix, *block)], L.const(0, data.dtype)),
                      [ry, rx])

    total = te.compute(out_type.shape, body, name="pool_sum", tag="pool")
    include_pad = attrs["count_include_pad"]

    def window(start: L.PrimExpr, k: int, d: int, size: arith.Dim, pad_begin: int,
               pad_end: int) -> L.PrimExpr:
        # ONNX / onnxruntime: the taps counted are those inside the padded input when padding
        # counts, inside the real input otherwise (ceil_mode's extension never counts).
        lo, hi = (-pad_begin, size + pad_end) if include_pad else (0, size)
        if d == 1:
            return L.minimum(start + k, te.dim_expr(hi)) - L.maximum(start, L.IntImm(lo))
        # taps start + t*d, t in [0, k): the first t with start + t*d >= lo is
        # ceil((lo - start) / d), the last with start + t*d < hi is floor((hi - 1 - start) / d)
        first = L.maximum(L.IntImm(0) - (start - lo) // d, L.IntImm(0))
        last = L.minimum((te.dim_expr(hi - 1) - start) // d, L.IntImm(k - 1))
        return L.maximum(last - first + 1, L.IntImm(0))

    def avg(n, c, y, x, *block):
        count = window(y * sh - pt, kh, dh, h, pt, pb) * window(x * sw - pl, kw, dw, w, pl, pr)
        return total[(n, c, y, x, *block)] / L.Cast(data.dtype, count)

    return te.compute(out_type.shape, avg, name="avg_pool2d", tag="elemwise")


def _global_pool(inputs, combiner: str):
    (data,) = inputs
    n, c, h, w = data.shape[:4]
    ry, rx = te.reduce_axis(h, "ry"), te.reduce_axis(w, "rx")
    reducer = te.sum if combiner == "sum" else te.max_reduce

    def body(i, j, y, x, *block):
        return reducer(data[(i, j, ry.var, rx.var, *block)], [ry, rx])

    shape = (n, c, 1, 1, *data.shape[4:])
    return te.compute(shape, body, name=f"global_{combiner}", tag="pool"), h * w


@register_compute("nn.global_avg_pool2d")
def global_avg_pool2d(inputs, attrs, out_type):
    """ONNX GlobalAveragePool: the mean over H and W (a ``pool`` sum, then ``elemwise`` / H·W).

    Parameters
    ----------
    data : te.Tensor
        4-D NCHW [batch, channel, height, width] or 5-D NCHW{b}c [.., width, b], float.

    Returns
    -------
    te.Tensor
        [batch, data.shape[1], 1, 1(, b)], data's dtype.
    """
    total, count = _global_pool(inputs, "sum")
    divisor = dim_value(count, total.dtype)
    return te.compute(out_type.shape, lambda *i: total[i] / divisor,
                      name="global_avg_pool2d", tag="elemwise")


@register_compute("nn.global_max_pool2d")
def global_max_pool2d(inputs, attrs, out_type):
    """ONNX GlobalMaxPool: the maximum over H and W.

    Parameters
    ----------
    data : te.Tensor
        As :func:`global_avg_pool2d`'s (any dtype).

    Returns
    -------
    te.Tensor
        [batch, data.shape[1], 1, 1(, b)], data's dtype; tag ``pool``.
    """
    return _global_pool(inputs, "max")[0]


def _axis_reduce(x: te.Tensor, axis: int, combiner: str, fn=None) -> te.Tensor:
    """Reduce ``fn(x)`` along ``axis`` keeping it as size 1."""
    r = te.reduce_axis(x.shape[axis], "r")
    shape = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    reducer = te.sum if combiner == "sum" else te.max_reduce

    def body(*i):
        src = x[i[:axis] + (r.var,) + i[axis + 1:]]
        return reducer(fn(src) if fn else src, [r])

    return te.compute(shape, body, name=f"{combiner}_axis", tag="reduce")


def _at_axis0(i: tuple, axis: int) -> tuple:
    return i[:axis] + (L.IntImm(0),) + i[axis + 1:]


@register_compute("nn.softmax")
def softmax(inputs, attrs, out_type):
    """ONNX Softmax (opset 13, one axis): ``exp(x - max) · (1 / Σ exp(x - max))`` along ``axis``.

    Stages: row max (``reduce``), exp (tag ``softmax_exp``: fused row by row), row sum, the
    output (``elemwise``: times the row's reciprocal, as MLAS; within 1 ulp of ``e / s``).

    Parameters
    ----------
    x : te.Tensor
        Any rank, float.
    axis : int
        attrs: the normalized axis (negative: from the end).

    Returns
    -------
    te.Tensor
        x's shape and dtype; tag ``elemwise``.
    """
    (x,) = inputs
    axis = attrs["axis"] % len(x.shape)
    m = _axis_reduce(x, axis, "max")
    e = te.compute(x.shape, lambda *i: L.call("exp", x[i] - m[_at_axis0(i, axis)]),
                   name="softmax_exp", tag="softmax_exp")
    s = _axis_reduce(e, axis, "sum")
    # times the row's reciprocal (one division a row, as MLAS): within 1 ulp of e / s
    one = L.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: e[i] * (one / s[_at_axis0(i, axis)]), name="softmax",
                      tag="elemwise")


@register_compute("nn.log_softmax")
def log_softmax(inputs, attrs, out_type):
    """ONNX LogSoftmax: ``(x - max) - log(Σ exp(x - max))`` along ``axis``.

    Parameters
    ----------
    x : te.Tensor
        Any rank, float.
    axis : int
        attrs: the normalized axis.

    Returns
    -------
    te.Tensor
        x's shape and dtype; tag ``elemwise`` (the shifted stage: ``softmax_exp``).
    """
    (x,) = inputs
    axis = attrs["axis"] % len(x.shape)
    m = _axis_reduce(x, axis, "max")
    shifted = te.compute(x.shape, lambda *i: x[i] - m[_at_axis0(i, axis)],
                         name="log_softmax_shift", tag="softmax_exp")
    s = _axis_reduce(shifted, axis, "sum", lambda v: L.call("exp", v))
    return te.compute(x.shape, lambda *i: shifted[i] - L.call("log", s[_at_axis0(i, axis)]),
                      name="log_softmax", tag="elemwise")


@register_compute("nn.lrn")
def lrn(inputs, attrs, out_type):
    """ONNX LRN: ``x / (bias + alpha / size · Σ x²)^beta`` over a window of ``size`` channels.

    The window of channel ``c`` is ``[c - (size - 1) // 2, c + size - 1 - (size - 1) // 2]``,
    clipped to the axis (stage ``lrn_sqsum``, tag ``reduce``).

    Parameters
    ----------
    x : te.Tensor
        Any rank (NCHW: ``axis`` 1), float.
    size, axis : int
        attrs: the window, in channels; the channel axis.
    alpha, beta, bias : float
        attrs: ONNX's ``alpha``, ``beta``, ``bias``.

    Returns
    -------
    te.Tensor
        x's shape and dtype; tag ``elemwise``.
    """
    (x,) = inputs
    size, axis = attrs["size"], attrs["axis"] % len(x.shape)
    alpha, beta, bias = attrs["alpha"], attrs["beta"], attrs["bias"]
    r = te.reduce_axis(size, "r")
    extent = x.shape[axis]

    def square_sum(*i):
        c = i[axis] - (size - 1) // 2 + r.var
        v = x[i[:axis] + (c,) + i[axis + 1:]]
        return te.sum(L.Select(L.logical_and(c >= 0, c < extent), v * v,
                               L.const(0, x.dtype)), [r])

    sq = te.compute(x.shape, square_sum, name="lrn_sqsum", tag="reduce")
    return te.compute(x.shape, lambda *i: x[i] / L.call(
        "pow", sq[i] * (alpha / size) + bias, L.const(beta, x.dtype)), name="lrn", tag="elemwise")


@register_compute("nn.layer_norm")
def layer_norm(inputs, attrs, out_type):
    """TVM's ``nn.layer_norm`` along one axis: ``(x - mean) / sqrt(var + epsilon) · gamma + beta``.

    Two passes over ``axis``: the mean, then the variance of the centered values (more accurate
    than E[x²] - E[x]² for inputs with a large mean). Stages: the sum (``reduce``), the sum of
    squared deviations (tag ``layer_norm_sqsum``: the schedule fuses the rows), the output.

    Parameters
    ----------
    x : te.Tensor
        Any rank ([batch, seq, hidden] with ``axis`` -1), float.
    gamma, beta : te.Tensor
        1-D, [x.shape[axis]], x's dtype: the scale and the shift.
    axis, epsilon
        attrs: the normalized axis (one axis, not ONNX's ``axis``-to-last); added to the
        variance.

    Returns
    -------
    te.Tensor
        x's shape and dtype; tag ``elemwise``.
    """
    x, gamma, beta = inputs
    axis = attrs["axis"] % len(x.shape)
    count = dim_value(x.shape[axis], x.dtype)
    total = _axis_reduce(x, axis, "sum")
    r = te.reduce_axis(x.shape[axis], "r")

    def centered(i: tuple) -> L.PrimExpr:
        return x[i] - total[_at_axis0(i, axis)] / count

    def square_sum(*i):
        d = centered(i[:axis] + (r.var,) + i[axis + 1:])
        return te.sum(d * d, [r])

    sq = te.compute(total.shape, square_sum, name="layer_norm_sqsum", tag="layer_norm_sqsum")
    eps = attrs["epsilon"]

    def body(*i):
        inv = L.call("sqrt", sq[_at_axis0(i, axis)] / count + eps)
        return centered(i) / inv * gamma[i[axis]] + beta[i[axis]]

    return te.compute(x.shape, body, name="layer_norm", tag="elemwise")
