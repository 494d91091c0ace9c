"""Blocked-channel (NCHWc) computes: ``layout_transform``, ``nn.conv2d_NCHWc`` and
``nn.depthwise_conv2d_NCHWc`` (TVM: topi/x86/conv2d_NCHWc, topi/nn/depthwise_conv2d).

The innermost axis of data, weight and output is a block of channels, so a schedule can keep a
row of output pixels × one channel block in vector registers and update it with one weight
vector per input channel (``kiln.schedules.nn_cpu``).
"""

from __future__ import annotations

from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.layout import Layout
from kiln.ir.op_registry import register_compute
from kiln.ops.nn import pad_hw


@register_compute("layout_transform")
def layout_transform(inputs, attrs, out_type):
    (x,) = inputs
    src, dst = Layout.parse(attrs["src_layout"]), Layout.parse(attrs["dst_layout"])
    return te.compute(out_type.shape, lambda *i: x[src.index(dst.primal_index(i))],
                      name="layout_transform", tag="injective")


def _padded_window(data: te.Tensor, attrs):
    """The padded input and ``at(y, x, ry, rx) -> (row, col)`` of a kernel tap in it."""
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]

    def at(y, x, ry, rx):
        return y * sh + ry * dh, x * sw + rx * dw

    return pad_hw(data, attrs["padding"]), at


@register_compute("nn.conv2d_NCHWc")
def conv2d_nchwc(inputs, attrs, out_type):
    data, weight = inputs
    padded, at = _padded_window(data, attrs)
    _, icc, kh, kw, ib, _ = weight.shape
    rc, ry, rx, ri = (te.reduce_axis(icc, "rc"), te.reduce_axis(kh, "ry"),
                      te.reduce_axis(kw, "rx"), te.reduce_axis(ib, "ri"))

    nchw = len(data.shape) == 4  # input block 1: NCHW data is NCHW1c

    def body(n, o, y, x, b):
        lane = () if nchw else (ri.var,)
        return te.sum(padded[(n, rc.var, *at(y, x, ry.var, rx.var), *lane)]
                      * weight[o, rc.var, ry.var, rx.var, ri.var, b], [rc, ry, rx, ri])

    return te.compute(out_type.shape, body, name="conv2d_NCHWc", tag="conv2d_NCHWc")


@register_compute("nn.depthwise_conv2d_NCHWc")
def depthwise_conv2d_nchwc(inputs, attrs, out_type):
    data, weight = inputs
    padded, at = _padded_window(data, attrs)
    kh, kw = weight.shape[2], weight.shape[3]
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    zero = L.IntImm(0)

    def body(n, c, y, x, b):
        return te.sum(padded[(n, c, *at(y, x, ry.var, rx.var), b)]
                      * weight[c, zero, ry.var, rx.var, zero, b], [ry, rx])

    return te.compute(out_type.shape, body, name="depthwise_conv2d_NCHWc",
                      tag="depthwise_conv2d_NCHWc")
