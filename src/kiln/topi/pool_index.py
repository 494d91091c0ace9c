"""The nn.max_pool2d_indices compute: the window maxima, then the first tap in scan order that
equals its window's maximum, as a flat input index (see :mod:`kiln.relay.op.pool_index`)."""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.nn import max_pool2d
from kiln.topi.registry import register_compute


@register_compute("nn.max_pool2d_indices")
def max_pool2d_indices(inputs, attrs, out_type):
    """ONNX MaxPool's second output: the flat input index of each window's first maximum.

    The window maxima (:func:`kiln.topi.nn.max_pool2d`), then per window the least key
    ``tap · size + flat`` over the taps inside the input that equal the maximum (stage
    ``max_pool_first``, tag ``reduce``; ``size`` = the input's element count, taps in scan
    order: rows, then columns), then ``key % size``.

    Parameters
    ----------
    data : te.Tensor
        4-D, [batch, channel, in_height, in_width] (NCHW only).
    pool_size, strides, dilation, padding
        attrs, as :func:`kiln.topi.nn.max_pool2d`'s.
    storage_order : int
        attrs: 0 row major, ``((n·C + c)·H + h)·W + w``; 1 column major, ``((n·C + c)·W + w)·H
        + h``.

    Returns
    -------
    te.Tensor
        [batch, channel, out_height, out_width] as the pool's (``out_type.shape``), int64; tag
        ``elemwise``.
    """
    (data,) = inputs
    maxima = max_pool2d(inputs, attrs, out_type)
    _, c, h, w = data.shape
    size = data.shape[0] * c * h * w  # flat indices are below it: key = tap * size + flat
    kh, kw = attrs["pool_size"]
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl = attrs["padding"][:2]
    tap = te.reduce_axis(kh * kw, "tap")  # scan order: rows, then columns

    def body(n, ch, y, x):
        iy = y * sh + (tap.var // kw) * dh - pt
        ix = x * sw + (tap.var % kw) * dw - pl
        inside = L.logical_and(iy >= 0, iy < h, ix >= 0, ix < w)
        safe_y = L.minimum(L.maximum(iy, L.IntImm(0)), L.IntImm(h - 1))
        safe_x = L.minimum(L.maximum(ix, L.IntImm(0)), L.IntImm(w - 1))
        hit = L.logical_and(inside, L.eq(data[n, ch, safe_y, safe_x], maxima[n, ch, y, x]))
        base = n * c + ch
        flat = (base * h + iy) * w + ix if attrs["storage_order"] == 0 else \
            (base * w + ix) * h + iy
        # the first hit in scan order: the smallest tap, then its flat index
        return te.min_reduce(L.Select(hit, tap.var * size + flat, L.IntImm(2**62)), [tap])

    first = te.compute(out_type.shape, body, name="max_pool_first", tag="reduce")
    return te.compute(out_type.shape, lambda *i: first[i] % size,
                      name="max_pool2d_indices", tag="elemwise")
