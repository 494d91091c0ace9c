"""Neural-network computes: conv2d, conv2d_transpose, dense (plain and packed), matmul, pooling, softmax, LRN,
layer_norm (NCHW / OIHW layouts).

Formulas follow the ONNX operator specs (Conv, Gemm, MatMul, MaxPool, AveragePool, Softmax, LRN)
and TVM's topi/nn; padding is an explicit "pad" stage so schedules can materialize it.
"""

from __future__ import annotations

from kiln import arith
from kiln.tir import te
from kiln.tir import loop as L
from kiln.topi.registry import register_compute
from kiln.topi.dims import dim_value


def pad_hw(data: te.Tensor, padding: tuple[int, int, int, int], value: float = 0.0,
           tag: str = "pad") -> te.Tensor:
    """Pad axes 2 and 3 (H, W) of an NCHW or NCHWc tensor by (top, left, bottom, right)."""
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
    """``out[n, o, y, x] = sum over c, ky, kx of data[n, c, iy, ix] * weight[c, o % O/g, ky, kx]``
    over the taps where ``y + pad_top = iy * sh + ky * dh`` (and the same for columns).

    Without dilation, output row ``y`` has phase ``p = (y + pad_top) % sh`` and only kernel rows
    ``ky = p + sh * j`` land on it, from input row ``(y + pad_top) // sh - j``. The reduction
    runs per phase (the sub-pixel view of a transposed convolution) into
    ``[N, O, sh, sw, ceil((OH + pad_top) / sh), ceil((OW + pad_left) / sw)]``, whose rows read
    contiguous input rows, and the output gathers from it: a stride-2 2×2 kernel does one tap
    per output, not four masked ones. With dilation every tap is tested
    (:func:`_conv2d_transpose_dilated`).
    Indices are clamped so that masked taps load in bounds.
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
    data, weight = inputs
    k = te.reduce_axis(data.shape[1], "k")
    return te.compute(out_type.shape,
                      lambda i, j: te.sum(data[i, k.var] * weight[j, k.var], [k]),
                      name="dense", tag="dense")


@register_compute("nn.dense_pack")
def dense_pack(inputs, attrs, out_type):
    """``out[i, j] = sum_k data[i, k] * weight[j // b, k, j % b]`` (weight ``[N/b, K, b]``)."""
    data, weight = inputs
    k = te.reduce_axis(data.shape[1], "k")
    b = weight.shape[2]
    return te.compute(out_type.shape,
                      lambda i, j: te.sum(data[i, k.var] * weight[j // b, k.var, j % b], [k]),
                      name="dense_pack", tag="dense_pack")


@register_compute("nn.matmul")
def matmul(inputs, attrs, out_type):
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
    total, count = _global_pool(inputs, "sum")
    divisor = dim_value(count, total.dtype)
    return te.compute(out_type.shape, lambda *i: total[i] / divisor,
                      name="global_avg_pool2d", tag="elemwise")


@register_compute("nn.global_max_pool2d")
def global_max_pool2d(inputs, attrs, out_type):
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
    """Two passes over ``axis``: the mean, then the variance of the centered values (more
    accurate than E[x²] - E[x]² for inputs with a large mean); ``y = (x - mean) /
    sqrt(var + epsilon) * gamma + beta``."""
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
