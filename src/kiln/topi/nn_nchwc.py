"""Blocked-channel (NCHWc) computes: ``layout_transform``, ``nn.conv2d_NCHWc`` and
``nn.depthwise_conv2d_NCHWc`` (TVM: topi/x86/conv2d_NCHWc, topi/nn/depthwise_conv2d).

The innermost axis of data, weight and output is a block of channels, so a schedule can keep a
row of output pixels × one channel block in vector registers and update it with one weight
vector per input channel (``kiln.schedules.nn_cpu``).
"""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.layout import Layout
from kiln.topi.nn import pad_hw
from kiln.topi.registry import register_compute


@register_compute("layout_transform")
def layout_transform(inputs, attrs, out_type):
    """The same tensor in another layout: ``out[i] = x[src.index(dst.primal_index(i))]``.

    TVM's ``relay.layout_transform`` (layouts as :class:`kiln.tir.layout.Layout`: ``NCHW``,
    ``NCHW16c``, ``OIHW16i16o``...). An ``NCHW{b}c`` → ``NCHW`` transform of static channels gets
    tag ``layout_unblock`` and ``out.block = b`` (:func:`_unblock_factor`); others ``injective``.

    Parameters
    ----------
    x : te.Tensor
        In ``src_layout``, any dtype.
    src_layout, dst_layout : str
        attrs: layout names over the same primal axes; a blocked axis's extent is a multiple
        of its block.

    Returns
    -------
    te.Tensor
        ``dst_layout``'s shape of x's primal extents (``out_type.shape``; NCHW [N, C, H, W] →
        NCHW{b}c [N, C // b, H, W, b]), x's dtype.

    Raises
    ------
    CompileError
        From :meth:`Layout.parse`: a malformed layout name.
    """
    (x,) = inputs
    src, dst = Layout.parse(attrs["src_layout"]), Layout.parse(attrs["dst_layout"])
    block = _unblock_factor(src, dst, out_type.shape)
    out = te.compute(out_type.shape, lambda *i: x[src.index(dst.primal_index(i))],
                     name="layout_transform", tag="injective" if block is None else
                     "layout_unblock")
    out.block = block
    return out


#: Whether NCHW{b}c → NCHW transforms take the ``layout_unblock`` schedule (for before / after
#: runs of benchmarks/fp32_conv.py).
SCHEDULE_UNBLOCK = True


def _unblock_factor(src: Layout, dst: Layout, shape) -> int | None:
    """The channel block ``b`` of an ``NCHW{b}c`` → ``NCHW`` transform of static channels
    (a multiple of ``b``), else None. Tag ``layout_unblock``: the schedule reads each blocked
    pixel once, storing its ``b`` channels to ``b`` output rows (``kiln.schedules.nn_cpu``)."""
    b = src.factor("C")
    if not SCHEDULE_UNBLOCK or dst.name != "NCHW" or src.name != f"NCHW{b}c" or not b \
            or not isinstance(shape[1], int) or shape[1] % b:
        return None
    return b


def _padded_window(data: te.Tensor, attrs):
    """The padded input and ``at(y, x, ry, rx) -> (row, col)`` of a kernel tap in it."""
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]

    def at(y, x, ry, rx):
        return y * sh + ry * dh, x * sw + rx * dw

    return pad_hw(data, attrs["padding"]), at


#: Whether a strided 1×1 conv reads a subsampled copy of its input (:func:`_subsampled`).
SUBSAMPLE_STRIDED_POINTWISE = True


def _subsampled(data: te.Tensor, attrs, kernel: tuple[int, int]):
    """A strided unpadded 1×1 conv's blocked input ``[N, C/ib, H, W, ib]`` subsampled to the
    pixels it reads, ``[N, C/ib, OH, OW, ib]`` (tag ``pad``: the conv schedule materializes it
    once, a vector copy a pixel), and the attrs of the stride-1 conv over it; else None.

    A stride-2 conv read every other 64-byte pixel of its input again for each output-channel
    block (half of each line the prefetcher fetched unused), and its register block's inputs
    through one pointer a pixel; over the copy, a quarter of the input, the reads are
    contiguous (one base pointer, constant offsets) and stay in L2 across channel blocks
    (onnxruntime's MLAS NCHWc convs take strided 1×1s through the same GEMM path only at
    stride 1). Per conv, 1 thread: docs/decisions/003."""
    sh, sw = attrs["strides"]
    if not SUBSAMPLE_STRIDED_POINTWISE or len(data.shape) != 5 or kernel != (1, 1) \
            or (sh, sw) == (1, 1) or any(attrs["padding"]):
        return None
    n_, c_, h, w, ib = data.shape
    if not all(isinstance(d, int) for d in (h, w)):
        return None  # symbolic planes keep the strided read (no copy of unknown size)
    shape = (n_, c_, (h - 1) // sh + 1, (w - 1) // sw + 1, ib)
    picked = te.compute(shape, lambda n, c, y, x, b: data[n, c, y * sh, x * sw, b],
                        name="subsample", tag="pad")
    return picked, {**attrs, "strides": (1, 1)}


@register_compute("nn.conv2d_NCHWc")
def conv2d_nchwc(inputs, attrs, out_type):
    """Blocked-channel 2-D convolution: NCHW{ib}c data, OIHW{ib}i{ob}o weight, any groups.

    ``out[n, o, y, x, b] = Σ_{rc, ry, rx, ri} pad(data)[n, rc, y·stride_h + ry·dilation_h,
    x·stride_w + rx·dilation_w, ri] · weight[o, rc, ry, rx, ri, b]``: TVM's
    ``python/tvm/topi/nn/conv2d.py`` ``conv2d_NCHWc``. A strided unpadded 1×1 conv first
    subsamples its input (stage ``subsample``, tag ``pad``: :func:`_subsampled`); padding is a
    ``pad`` stage. A grouped conv (attr ``groups`` > 1) has groups as the outer part of its
    output-channel blocks: block ``o`` belongs to group ``g = o // (O/ob/groups)`` and reduces
    over that group's ``C/groups`` input channels only (:func:`_group_channel`).

    Parameters
    ----------
    data : te.Tensor
        5-D, [batch, in_channel // ib, in_height, in_width, ib] (NCHW{ib}c), or 4-D NCHW
        (``ib = 1``: an image), float.
    weight : te.Tensor
        6-D, [out_channel // ob, in_channel // groups // ib, kernel_h, kernel_w, ib, ob],
        data's dtype; with groups, ob divides out_channel // groups, and the data's block is
        ib or a multiple of in_channel // groups (= ib).
    strides, padding, dilation, groups
        attrs, as :func:`kiln.topi.nn.conv2d`'s (``groups`` optional, default 1).

    Returns
    -------
    te.Tensor
        5-D, [batch, out_channel // ob, out_height, out_width, ob] (NCHW{ob}c), data's dtype,
        out_height as ``nn.conv2d``'s; tag ``conv2d_NCHWc``.
    """
    data, weight = inputs
    _, icc, kh, kw, ib, _ = weight.shape
    subsampled = _subsampled(data, attrs, (kh, kw))
    if subsampled is not None:
        data, attrs = subsampled
    padded, at = _padded_window(data, attrs)
    rc, ry, rx, ri = (te.reduce_axis(icc, "rc"), te.reduce_axis(kh, "ry"),
                      te.reduce_axis(kw, "rx"), te.reduce_axis(ib, "ri"))

    nchw = len(data.shape) == 4  # input block 1: NCHW data is NCHW1c
    groups = attrs.get("groups", 1)

    def body(n, o, y, x, b):
        if groups > 1:
            block, lane = _group_channel(o, rc.var, ri.var, weight.shape, data.shape[4], groups)
        else:
            block, lane = rc.var, (() if nchw else (ri.var,))
        return te.sum(padded[(n, block, *at(y, x, ry.var, rx.var), *lane)]
                      * weight[o, rc.var, ry.var, rx.var, ri.var, b], [rc, ry, rx, ri])

    return te.compute(out_type.shape, body, name="conv2d_NCHWc", tag="conv2d_NCHWc")


def _group_channel(o, rc, ri, weight_shape, data_block: int, groups: int):
    """(data block index, (lane,)) of input channel ``rc * ib + ri`` of output block ``o``'s
    group, in data blocked by ``data_block``: the group's own blocks when ``ib`` is the data
    block (``g * (C/groups/ib) + rc``), else — ``C/groups = ib`` channels, several groups a
    data block, as a 1×1 conv's 16- or 32-channel output feeding RegNet's 8-channel groups —
    a slice of one block (``g // per``, lane ``(g % per) * ib + ri``), so the producer's
    layout is read as it is (no layout transform between them)."""
    blocks, icc, ib = weight_shape[0], weight_shape[1], weight_shape[4]
    g = o // (blocks // groups)
    if data_block == ib:
        return g * icc + rc, (ri,)
    per = data_block // ib
    return g // per, ((g % per) * ib + ri,)


@register_compute("nn.depthwise_conv2d_NCHWc")
def depthwise_conv2d_nchwc(inputs, attrs, out_type):
    """Blocked-channel depthwise 2-D convolution (channel multiplier 1).

    ``out[n, c, y, x, b] = Σ_{ry, rx} pad(data)[n, c, y·stride_h + ry·dilation_h, x·stride_w +
    rx·dilation_w, b] · weight[c, 0, ry, rx, 0, b]``: TVM's
    ``python/tvm/topi/nn/depthwise_conv2d.py`` ``depthwise_conv2d_NCHWc``.

    Parameters
    ----------
    data : te.Tensor
        5-D, [batch, channel // b, in_height, in_width, b] (NCHW{b}c), float.
    weight : te.Tensor
        6-D, [channel // b, 1, kernel_h, kernel_w, 1, b], data's dtype.
    strides, padding, dilation
        attrs, as :func:`kiln.topi.nn.conv2d`'s.

    Returns
    -------
    te.Tensor
        5-D, [batch, channel // b, out_height, out_width, b], data's dtype; tag
        ``depthwise_conv2d_NCHWc``.
    """
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
