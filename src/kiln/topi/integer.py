"""Computes of the integer convolutions and dense ops (formulas on :mod:`kiln.relay.op.integer`;
docs/decisions/021).

Products are of an unsigned activation ``u`` in 0..255 (uint8 data as it is, int8 data
``x + 128`` written ``zext(uint8(x)) ^ 128``) and a signed int8 weight, summed exactly in int32;
the compensation ``u(zx) · Σ w`` (a constant per output channel) is subtracted in a second stage,
fused with the requantizing epilogue. The u8 × s8 form is what VNNI's ``vpdpbusd`` takes.

The one-byte form (``int32(u) · int32(w)`` per reduction step; layouts the quads below do not
cover) leaves the vectorization to LLVM's loop vectorizer (int8 loads are not lanes of the
explicit vector codegen): on x86 it turns the multiply of a zero-extended byte by a
sign-extended one into ``vpmaddwd`` (``combineMulToPMADDWD``), but the register block came out
partly scalar — about Kiln fp32's speed.

With quad-packed weights (int32 words of four int8 weights along the reduction) the activations
are first packed the same way, four unsigned bytes a word (stage ``qnn_quads``, materialized
once per call: tag ``pad`` for the conv schedule, which computes it at the root), and each
reduction step is one ``dot_u8i8x4`` of a broadcast activation word and a vector of weight
words: ``vpdpbusd`` with VNNI, two exact ``vpmaddwd`` on AVX2 (``kiln.codegen.llvm.vector``),
a quarter of the reduction steps of the one-byte form. Where the target has AVX2 and no VNNI
the dense and the NCHWc conv take the quads as 16-bit pair words instead, widened once per
call (stages ``qnn_pairs``, ``qnn_conv_pairs``; :func:`dense_pairs_form`).
"""

from __future__ import annotations

import numpy as np

from kiln.target import Target
from kiln.tir import intrin_int8 as loop_int8
from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.nn import pad_hw
from kiln.topi.registry import register_compute


def unsigned(x: L.PrimExpr) -> L.PrimExpr:
    """int32 ``u(x)``: ``x`` for uint8, ``x + 128`` for int8 (as ``zext(uint8(x)) ^ 128``).

    Parameters
    ----------
    x : PrimExpr
        A uint8 or int8 value (any other dtype is treated as int8's bit pattern).

    Returns
    -------
    PrimExpr
        int32, in 0..255.
    """
    if x.dtype == "uint8":
        return L.Cast("int32", x)
    return L.Binary("^", L.Cast("int32", L.Cast("uint8", x)), L.const(128, "int32"))


def _widen(w: L.PrimExpr) -> L.PrimExpr:
    return L.Cast("int32", w)


def _unsigned_word(values: list[L.PrimExpr]) -> L.PrimExpr:
    """int32 word of four unsigned bytes ``u(values[j])`` at bits ``8j`` (built in uint32,
    read as int32)."""
    word = None
    for j, v in enumerate(values):
        u = L.Cast("uint32", v if v.dtype == "uint8" else L.Cast("uint8", v))
        if v.dtype == "int8":
            u = L.Binary("^", u, L.const(128, "uint32"))
        if j:
            u = L.Binary("<<", u, L.const(8 * j, "uint32"))
        word = u if word is None else L.Binary("|", word, u)
    return L.reinterpret(word, "int32")


@register_compute("qnn.conv2d")
def conv2d(inputs, attrs, out_type):
    """``qnn.conv2d``: ``Σ (int32(x_pad) - zx) · int32(w)``, NCHW, any groups, exact in int32.

    TVM's ``qnn.conv2d`` after its canonicalization (``src/relay/qnn/op/convolution.cc``) with a
    zero weight zero point (ONNX ConvInteger / QLinearConv's core; docs/decisions/021).
    ``x_pad`` is padded with ``zx``, so padding contributes 0.

    Parameters
    ----------
    data : te.Tensor
        4-D, [batch, in_channel, in_height, in_width] (NCHW), uint8 or int8.
    weight : te.Tensor
        4-D, [out_channel, in_channel // groups, kernel_h, kernel_w] (OIHW), int8.
    strides, padding, dilation, groups
        attrs, as ``nn.conv2d``'s (:func:`kiln.topi.nn.conv2d`).
    input_zero_point : int
        attrs: ``zx``, the activation's zero point (in data's range).

    Returns
    -------
    te.Tensor
        [batch, out_channel, out_height, out_width], int32, out_height as ``nn.conv2d``'s; tag
        ``conv2d``.
    """
    data, weight = inputs
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    groups = attrs["groups"]
    zx = attrs["input_zero_point"]
    out_c, in_per_group, kh, kw = weight.shape
    out_per_group = out_c // groups
    padded = pad_hw(data, attrs["padding"], zx)
    rc, ry, rx = (te.reduce_axis(in_per_group, "rc"), te.reduce_axis(kh, "ry"),
                  te.reduce_axis(kw, "rx"))

    def body(n, o, y, x):
        c = (o // out_per_group) * in_per_group + rc.var if groups > 1 else rc.var
        value = L.Cast("int32", padded[n, c, y * sh + ry.var * dh, x * sw + rx.var * dw])
        return te.sum((value - L.const(zx, "int32")) * _widen(weight[o, rc.var, ry.var, rx.var]),
                      [rc, ry, rx])

    return te.compute(out_type.shape, body, name="qnn_conv2d", tag="conv2d")


@register_compute("qnn.conv2d_NCHWc")
def conv2d_nchwc(inputs, attrs, out_type):
    """``qnn.conv2d_NCHWc``: ``Σ u(x_pad) · w`` (tag ``conv2d_NCHWc``), then ``- compensation``.

    ``u`` is :func:`unsigned`; ``x_pad`` is padded with ``zx``; the compensation (``u(zx) · Σ w``
    per output channel, :func:`kiln.relay.op.integer.compensation`) is subtracted in an
    elementwise stage (``qnn_compensate``, tag ``elemwise``) that fuses with the requantizing
    epilogue. int32 (quad) weights take :func:`_conv2d_quads` (blocked data) or
    :func:`_conv2d_width_quads` (NCHW data); on AVX2 without VNNI the quads become pair words
    (:func:`dense_pairs_form`, CONV_PAIRS: reads ``Target.current()``).

    Parameters
    ----------
    data : te.Tensor
        5-D, [batch, in_channel // ib, in_height, in_width, ib] (NCHW{ib}c), or 4-D NCHW
        (``ib = 1``), uint8 or int8.
    weight : te.Tensor
        6-D, [out_channel // ob, in_channel // ib, kernel_h, kernel_w, ib, ob] int8; quads:
        ``ib/4`` int32 words in place of ``ib`` (blocked data) or
        [out_channel // ob, in_channel, kernel_h, kernel_w // 4, 1, ob] (NCHW data, dilation 1).
    compensation : te.Tensor
        2-D, [out_channel // ob, ob], int32.
    strides, padding, dilation, input_zero_point
        attrs, as :func:`conv2d`'s (groups 1).
    saturating_pairs : bool, optional
        attrs (quads only): the quads' pair sums saturated to int16, ``dot_u8i8x4_sat16``
        (``vpmaddubsw``; :mod:`kiln.relay.op.integer`, docs/decisions/049); never pair words.

    Returns
    -------
    te.Tensor
        5-D, [batch, out_channel // ob, out_height, out_width, ob] (NCHW{ob}c), int32, out_height
        as ``nn.conv2d``'s.
    """
    data, weight, comp = inputs
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    if weight.dtype == "int32":
        quads = _conv2d_width_quads if len(data.shape) == 4 else _conv2d_quads
        acc = quads(data, weight, attrs, out_type)
        return te.compute(out_type.shape, lambda n, o, y, x, b: acc[n, o, y, x, b] - comp[o, b],
                          name="qnn_compensate", tag="elemwise")
    padded = pad_hw(data, attrs["padding"], attrs["input_zero_point"])
    _, icc, kh, kw, ib, _ = weight.shape
    rc, ry, rx, ri = (te.reduce_axis(icc, "rc"), te.reduce_axis(kh, "ry"),
                      te.reduce_axis(kw, "rx"), te.reduce_axis(ib, "ri"))
    nchw = len(data.shape) == 4

    def body(n, o, y, x, b):
        lane = () if nchw else (ri.var,)
        value = padded[(n, rc.var, y * sh + ry.var * dh, x * sw + rx.var * dw, *lane)]
        return te.sum(unsigned(value) * _widen(weight[o, rc.var, ry.var, rx.var, ri.var, b]),
                      [rc, ry, rx, ri])

    acc = te.compute(out_type.shape, body, name="qnn_conv2d_NCHWc", tag="conv2d_NCHWc")
    return te.compute(out_type.shape, lambda n, o, y, x, b: acc[n, o, y, x, b] - comp[o, b],
                      name="qnn_compensate", tag="elemwise")


def _word_of(data: te.Tensor, index: tuple, materialized: bool = False) -> L.PrimExpr:
    """``u`` of the four bytes ``data[index[:-1], index[-1] + j]`` as one int32 word: a 4-byte
    load of a placeholder or ``materialized`` stage (uint8), with each byte's top bit flipped
    (int8: ``x ^ 0x80 = x + 128`` as unsigned); four byte loads of a computed tensor (inlined:
    no buffer to load a word from)."""
    if not (data.is_placeholder or materialized):
        *head, last = index
        return _unsigned_word([data[(*head, last + j)] for j in range(4)])
    load = data[index]
    word = loop_int8.load_u8x4(load)
    if load.dtype == "int8":
        word = L.Binary("^", word, L.const(np.int32(np.uint32(0x80808080)), "int32"))
    return word


def _zero_point_word(zx: int, dtype: str) -> L.PrimExpr:
    """The word of four unsigned bytes ``u(zx)`` (the padding's)."""
    u = (zx + 128 if dtype == "int8" else zx) & 255
    return L.const(np.int32(np.uint32(u * 0x01010101)), "int32")


def _quad_dot(attrs) -> object:
    """The quad product of an op: ``dot_u8i8x4_sat16`` (``vpmaddubsw``'s int16-saturated pair
    sums) with the attribute ``saturating_pairs`` (docs/decisions/049), else the exact
    ``dot_u8i8x4``."""
    if attrs.get("saturating_pairs"):
        return loop_int8.dot_u8i8x4_sat16
    return loop_int8.dot_u8i8x4


#: Whether the NCHWc conv takes activation pair words where the dense does (AVX2 without VNNI,
#: :func:`dense_pairs_form`); False keeps the quads (the "before" of docs/decisions/021's
#: measurement: ``benchmarks/model_ab.py --alt kiln.topi.integer.CONV_PAIRS=False``).
CONV_PAIRS = True


def _conv2d_quads(data, weight, attrs, out_type):
    """``Σ dot_u8i8x4(quads(x_pad)[.., q], w[.., q, b])`` over (rc, ry, rx, q); the quads
    read four channel bytes a word in one load (:func:`_word_of`), the padding's word
    ``u(zx)`` selected per pixel.

    On AVX2 without VNNI (:func:`dense_pairs_form`, :data:`CONV_PAIRS`) the padded stage holds
    pair words instead (``qnn_conv_pairs``, ``[N, C, H', W', 2, ib/4]`` int32 for an input
    block of ``ib`` channels, tag ``pad``: materialized once per call, :func:`_pairs_of`) and
    each step is :func:`_pair_dot`: every
    output-channel block and tap reads the activations widened, where the quads were widened
    (mask, shift, mask) in the register block once per pixel, quad and channel block."""
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    zx = attrs["input_zero_point"]
    n_, c_, h, w = data.shape[:4]
    words = data.shape[4] // 4

    def word(n, c, y, x, q):
        value = _word_of(data, (n, c, y - pt, x - pl, 4 * q))
        if not any(attrs["padding"]):
            return value
        inside = L.logical_and(y >= pt, y < h + pt, x >= pl, x < w + pl)
        return L.Select(inside, value, _zero_point_word(zx, data.dtype))

    padded = (n_, c_, h + pt + pb, w + pl + pr)
    _, icc, kh, kw, _, _ = weight.shape
    rc, ry, rx, rq = (te.reduce_axis(icc, "rc"), te.reduce_axis(kh, "ry"),
                      te.reduce_axis(kw, "rx"), te.reduce_axis(words, "rq"))
    dot = _quad_dot(attrs)
    if CONV_PAIRS and dense_pairs_form() and dot is loop_int8.dot_u8i8x4:
        pairs = te.compute((*padded, 2, words), lambda n, c, y, x, half, q: _pairs_of(
            word(n, c, y, x, q), half), name="qnn_conv_pairs", tag="pad")

        def pair_body(n, o, y, x, b):
            pixel = (n, rc.var, y * sh + ry.var * dh, x * sw + rx.var * dw)
            w_ = weight[o, rc.var, ry.var, rx.var, rq.var, b]
            return te.sum(_pair_dot(pairs[(*pixel, 0, rq.var)], pairs[(*pixel, 1, rq.var)],
                                    w_), [rc, ry, rx, rq])

        return te.compute(out_type.shape, pair_body, name="qnn_conv2d_NCHWc",
                          tag="conv2d_NCHWc")
    quads = te.compute((*padded, words), word, name="qnn_quads", tag="pad")

    def body(n, o, y, x, b):
        a = quads[n, rc.var, y * sh + ry.var * dh, x * sw + rx.var * dw, rq.var]
        return te.sum(dot(a, weight[o, rc.var, ry.var, rx.var, rq.var, b]), [rc, ry, rx, rq])

    acc = te.compute(out_type.shape, body, name="qnn_conv2d_NCHWc", tag="conv2d_NCHWc")
    # output pixel = input pixel (1×1, stride 1, no padding): a matrix product over pixels, the
    # AMX kernel's case (kiln.schedules.amx.amx_call)
    acc.pixel_gemm = (kh, kw) == (1, 1) and (sh, sw) == (1, 1) and \
        not any(attrs["padding"])
    return acc


def _conv2d_width_quads(data, weight, attrs, out_type):
    """NCHW data: ``Σ dot_u8i8x4(row_words[n, c, y', x' + 4q], w[o, c, ry, q, 0, b])`` over
    (c, ry, q), ``row_words[.., x']`` the four padded input pixels from ``x'`` (a sliding
    window, materialized once per call), ``x' = x · sw``, ``y' = y · sh + ry`` (dilation 1)."""
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = attrs["padding"]
    # the padded image, materialized (tag qnn_rows: kiln.schedules.nn_cpu) with three more
    # columns of zx so that every window of four bytes is in it; each word one 4-byte load
    padded = pad_hw(data, (pt, pl, pb, pr + 3), attrs["input_zero_point"], tag="qnn_rows")
    n_, c_, hp, wp = padded.shape[0], padded.shape[1], padded.shape[2], padded.shape[3] - 3
    words = te.compute((n_, c_, hp, wp), lambda n, c, y, x: _word_of(
        padded, (n, c, y, x), materialized=True), name="qnn_quads", tag="pad")
    _, icc, kh, kq, _, _ = weight.shape
    rc, ry, rq, ri = (te.reduce_axis(icc, "rc"), te.reduce_axis(kh, "ry"),
                      te.reduce_axis(kq, "rx"), te.reduce_axis(1, "ri"))
    dot = _quad_dot(attrs)

    def body(n, o, y, x, b):
        a = words[n, rc.var, y * sh + ry.var, x * sw + rq.var * 4 + ri.var]
        return te.sum(dot(a, weight[o, rc.var, ry.var, rq.var, ri.var, b]), [rc, ry, rq, ri])

    return te.compute(out_type.shape, body, name="qnn_conv2d_NCHWc", tag="conv2d_NCHWc")


#: the stage name of the tap-pair form (its schedule unrolls the pair axis, kiln/schedules)
TAP_PAIRS_STAGE = "qnn_depthwise_conv2d_NCHWc_pairs"


@register_compute("qnn.depthwise_conv2d_NCHWc")
def depthwise_conv2d_nchwc(inputs, attrs, out_type):
    """``qnn.depthwise_conv2d_NCHWc``: ``Σ_taps (x_pad - zx) · w`` per channel lane, exact in int32.

    ``x_pad`` is padded with ``zx``. int8 weights: one int32 multiply-add per tap. Tap pairs
    (int32 weights, :func:`kiln.relay.op.integer.pack_tap_pairs`):
    ``Σ_p dot_i16x2(x'(2p), x'(2p + 1), lo16(w[p]), hi16(w[p]))`` with ``x' = int16(x_pad) - zx``
    (an odd window's last pair repeats its last input with a zero weight) — on x86 one
    ``vpmaddwd`` per two taps and 8 lanes, the weight pairs read from memory as they are. Exact:
    ``|x'| ≤ 255``, ``|w| ≤ 128``, a pair sum at most 65 280 (stage TAP_PAIRS_STAGE).

    Parameters
    ----------
    data : te.Tensor
        5-D, [batch, channel // b, in_height, in_width, b] (NCHW{b}c), uint8 or int8.
    weight : te.Tensor
        6-D, [channel // b, 1, kernel_h, kernel_w, 1, b] int8, or int32 tap pairs
        [channel // b, 1, ceil(kernel_h * kernel_w / 2), 1, 1, b].
    strides, padding, dilation, input_zero_point
        attrs, as :func:`conv2d`'s (channel multiplier 1).
    kernel_size : tuple of int
        attrs (tap pairs only): ``(kernel_h, kernel_w)``.

    Returns
    -------
    te.Tensor
        5-D, [batch, channel // b, out_height, out_width, b], int32, out_height as
        ``nn.conv2d``'s; tag ``depthwise_conv2d_NCHWc`` (the float depthwise schedule).
    """
    data, weight = inputs
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    zx = attrs["input_zero_point"]
    padded = pad_hw(data, attrs["padding"], zx)
    if weight.dtype == "int32":
        return _depthwise_tap_pairs(padded, weight, attrs, out_type)
    kh, kw = weight.shape[2], weight.shape[3]
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    zero = L.IntImm(0)

    def body(n, c, y, x, b):
        value = L.Cast("int32", padded[n, c, y * sh + ry.var * dh, x * sw + rx.var * dw, b])
        return te.sum((value - L.const(zx, "int32")) * _widen(weight[c, zero, ry.var, rx.var,
                                                                      zero, b]), [ry, rx])

    return te.compute(out_type.shape, body, name="qnn_depthwise_conv2d_NCHWc",
                      tag="depthwise_conv2d_NCHWc")


def _depthwise_tap_pairs(padded, weight, attrs, out_type):
    """The tap-pair form of :func:`depthwise_conv2d_nchwc` (one reduce axis ``rp``)."""
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    zx = attrs["input_zero_point"]
    kh, kw = attrs["kernel_size"]
    taps = kh * kw
    rp = te.reduce_axis(weight.shape[2], "rp")
    zero = L.IntImm(0)

    def body(n, c, y, x, b):
        def tap(t):
            value = L.Cast("int16", padded[n, c, y * sh + t // kw * dh, x * sw + t % kw * dw, b])
            return value - L.const(zx, "int16") if zx else value

        t0 = rp.var * 2
        t1 = L.minimum(t0 + 1, L.const(taps - 1, t0.dtype))
        word = weight[c, zero, rp.var, zero, zero, b]
        high = L.Binary(">>", word, L.const(16, "int32"))
        return te.sum(loop_int8.dot_i16x2(tap(t0), tap(t1), L.Cast("int16", word),
                                          L.Cast("int16", high)), [rp])

    return te.compute(out_type.shape, body, name=TAP_PAIRS_STAGE, tag="depthwise_conv2d_NCHWc")


@register_compute("qnn.dense")
def dense(inputs, attrs, out_type):
    """``qnn.dense``: ``out[i, j] = Σ_k (int32(x[i, k]) - zx) · int32(w[j, k])``, exact in int32.

    TVM's ``qnn.dense`` with a zero weight zero point (ONNX MatMulInteger's core).

    Parameters
    ----------
    data : te.Tensor
        2-D, [M, K], uint8 or int8.
    weight : te.Tensor
        2-D, [N, K], int8.
    input_zero_point : int
        attrs: ``zx``, the activation's zero point.

    Returns
    -------
    te.Tensor
        2-D, [M, N], int32; tag ``dense``.
    """
    data, weight = inputs
    zx = L.const(attrs["input_zero_point"], "int32")
    k = te.reduce_axis(data.shape[1], "k")
    return te.compute(out_type.shape, lambda i, j: te.sum(
        (L.Cast("int32", data[i, k.var]) - zx) * _widen(weight[j, k.var]), [k]),
        name="qnn_dense", tag="dense")


@register_compute("qnn.dense_pack")
def dense_pack(inputs, attrs, out_type):
    """``qnn.dense_pack``: ``Σ_k u(x) · w[j // b, k, j % b]`` (tag ``dense_pack``), ``- comp[j]``.

    ``u`` is :func:`unsigned`; the compensation is subtracted in stage ``qnn_compensate`` (tag
    ``elemwise``). Quad weights (int32 words of four int8 along K): on quads of the activations
    (stage ``qnn_quads``), or on their int16 pairs (``qnn_pairs``, :func:`_dense_pairs`) where
    the target has ``vpmaddwd`` and no 8-bit dot product (:func:`dense_pairs_form`: reads
    ``Target.current()``); with ``saturating_pairs`` always the quads, on
    ``dot_u8i8x4_sat16`` (``vpmaddubsw``, docs/decisions/049).

    Parameters
    ----------
    data : te.Tensor
        2-D, [M, K], uint8 or int8.
    weight : te.Tensor
        3-D, [N // b, K, b] int8 (``dense_pack``'s layout), or int32 quads [N // b, K // 4, b].
    compensation : te.Tensor
        1-D, [N], int32: ``u(zx) · Σ_k w[n, k]``.
    saturating_pairs : bool, optional
        attrs (quads only): pair sums saturated to int16 (:mod:`kiln.relay.op.integer`).

    Returns
    -------
    te.Tensor
        2-D, [M, N] (``N = weight.shape[0] * b``), int32.
    """
    data, weight, comp = inputs
    b = weight.shape[2]
    dot = _quad_dot(attrs)
    if weight.dtype == "int32" and dense_pairs_form() and dot is loop_int8.dot_u8i8x4:
        acc = _dense_pairs(data, weight, out_type)
    elif weight.dtype == "int32":  # quads along K
        rows, words = data.shape[0], weight.shape[1]
        quads = te.compute((rows, words), lambda i, q: _word_of(data, (i, 4 * q)),
                           name="qnn_quads", tag="qnn_quads")
        k = te.reduce_axis(words, "k")
        acc = te.compute(out_type.shape, lambda i, j: te.sum(
            dot(quads[i, k.var], weight[j // b, k.var, j % b]), [k]),
            name="qnn_dense_pack", tag="dense_pack")
    else:
        k = te.reduce_axis(data.shape[1], "k")
        acc = te.compute(out_type.shape, lambda i, j: te.sum(
            unsigned(data[i, k.var]) * _widen(weight[j // b, k.var, j % b]), [k]),
            name="qnn_dense_pack", tag="dense_pack")
    return te.compute(out_type.shape, lambda i, j: acc[i, j] - comp[j],
                      name="qnn_compensate", tag="elemwise")


def dense_pairs_form() -> bool:
    """Whether the integer dense and NCHWc conv run on int16 activation pairs (AVX2, no VNNI).

    The dense (:func:`_dense_pairs`) and the conv (:func:`_conv2d_quads`) take the pairs on
    LLVM for x86 with AVX2 and no VNNI (``Target.int8_dot() == "avx2"``) nor AMX (whose kernel
    takes the quads, docs/decisions/026). Elsewhere the quads: ``vpdpbusd`` / ``usdot`` /
    ``sdot`` take them as they are; AVX-512BW without VNNI would gain as AVX2 but is not
    measured; the generic lowering has no widening to save. The dense's weight blocks are at
    least one vector wide here (AlterOpLayout's ``_int8_vector_block``: narrower ones were
    miscompiled by LLVM).

    Returns
    -------
    bool
        From ``Target.current()`` (False with no current target): its ``int8_dot()`` and
        ``amx_int8()``.
    """
    target = Target.current()
    return target is not None and target.int8_dot() == "avx2" and not target.amx_int8()


def _dense_pairs(data: te.Tensor, weight: te.Tensor, out_type) -> te.Tensor:
    """``Σ_q dot_i16x2(pairs[i, 0, q], even(w)) + dot_i16x2(pairs[i, 1, q], odd(w))`` over the
    K/4 quads, ``w = weight[j // b, q, j % b]`` (four int8 along K), ``even(w)`` its bytes 0
    and 2 and ``odd(w)`` 1 and 3 sign-extended to int16; ``pairs`` [M, 2, K/4] int32 (stage
    ``qnn_pairs``, once per call): ``pairs[i, h, q]`` holds ``u(x[i, 4q + h])`` and
    ``u(x[i, 4q + h + 2])`` in its low and high 16 bits. On AVX2 each term is one ``vpmaddwd``
    of a broadcast pair word and the weight vector's even or odd bytes (16-bit shifts, shared
    by every row of the register block): the activations are widened once per call instead of
    once per column block (the quads' mask and shift per row and quad). Exact: a pair sum is
    at most 2 · 255 · 128."""
    b = weight.shape[2]
    words = weight.shape[1]
    pairs = te.compute((data.shape[0], 2, words), lambda i, h, q: _pairs_of(
        _word_of(data, (i, 4 * q)), h), name="qnn_pairs", tag="qnn_pairs")
    k = te.reduce_axis(words, "k")

    def body(i, j):
        return te.sum(_pair_dot(pairs[i, 0, k.var], pairs[i, 1, k.var],
                                weight[j // b, k.var, j % b]), [k])

    return te.compute(out_type.shape, body, name="qnn_dense_pack", tag="dense_pack")


def _pairs_of(word: L.PrimExpr, half: L.PrimExpr) -> L.PrimExpr:
    """int32 pair word of a quad word of four unsigned bytes: ``half`` (an index, 0 or 1)
    0 → bytes 0 and 2 in the low and high 16 bits, 1 → bytes 1 and 3."""
    shift = L.Cast("int32", half * 8) if half.dtype != "int32" else half * 8
    return L.Binary("&", L.Binary(">>", word, shift), L.const(0x00FF00FF, "int32"))


def _pair_dot(even: L.PrimExpr, odd: L.PrimExpr, w: L.PrimExpr) -> L.PrimExpr:
    """``dot_u8i8x4`` of the quad whose pair words (:func:`_pairs_of`) are ``even`` and
    ``odd`` with the weight word ``w`` (four int8): ``dot_i16x2(even, bytes 0, 2 of w) +
    dot_i16x2(odd, bytes 1, 3 of w)``, the weight bytes sign-extended to int16 (on AVX2 two
    ``vpmaddwd`` of broadcast pair words and 16-bit shifts of the weight vector)."""
    def halves(word):
        return L.Cast("int16", word), L.Cast("int16", L.Binary(">>", word, L.const(16, "int32")))

    def weight_bytes(first):
        def byte(shift):
            value = L.Binary(">>", w, L.const(shift, "int32")) if shift else w
            return L.Cast("int16", L.Cast("int8", value))
        return byte(8 * first), byte(8 * first + 16)

    return loop_int8.dot_i16x2(*halves(even), *weight_bytes(0)) + \
        loop_int8.dot_i16x2(*halves(odd), *weight_bytes(1))
