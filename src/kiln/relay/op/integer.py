"""Integer convolutions and dense ops with int8 operands and exact int32 accumulators
(docs/decisions/021; TVM: ``qnn.conv2d`` / ``qnn.dense`` after its QNN canonicalization).

Made by FakeQuantizationToInteger (kiln/relay/transform/fake_quantization_to_integer.py) from QDQ
groups; the requantizing epilogue (bias, scale, round, zero point, saturation) is ordinary graph
ops after them. Weights are symmetric int8 (zero point 0, as onnxruntime's ``quantize_static``
writes them); the activation zero point ``zx`` is an attribute.

- ``qnn.conv2d(data, weight; strides, padding, dilation, groups, input_zero_point)``:
  ``data`` uint8 or int8 NCHW, ``weight`` int8 OIHW → int32 NCHW,
  ``out = Σ (int32(x) - zx) · int32(w)`` over the window, padding contributing 0 (the input is
  padded with ``zx``). Attrs as ``nn.conv2d``'s.
- ``qnn.dense(data, weight; input_zero_point)``: ``data`` uint8/int8 ``[M, K]``, ``weight``
  int8 ``[N, K]`` → int32 ``[M, N]``, ``Σ_k (int32(x) - zx) · int32(w)``.

The blocked forms AlterOpLayout makes compute what the kernels compute, in unsigned × signed
products (the operand order of x86's ``vpmaddwd`` on zero-extended bytes and of VNNI's
``vpdpbusd``): ``u(x) = x`` for uint8 data, ``x + 128`` for int8 data (exact, whatever the
number of consumers of ``x``), and a compensation per output channel,
``compensation[o] = u(zx) · Σ w[o, ...]``, computed at compile time:

- ``qnn.conv2d_NCHWc(data, weight, compensation; strides, padding, dilation,
  input_zero_point)``: ``data[N, C/ib, H, W, ib]`` (or NCHW with ``ib = 1``), ``weight`` int8
  ``[O/ob, C/ib, KH, KW, ib, ob]``, ``compensation`` int32 ``[O/ob, ob]`` → int32
  ``[N, O/ob, OH, OW, ob]``, ``Σ u(x_pad) · w - compensation`` with ``x_pad`` padded with ``zx``;
  equal to ``qnn.conv2d`` when ``compensation`` is :func:`compensation` of the weight.
- ``qnn.depthwise_conv2d_NCHWc(data, weight; strides, padding, dilation, input_zero_point
  [, kernel_size])``: ``data`` uint8/int8 ``[N, C/b, H, W, b]``, ``weight`` int8
  ``[C/b, 1, KH, KW, 1, b]`` (channel multiplier 1, ``nn.depthwise_conv2d_NCHWc``'s layout)
  or int32 tap pairs ``[C/b, 1, ceil(KH·KW/2), 1, 1, b]`` (:func:`pack_tap_pairs`, with the
  attribute ``kernel_size = (KH, KW)``) → int32 ``[N, C/b, OH, OW, b]``,
  ``Σ_taps (int32(x_pad) - zx) · int32(w)`` with ``x_pad`` padded with ``zx``: no reduction
  over channels, so no quads and no compensation (int16 pairs of taps, ``vpmaddwd``).
- ``qnn.dense_pack(data, weight, compensation)``: ``weight`` int8 ``[N/b, K, b]``
  (``dense_pack``'s layout), ``compensation`` int32 ``[N]`` → ``Σ_k u(x) · w - compensation``.

Quads (VNNI's ``vpdpbusd`` layout): with the input block (conv) or K (dense) a multiple of 4, the
weight is int32 words of four int8 weights consecutive along the reduction, byte ``j`` of a word
(bits ``8j .. 8j+7``, :func:`pack_quads`) the reduction index ``4q + j``: conv
``[O/ob, C/ib, KH, KW, ib/4, ob]``, dense ``[N/b, K/4, b]`` — still one byte per weight. The
kernels read the activations as words of four unsigned bytes and multiply-add a word pair with
the ``dot_u8i8x4`` loop intrinsic. An image input (NCHW data, input block 1: three channels has
no four to pack) is packed along the kernel width instead: weight
``[O/ob, C, KH, KW/4, 1, ob]`` (KW a multiple of 4, AlterOpLayout pads it with zero taps), a word
``q`` holding taps ``4q .. 4q + 3`` of a kernel row, multiplied with the four consecutive input
pixels they meet (dilation 1).

Saturating pairs (docs/decisions/049): with the attribute ``saturating_pairs = True`` the quad
forms of ``qnn.conv2d_NCHWc`` and ``qnn.dense_pack`` sum their products as x86's
``vpmaddubsw`` does — each quad's byte pairs (0, 1) and (2, 3) summed into int16 with signed
saturation, the two then added exactly (the ``dot_u8i8x4_sat16`` loop intrinsic): reduction
indices ``(2p, 2p + 1)`` of the flattened reduction (input block, kernel row, kernel column,
channel in the block; the kernel column for NCHW data; K for the dense). AlterOpLayout sets it
where the weights prove that no pair sum leaves int16 (:func:`pair_sums_fit_int16`: then it
equals the exact sum) or where the build asks for ``int8_products="saturate"``.

Sums are exact in int32 while ``K · 255 · 128 < 2^31`` (K up to 65 000 reduction steps).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_rank
from kiln.relay.op.layout import block_layouts
from kiln.relay.op.nn import _pad_hw, unpack_dense_weight
from kiln.relay.op_registry import OpPattern, get_op, register_op
from kiln.tir.layout import transform_array

#: activation dtypes of the integer ops
DATA_DTYPES = ("uint8", "int8")


def unsigned_offset(dtype: str) -> int:
    """What ``u`` adds to a value of ``dtype`` to make it unsigned: 128 for int8, else 0."""
    return 128 if dtype == "int8" else 0


def compensation(weight: np.ndarray, input_zero_point: int, data_dtype: str) -> np.ndarray:
    """int32 ``u(zx) · Σ w`` per output channel of an int8 weight whose output channels are
    axis 0 (OIHW, ``[N, K]``): shape ``[O]``."""
    uz = int(input_zero_point) + unsigned_offset(data_dtype)
    sums = weight.reshape(weight.shape[0], -1).astype(np.int64).sum(axis=1)
    return (uz * sums).astype(np.int32)


def pack_quads(weight: np.ndarray, axis: int) -> np.ndarray:
    """int8 ``weight`` → int32 words of four weights consecutive along ``axis`` (its extent a
    multiple of 4), byte ``j`` of word ``q`` the weight at ``4q + j``; ``axis`` shrinks by 4."""
    w = np.moveaxis(weight.astype(np.int8), axis, -1)
    w = np.ascontiguousarray(w).reshape(*w.shape[:-1], w.shape[-1] // 4, 4)
    words = w.view(np.uint8).astype(np.uint32)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24
    return np.ascontiguousarray(np.moveaxis(words.view(np.int32), -1, axis))


def unpack_quads(words: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of :func:`pack_quads`: int32 words → int8 weights, ``axis`` grows by 4."""
    w = np.moveaxis(words.astype(np.int32), axis, -1).view(np.uint32)
    parts = np.stack([(w >> (8 * j)) & 255 for j in range(4)], axis=-1).astype(np.uint8)
    parts = parts.view(np.int8).reshape(*w.shape[:-1], 4 * w.shape[-1])
    return np.ascontiguousarray(np.moveaxis(parts, -1, axis))


def pair_sums_fit_int16(words: np.ndarray) -> bool:
    """Whether ``vpmaddubsw`` is exact on quad-packed weight ``words`` (int32, any shape, from
    :func:`pack_quads`) for every activation: each pair of bytes (0, 1) and (2, 3) of a word
    has ``255 · (max(w0, 0) + max(w1, 0)) ≤ 32767`` and ``255 · (min(w0, 0) + min(w1, 0))
    ≥ -32768``, the extremes of ``u0 · w0 + u1 · w1`` over unsigned activations ``u`` in
    0..255 (uint8 data as it is, int8 data + 128). Every weight in [-64, 64] passes (e.g.
    ``quantize_static(..., reduce_range=True)``'s 7-bit weights in [-64, 63])."""
    w = np.ascontiguousarray(words, dtype=np.int32).view(np.int8).reshape(-1, 2, 2)
    w = w.astype(np.int64)  # bytes of each little-endian word: pairs (0, 1) and (2, 3)
    high = np.maximum(w, 0).sum(axis=2) * 255
    low = np.minimum(w, 0).sum(axis=2) * 255
    return bool((high <= 32767).all() and (low >= -32768).all())


def saturated_pair_sums(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``out[p, o] = Σ_k sat16(x[p, 2k] · w[o, 2k] + x[p, 2k + 1] · w[o, 2k + 1])``, ``sat16``
    clamping to [-32768, 32767]: the products of ``saturating_pairs`` ops (numpy reference).

    Parameters
    ----------
    x : np.ndarray
        [P, K] integers (the unsigned activations), K even.
    w : np.ndarray
        [O, K] integers (int8 weights).

    Returns
    -------
    np.ndarray
        [P, O] int64.
    """
    x, w = x.astype(np.int64), w.astype(np.int64)
    out = np.empty((x.shape[0], w.shape[0]), np.int64)
    for o in range(w.shape[0]):
        pairs = x[:, 0::2] * w[o, 0::2] + x[:, 1::2] * w[o, 1::2]
        out[:, o] = np.clip(pairs, -32768, 32767).sum(axis=1)
    return out


#: the reduction axis of a blocked op's quad-packed weight: conv (ib/4), dense (K/4), conv over
#: NCHW data (the kernel width, KW/4)
CONV_QUAD_AXIS, DENSE_QUAD_AXIS, WIDTH_QUAD_AXIS = 4, 1, 3


def conv_quad_axis(data: TensorType | np.ndarray) -> int:
    """The packed axis of a ``qnn.conv2d_NCHWc`` int32 weight: the kernel width for NCHW
    (4-D) data, the input block otherwise."""
    return WIDTH_QUAD_AXIS if len(data.shape) == 4 else CONV_QUAD_AXIS


def pack_tap_pairs(weight: np.ndarray) -> np.ndarray:
    """int8 depthwise weight ``[C/b, 1, KH, KW, 1, b]`` → int32 words ``[C/b, 1, P, 1, 1, b]``,
    ``P = ceil(KH · KW / 2)``: word ``p`` holds tap ``2p`` (row-major over the window) in its
    low 16 bits and tap ``2p + 1`` (0 past the last tap) in its high 16 bits, both
    sign-extended — on a little-endian machine the int16 pair ``vpmaddwd`` multiplies."""
    cb, _, kh, kw, _, b = weight.shape
    taps = weight.astype(np.int32).reshape(cb, kh * kw, b)
    if kh * kw % 2:
        taps = np.concatenate([taps, np.zeros((cb, 1, b), np.int32)], axis=1)
    lo, hi = taps[:, 0::2] & 0xFFFF, taps[:, 1::2] << 16
    return np.ascontiguousarray((lo | hi).astype(np.int32).reshape(cb, 1, -1, 1, 1, b))


def unpack_tap_pairs(words: np.ndarray, kernel_size: tuple[int, int]) -> np.ndarray:
    """The inverse of :func:`pack_tap_pairs` for a ``kernel_size = (KH, KW)`` window."""
    kh, kw = kernel_size
    cb, b = words.shape[0], words.shape[5]
    w = words.astype(np.int32).reshape(cb, -1, b)
    taps = np.stack([(w << 16) >> 16, w >> 16], axis=2).reshape(cb, -1, b)[:, :kh * kw]
    return np.ascontiguousarray(taps.astype(np.int8).reshape(cb, 1, kh, kw, 1, b))


def _check(data: TensorType, weight: TensorType, quads_ok: bool = False) -> None:
    if data.dtype not in DATA_DTYPES:
        raise ShapeError(f"data must be uint8 or int8, got {data.dtype}")
    if weight.dtype != "int8" and not (quads_ok and weight.dtype == "int32"):
        raise ShapeError(f"weight must be int8{' (or int32 quads)' if quads_ok else ''}, got "
                         f"{weight.dtype}")


def _logical(weight: TensorType, axis: int) -> TensorType:
    """The int8 weight type a quad-packed one stands for."""
    if weight.dtype != "int32":
        return weight
    shape = list(weight.shape)
    shape[axis] *= 4
    return TensorType(tuple(shape), "int8")


def _conv2d_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, weight = arg_types
    _check(data, weight)
    conv_attrs = {k: attrs[k] for k in ("strides", "padding", "dilation", "groups")}
    out = get_op("nn.conv2d").infer([TensorType(data.shape, "int32"),
                                      TensorType(weight.shape, "int32")], conv_attrs)
    return TensorType(out.shape, "int32")


def _conv2d_ref(data: np.ndarray, weight: np.ndarray, strides, padding, dilation, groups,
                input_zero_point) -> np.ndarray:
    x = _pad_hw(data.astype(np.int64) - input_zero_point, padding, 0)
    y = get_op("nn.conv2d").ref(x, weight.astype(np.int64), strides=strides,
                                padding=(0, 0, 0, 0), dilation=dilation, groups=groups)
    return y.astype(np.int32)


register_op("qnn.conv2d", _conv2d_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _conv2d_ref)


def _conv2d_nchwc_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    data, weight, comp = arg_types
    _check(data, weight, quads_ok=True)
    weight = _logical(weight, conv_quad_axis(data))
    out = get_op("nn.conv2d_NCHWc").infer([TensorType(data.shape, "int32"),
                                           TensorType(weight.shape, "int32")],
                                          {k: attrs[k] for k in ("strides", "padding",
                                                                 "dilation")})
    if comp.dtype != "int32" or comp.shape != (out.shape[1], out.shape[4]):
        raise ShapeError(f"compensation must be int32 {(out.shape[1], out.shape[4])}, got "
                         f"{comp.dtype} {comp.shape}")
    return TensorType(out.shape, "int32")


def _conv2d_nchwc_ref(data: np.ndarray, weight: np.ndarray, comp: np.ndarray, strides, padding,
                      dilation, input_zero_point, saturating_pairs=False) -> np.ndarray:
    if weight.dtype == np.int32:
        weight = unpack_quads(weight, conv_quad_axis(data))
    if saturating_pairs:
        y = _saturated_conv(data, weight, strides, padding, dilation, input_zero_point)
        return (y - comp.astype(np.int64)[None, :, None, None, :]).astype(np.int32)
    dl, wl = block_layouts(TensorType(data.shape, str(data.dtype)),
                           TensorType(weight.shape, str(weight.dtype)))
    offset = unsigned_offset(str(data.dtype))
    x = transform_array(data, dl, "NCHW").astype(np.int64) + offset
    x = _pad_hw(x, padding, input_zero_point + offset)
    w = transform_array(weight, wl, "OIHW").astype(np.int64)
    y = get_op("nn.conv2d").ref(x, w, strides=strides, padding=(0, 0, 0, 0),
                                dilation=dilation, groups=1)
    y = transform_array(y, "NCHW", f"NCHW{weight.shape[5]}c")
    return (y - comp.astype(np.int64)[None, :, None, None, :]).astype(np.int32)


def _saturated_conv(data, weight, strides, padding, dilation, input_zero_point) -> np.ndarray:
    """``Σ u(x_pad) · w`` of a blocked conv with :func:`saturated_pair_sums`' products, the
    reduction flattened in the kernel's order (input block, kernel row, column, channel)."""
    offset = unsigned_offset(str(data.dtype))
    x = data.astype(np.int64) + offset
    if x.ndim == 4:  # NCHW data: one channel a block
        x = x[..., None]
    pt, pl, pb, pr = padding  # x: [N, C/ib, H, W, ib]
    x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr), (0, 0)),
               constant_values=input_zero_point + offset)
    (sh, sw), (dh, dw) = strides, dilation
    ob_, cb, kh, kw, ib, ob = weight.shape
    oh = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    taps = [x[:, :, ry * dh:ry * dh + sh * (oh - 1) + 1:sh, rx * dw:rx * dw + sw * (ow - 1) + 1:sw]
            for ry in range(kh) for rx in range(kw)]
    cols = np.stack(taps, axis=2).reshape(x.shape[0], cb, kh, kw, oh, ow, ib)
    cols = cols.transpose(0, 4, 5, 1, 2, 3, 6).reshape(-1, cb * kh * kw * ib)
    w = weight.transpose(0, 5, 1, 2, 3, 4).reshape(ob_ * ob, -1)
    y = saturated_pair_sums(cols, w).reshape(x.shape[0], oh, ow, ob_, ob)
    return y.transpose(0, 3, 1, 2, 4)


register_op("qnn.conv2d_NCHWc", _conv2d_nchwc_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            _conv2d_nchwc_ref)


def _dense_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, weight = arg_types
    _check(data, weight)
    expect_rank(data, 2, "data")
    expect_rank(weight, 2, "weight")
    if data.shape[1] != weight.shape[1]:
        raise ShapeError(f"data {data.shape} and weight {weight.shape}: K differs")
    return TensorType((data.shape[0], weight.shape[0]), "int32")


def _dense_ref(data: np.ndarray, weight: np.ndarray, input_zero_point) -> np.ndarray:
    x = data.astype(np.int64) - input_zero_point
    return np.matmul(x, weight.astype(np.int64).T).astype(np.int32)


register_op("qnn.dense", _dense_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _dense_ref)


def _dense_pack_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    data, weight, comp = arg_types
    _check(data, weight, quads_ok=True)
    weight = _logical(weight, DENSE_QUAD_AXIS)
    expect_rank(data, 2, "data")
    expect_rank(weight, 3, "weight")
    if data.shape[1] != weight.shape[1]:
        raise ShapeError(f"data {data.shape} and packed weight {weight.shape}: K differs")
    n = weight.shape[0] * weight.shape[2]
    if comp.dtype != "int32" or comp.shape != (n,):
        raise ShapeError(f"compensation must be int32 ({n},), got {comp.dtype} {comp.shape}")
    return TensorType((data.shape[0], n), "int32")


def _dense_pack_ref(data: np.ndarray, weight: np.ndarray, comp: np.ndarray,
                    saturating_pairs=False) -> np.ndarray:
    if weight.dtype == np.int32:
        weight = unpack_quads(weight, DENSE_QUAD_AXIS)
    x = data.astype(np.int64) + unsigned_offset(str(data.dtype))
    w = unpack_dense_weight(weight).astype(np.int64)
    y = saturated_pair_sums(x, w) if saturating_pairs else np.matmul(x, w.T)
    return (y - comp.astype(np.int64)).astype(np.int32)


register_op("qnn.dense_pack", _dense_pack_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _dense_pack_ref)


def _depthwise_nchwc_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 2)
    data, weight = arg_types
    _check(data, weight, quads_ok=attrs.get("kernel_size") is not None)
    if weight.dtype == "int32":  # tap pairs: the window is the attribute kernel_size
        kh, kw = attrs["kernel_size"]
        cb, _, pairs, _, _, b = weight.shape
        if (kh * kw + 1) // 2 != pairs:
            raise ShapeError(f"depthwise tap pairs: {pairs} words for a {kh}x{kw} window")
        weight = TensorType((cb, 1, kh, kw, 1, b), "int8")
    out = get_op("nn.depthwise_conv2d_NCHWc").infer(
        [TensorType(data.shape, "int32"), TensorType(weight.shape, "int32")],
        {k: attrs[k] for k in ("strides", "padding", "dilation")})
    return TensorType(out.shape, "int32")


def _depthwise_nchwc_ref(data: np.ndarray, weight: np.ndarray, strides, padding, dilation,
                         input_zero_point, kernel_size=None) -> np.ndarray:
    if weight.dtype == np.int32:
        weight = unpack_tap_pairs(weight, kernel_size)
    dl, wl = block_layouts(TensorType(data.shape, str(data.dtype)),
                           TensorType(weight.shape, str(weight.dtype)))
    x, w = transform_array(data, dl, "NCHW"), transform_array(weight, wl, "OIHW")
    y = _conv2d_ref(x, w, strides, padding, dilation, x.shape[1], input_zero_point)
    return transform_array(y, "NCHW", f"NCHW{weight.shape[5]}c")


register_op("qnn.depthwise_conv2d_NCHWc", _depthwise_nchwc_infer, OpPattern.OUT_ELEMWISE_FUSABLE,
            _depthwise_nchwc_ref)
