"""AlterOpLayout: run convolutions in the blocked-channel layout NCHW[x]c (TVM:
src/relay/transforms/alter_op_layout.cc with topi/x86's ``_alter_conv2d_layout``).

Each ``nn.conv2d`` with constant weights becomes ``nn.conv2d_NCHWc`` (or
``nn.depthwise_conv2d_NCHWc``) on data in ``NCHW{ib}c`` and weights pre-transformed at compile
time to ``OIHW{ib}i{ob}o`` — or, where :func:`kiln.relay.transform.winograd.winograd_tile`
chooses it, ``nn.conv2d_winograd_NCHWc`` with Winograd-transformed weights; a grouped
float conv keeps attr ``groups`` (groups the outer part of the output-channel blocks, blocks
within a group: :func:`_group_blocks`). The result is
converted back to NCHW by a ``layout_transform`` — but consumers that work as well in the
blocked layout use the blocked value directly, so the
layout flows through the network and transforms remain only at its edges:

- elementwise ops (relu, clip, cast, ...), and per-tensor quantize / dequantize (their scale and
  zero point are scalars);
- broadcast arithmetic whose operands are blocked values of the same block (equal, or
  broadcast over H and W as a squeeze-excite scale), scalars, constants (bias and scale
  constants are transformed here, once), or computed one-channel or per-channel values (the
  zero-point terms of dynamically quantized convs), and ``nn.bias_add`` on the channel axis;
- ``concatenate`` on the channel axis of blocked values of the same block;
- pooling (max, average, global), given ``layout="NCHW{b}c"``;
- the next convolution, which takes its input block from its producer.

An image input (at most :data:`IMAGE_CHANNELS` channels, NCHW) is read as it is, as NCHW1c.
Outputs padded with zero filters to full blocks flow only into per-channel consumers (the
elementwise ops, bias and scale constants — padded too — and pools); everything else reads
their real channels, cropped in NCHW.

``nn.dense`` with constant weights becomes ``nn.dense_pack`` with weights packed at compile time
to ``[N/b, K, b]`` (TVM's x86 ``dense_pack``). The integer ops ``qnn.conv2d`` (groups 1) and
``qnn.dense`` get the same blocking as ``qnn.conv2d_NCHWc`` / ``qnn.dense_pack``, int8 weights
and a compensation constant (kiln/relay/op/integer.py, docs/decisions/021); a depthwise
``qnn.conv2d`` becomes ``qnn.depthwise_conv2d_NCHWc`` (int8 weight, no compensation); other
grouped ``qnn.conv2d`` stay NCHW.

NCHW versions that no consumer needs disappear with the dead nodes. Run after FoldScaleAxis and
FoldConstant (weights must be constants), before FuseOps.
"""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call
from kiln.relay.op.integer import (
    CONV_QUAD_AXIS,
    DATA_DTYPES,
    DENSE_QUAD_AXIS,
    WIDTH_QUAD_AXIS,
    compensation,
    pack_quads,
    pack_tap_pairs,
    pair_sums_fit_int16,
)
from kiln.relay.op.nn import pack_dense_weight
from kiln.relay.op_registry import OpPattern
from kiln.relay.transform.clip_taps import clipped_conv, tap_regions
from kiln.relay.transform.winograd import winograd_conv, winograd_tile
from kiln.target import Target
from kiln.tir.layout import transform_array

name = "AlterOpLayout"

#: channel block of conv outputs, in SIMD vectors of the target: two vectors (AVX-512: 32
#: floats) let one input broadcast feed two FMAs, halving the loads per FMA of a one-vector
#: block (docs/decisions/003); 16 floats when no target is current
CONV_VECTORS = 2
_ARITH = ("add", "subtract", "multiply", "divide", "maximum", "minimum")
#: outputs of one packed dense weight block, in SIMD vectors of the target (AVX-512: 32 floats)
DENSE_VECTORS = 2
#: Outputs are padded with zero filters up to a multiple of the full block when the exact block
#: would be under half of it and padding adds at most this fraction of work: 1000 classes run as
#: 1024 in blocks of 32 instead of 125 blocks of 8 (half-width vectors), as onnxruntime's NCHWc
#: convolutions do; the padded outputs are sliced off right after the op.
MAX_PAD_FRACTION = 1 / 16
#: rows of data from which a dense's outputs are padded (below, a padded block was no faster:
#: 1x1280 · 1280x1000 0.19 ms exact (blocks of 8) vs 0.20 ms padded to 1024)
DENSE_MIN_PAD_ROWS = 2
#: dtypes of the convolutions and dense ops rewritten: float32, and int32 (the exact integer
#: products of QLinearConv, ConvInteger, MatMulInteger...; 4-byte lanes like float32, so the
#: same blocks fit the registers)
BLOCKED_DTYPES = ("float32", "int32")
#: elementwise with per-tensor (rank-0) scale and zero point operands
QNN = ("qnn.quantize", "qnn.dequantize")
#: pools run per channel: the same op with attr ``layout="NCHW{b}c"``
POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d")


def _block_limit() -> int:
    """Most channels of a conv block for the current target (8..32)."""
    target = Target.current()
    if target is None:
        return 16
    return max(8, min(32, CONV_VECTORS * target.vector_lanes("float32")))


#: With 16 vector registers (AVX2, SSE), float outputs that the full block does not divide but
#: three vectors do (24 channels on AVX2: MobileNetV2's 24-channel stage) take blocks of three
#: vectors: 4 pixels × 3 accumulator vectors + 3 weight vectors + a broadcast input fill the
#: 16 registers (MLAS's AVX2 tile, 3 filter blocks), where one-vector blocks (8) loaded an
#: input broadcast per FMA (docs/decisions/003).
THREE_VECTOR_BLOCKS = True


def _out_block(channels: int, integer: bool = False) -> int:
    """Channel block of ``channels`` conv outputs: the largest power-of-two fraction of the
    full block that divides them, or three vectors (THREE_VECTOR_BLOCKS) for float convs on
    targets with 16 vector registers."""
    block = _block_limit()
    target = Target.current()
    if channels % block and THREE_VECTOR_BLOCKS and not integer and target is not None \
            and target.vector_registers() < 32:
        three = 3 * target.vector_lanes("float32")
        if channels % three == 0:
            return three
    while channels % block:
        block //= 2
    return block


def _padded_outputs(n: int, full: int, block: int) -> int:
    """``n`` outputs rounded up to a multiple of ``full`` when that pays (MAX_PAD_FRACTION)
    for an op whose exact block is ``block`` under half of ``full`` — or under ``full`` with 16
    vector registers (AVX2, SSE): there a one-vector block's register block was
    latency-bound (squeezenet's 512 -> 1000 1x1 conv at 13x13, blocks of 8: 4.25 ms vs
    onnxruntime's 2.39, 1008 channels in blocks of 16: see docs/decisions/003); else ``n``."""
    target = Target.current()
    least = full if target is not None and target.vector_registers() < 32 else full // 2
    if block >= least:
        return n
    padded = -(-n // full) * full
    return padded if padded - n <= n * MAX_PAD_FRACTION else n


def _vector_padded_outputs(n: int, block: int) -> tuple[int, int]:
    """(outputs, block) of a float conv whose exact channel block is under half a vector:
    ``n`` rounded up to whole vectors, in blocks of one vector, when the wider vectors outweigh
    the zero filters at least twice (``padded / n <= lanes / block / 2``); else ``(n, block)``.
    Consumers read the real channels' slice (a layout change), so half-vector blocks (24
    channels on AVX-512) keep their exact block between convs (decision 059)."""
    target = Target.current()
    lanes = target.vector_lanes("float32") if target is not None else 0
    if 2 * block >= lanes:
        return n, block
    padded = -(-n // lanes) * lanes
    return (padded, lanes) if 2 * padded * block <= n * lanes else (n, block)


def _pad_rows(w: np.ndarray, rows: int) -> np.ndarray:
    """``w`` with zero rows appended along axis 0 up to ``rows``."""
    return np.pad(w, [(0, rows - w.shape[0])] + [(0, 0)] * (w.ndim - 1))


def _crop(x: Expr, shape: tuple[int, ...]) -> Expr:
    """The leading ``shape`` of ``x`` (a value computed with padded outputs)."""
    return Call("strided_slice", [x], {"begin": (0,) * len(shape), "end": tuple(shape),
                                       "strides": (1,) * len(shape)})


#: NCHW inputs with at most this many channels (an image: gray, RGB, RGBA) are read as they
#: are, as NCHW1c: resnet50's first conv 1.60 -> 1.48 ms with 3 channels as NCHW1c rather than
#: one block of 3, and the 75 us layout transform before it gone (squeezenet: 46 us).
IMAGE_CHANNELS = 4


def _in_block(channels: int, integer: bool = False) -> int:
    """Input block of a conv reading an NCHW value: 1 for an image (:data:`IMAGE_CHANNELS`),
    one block of all channels up to a full block, else the output block of that many."""
    if channels <= IMAGE_CHANNELS:
        return 1
    return channels if channels <= _block_limit() else _out_block(channels, integer)


def alter_op_layout(func: Function, int8_products: str = "exact") -> Function:
    """Rewrite ``func``'s convolutions to NCHWc and propagate the layout (see the module doc).

    ``int8_products`` (``kiln.build``'s): "exact", or "saturate" — the integer convs over
    channel quads and dense ops on a target where ``vpmaddubsw`` is the fastest u8 × s8
    product (``Target.int8_maddubs()``) get ``saturating_pairs`` whatever their weights
    (:func:`_saturating_pairs`, docs/decisions/049)."""
    blocked: dict[int, tuple[Expr, int]] = {}  # NCHW node uid → (its NCHWc value, block)
    # NCHW node uid → (NCHWc value with zero-filter channels past the real ones, block)
    padded: dict[int, tuple[Expr, int]] = {}

    def to_nchw(value: Expr, block: int, shape: tuple[int, ...] | None = None) -> Expr:
        """``value`` back in NCHW; with ``shape``, its real channels (``value`` is padded)."""
        out = Call("layout_transform", [value],
                   {"src_layout": f"NCHW{block}c", "dst_layout": "NCHW"})
        if shape is None:
            blocked[out.uid] = (value, block)
            return out
        crop = _crop(out, shape)
        padded[crop.uid] = (value, block)
        return crop

    def as_blocked(x: Expr, block: int) -> Expr:
        form = blocked.get(x.uid)
        if form is not None and form[1] == block:
            return form[0]
        src, layout = (form[0], f"NCHW{form[1]}c") if form else (x, "NCHW")
        return Call("layout_transform", [src], {"src_layout": layout,
                                                "dst_layout": f"NCHW{block}c"})

    def visit(call: Call, args: list[Expr]) -> Expr:
        op = call.op.name
        if op in ("nn.conv2d", "qnn.conv2d"):
            return _conv(call, args, blocked, as_blocked, to_nchw, int8_products)
        if op in ("nn.dense", "qnn.dense"):
            return _dense(call, args, int8_products)
        if call.checked_type.ndim != 4:
            return same_call(call, args)
        if any(padded.get(a.uid) is not None for a in args):
            return _padded_channel_op(call, args, [padded.get(a.uid) for a in args], to_nchw)
        forms = [blocked.get(a.uid) for a in args]
        blocks = {f[1] for f in forms if f is not None}
        if len(blocks) > 1:  # a one-channel value (block 1) broadcasts against any block
            blocks = {f[1] for f, a in zip(forms, args)
                      if f is not None and a.checked_type.shape[1] != 1}
        if len(blocks) != 1:
            return same_call(call, args)
        (block,) = blocks
        if call.op.pattern == OpPattern.ELEMWISE and len(args) == 1:
            return to_nchw(Call(op, [forms[0][0]], call.attrs, call.span), block)
        if op in QNN and forms[0] and all(a.checked_type.ndim == 0 for a in args[1:]):
            return to_nchw(Call(op, [forms[0][0], *args[1:]], call.attrs, call.span), block)
        if op in _ARITH or (op == "nn.bias_add" and call.attrs["axis"] == 1):
            new = _blocked_operands(call, args, forms, block, as_blocked)
            if new is not None:
                return to_nchw(Call("add" if op == "nn.bias_add" else op, new, {}, call.span),
                               block)
        if op == "concatenate" and call.attrs["axis"] == 1 and all(forms) \
                and all(f[1] == block for f in forms):  # (one block: a channel never splits)
            return to_nchw(Call(op, [f[0] for f in forms], call.attrs, call.span), block)
        if op in POOLS and call.attrs.get("layout", "NCHW") == "NCHW":
            attrs = dict(call.attrs, layout=f"NCHW{block}c")
            return to_nchw(Call(op, [forms[0][0]], attrs, call.span), block)
        return same_call(call, args)

    return rewrite(func, visit)


def _conv(call: Call, args: list[Expr], blocked, as_blocked, to_nchw,
          int8_products: str = "exact") -> Expr:
    """``nn.conv2d`` → ``nn.conv2d_NCHWc`` / ``nn.depthwise_conv2d_NCHWc``; ``qnn.conv2d``
    (groups 1) → ``qnn.conv2d_NCHWc`` with its int8 weight blocked the same way and the
    compensation of its unsigned products, depthwise → ``qnn.depthwise_conv2d_NCHWc``
    (kiln/relay/op/integer.py); a grouped float conv → ``nn.conv2d_NCHWc`` with ``groups``
    (:func:`_group_blocks`)."""
    data, weight = args
    integer = call.op.name == "qnn.conv2d"
    if not isinstance(weight, Constant) or data.checked_type.ndim != 4 or \
            data.checked_type.dtype not in (DATA_DTYPES if integer else BLOCKED_DTYPES):
        return same_call(call, args)
    channels = data.checked_type.shape[1]
    out_channels = weight.checked_type.shape[0]
    groups = call.attrs["groups"]
    attrs = {k: call.attrs[k] for k in ("strides", "padding", "dilation")}
    form = blocked.get(data.uid)
    padded = out_channels
    if groups > 1 and not groups == channels == out_channels:  # grouped, not depthwise
        blocks = None if integer else _group_blocks(channels, out_channels, groups, form)
        if blocks is None:
            return same_call(call, args)
        data_block, ib, ob = blocks
        w = transform_array(weight.data, "OIHW", f"OIHW{ib}i{ob}o")
        out = Call("nn.conv2d_NCHWc", [as_blocked(data, data_block), Constant(w, weight.name)],
                   dict(attrs, groups=groups), call.span)
        return to_nchw(out, ob)
    if groups == 1:
        ib = form[1] if form else _in_block(channels, integer)
        ob = _out_block(out_channels, integer)
        padded = _padded_outputs(out_channels, _block_limit(), ob)
        if padded != out_channels:
            ob = _block_limit()
        regions = None if integer or padded != out_channels or not CLIP_DILATED_TAPS else \
            tap_regions(data.checked_type.shape, weight.data.shape, attrs,
                        call.checked_type.shape)
        if regions is not None:
            return to_nchw(_clipped(call, data, weight, form, (ib, ob), attrs, regions,
                                    as_blocked), ob)
        tile = None if integer or padded != out_channels or ib == 1 else \
            winograd_tile(data.checked_type, weight.data.shape, call.attrs,
                          call.checked_type.shape)
        if tile is not None:
            return to_nchw(winograd_conv(call, as_blocked(data, ib), weight, tile, (ib, ob)),
                           ob)
        if padded == out_channels and not integer:
            padded, ob = _vector_padded_outputs(out_channels, ob)
        w = transform_array(_pad_rows(weight.data, padded), "OIHW", f"OIHW{ib}i{ob}o")
        op = "nn.conv2d_NCHWc"
    else:  # depthwise
        ib = ob = form[1] if form else _out_block(channels, integer)
        w = transform_array(weight.data, "OIHW", f"OIHW1i{ob}o")
        op = "nn.depthwise_conv2d_NCHWc"
        if integer:  # int16 pairs of taps (kiln/topi/integer.py)
            kernel = (w.shape[2], w.shape[3])
            out = Call("qnn.depthwise_conv2d_NCHWc",
                       [as_blocked(data, ib), Constant(pack_tap_pairs(w), weight.name)],
                       dict(attrs, input_zero_point=call.attrs["input_zero_point"],
                            kernel_size=kernel), call.span)
            return to_nchw(out, ob)
    # NCHW data is NCHW1c: a conv with input block 1 reads it directly (4-D).
    blocked_data = data if form is None and ib == 1 and op == "nn.conv2d_NCHWc" else \
        as_blocked(data, ib)
    operands = [blocked_data, Constant(w, weight.name)]
    if integer:
        zx = call.attrs["input_zero_point"]
        comp = compensation(_pad_rows(weight.data, padded), zx, data.checked_type.dtype)
        saturating = False
        if ib % 4 == 0:  # words of four input channels: the dot_u8i8x4 kernel
            operands[1] = Constant(pack_quads(w, CONV_QUAD_AXIS), weight.name)
            saturating = _saturating_pairs(operands[1].data, int8_products == "saturate")
        elif blocked_data is data and w.shape[3] >= 3 and attrs["dilation"] == (1, 1):
            # an image: words of four taps along the kernel width, zero taps up to a multiple
            # of 4 (and as much more padding on the right: the output width is unchanged)
            extra = -w.shape[3] % 4
            w = np.pad(w, [(0, 0)] * 3 + [(0, extra)] + [(0, 0)] * 2)
            operands[1] = Constant(pack_quads(w, WIDTH_QUAD_AXIS), weight.name)
            pt, pl, pb, pr = attrs["padding"]
            attrs = dict(attrs, padding=(pt, pl, pb, pr + extra))
            # its pairs are two taps of a row, not onnxruntime's (tap, channel) order: proven
            # exact only
            saturating = _saturating_pairs(operands[1].data, False)
        operands.append(Constant(comp.reshape(-1, ob)))
        op, attrs = "qnn.conv2d_NCHWc", dict(attrs, input_zero_point=zx)
        if saturating:
            attrs["saturating_pairs"] = True
    out = Call(op, operands, attrs, call.span)
    if padded != out_channels:
        # The padded channels stay inside: consumers see the NCHW slice of real channels, and
        # per-channel consumers (_padded_channel_op) the padded blocked value.
        return to_nchw(out, ob, call.checked_type.shape)
    return to_nchw(out, ob)


#: Whether float convs whose taps mostly read padding (dilated ones on small maps) are computed
#: as unpadded convs over regions of their output (kiln.relay.transform.clip_taps; for before /
#: after runs of benchmarks/conv_families.py).
CLIP_DILATED_TAPS = True


def _clipped(call: Call, data: Expr, weight: Constant, form, blocks: tuple[int, int],
             attrs: dict, regions, as_blocked) -> Expr:
    """``nn.conv2d`` ``call`` as blocked region convs with only their valid taps, concatenated
    in ``NCHW{ob}c`` (:func:`kiln.relay.transform.clip_taps.clipped_conv`)."""
    ib, ob = blocks
    # NCHW data is NCHW1c: an image is read (and sliced) as it is.
    blocked_data = data if form is None and ib == 1 else as_blocked(data, ib)

    def conv(part: Expr, sub: np.ndarray, sub_attrs: dict) -> Expr:
        w = Constant(transform_array(sub, "OIHW", f"OIHW{ib}i{ob}o"), weight.name)
        return Call("nn.conv2d_NCHWc", [part, w], sub_attrs, call.span)

    return clipped_conv(blocked_data, weight.data, attrs, regions, conv)


#: Whether grouped float convs (not depthwise) run blocked as ``nn.conv2d_NCHWc`` with groups
#: (for before / after runs of benchmarks/conv_families.py).
GROUPED_NCHWC = True
#: Smallest output block of a grouped conv run blocked: groups of fewer outputs (a channel
#: multiplier of 2) keep the NCHW kernel, which vectorizes along the output rows instead.
MIN_GROUP_BLOCK = 4


def _group_blocks(channels: int, out_channels: int, groups: int,
                  form: tuple[Expr, int] | None) -> tuple[int, int, int] | None:
    """(data block, weight input block ``ib``, output block ``ob``) of a grouped conv run as
    ``nn.conv2d_NCHWc`` with groups as the outer axis and channel blocks within a group, or
    None (GROUPED_NCHWC off, or groups of fewer than MIN_GROUP_BLOCK outputs). ``ob`` is the
    largest block dividing a group's outputs (:func:`_out_block`); the producer's block is
    read as it is when it divides a group's inputs (``ib`` = it) or a whole number of groups
    fills it (``ib`` = the group's inputs: RegNet's 8-channel groups after a 32-channel
    block), else the data is transformed to the block of a group's inputs."""
    group_in, group_out = channels // groups, out_channels // groups
    ob = _out_block(group_out)
    if not GROUPED_NCHWC or ob < MIN_GROUP_BLOCK:
        return None
    if form is not None and group_in % form[1] == 0:
        return form[1], form[1], ob
    if form is not None and form[1] % group_in == 0:
        return form[1], group_in, ob
    own = _out_block(group_in)
    return own, own, ob


def _padded_channel_op(call: Call, args: list[Expr], forms: list, to_nchw) -> Expr:
    """A per-channel op (unary elementwise, bias or scale by constants, pool, or arithmetic
    between padded values of one layout) on padded blocked values (``forms``: the padded
    ``(value, block)`` of each argument, or None), run on all their channels (the extra ones
    are cropped at the end): squeezenet's 1000-class conv keeps its 1024 channels blocked
    through bias, ReLU and global pooling; LR-ASPP's two 5-class convs (padded to 16) add
    blocked."""
    op = call.op.name
    value, block = next(f for f in forms if f is not None)
    channels = value.checked_type.shape[1] * block
    if forms[0] is not None and op in POOLS and call.attrs.get("layout", "NCHW") == "NCHW":
        new = Call(op, [value], dict(call.attrs, layout=f"NCHW{block}c"), call.span)
    elif forms[0] is not None and call.op.pattern == OpPattern.ELEMWISE and len(args) == 1:
        new = Call(op, [value], call.attrs, call.span)
    elif op in _ARITH or (op == "nn.bias_add" and call.attrs["axis"] == 1):
        operands = []
        for arg, form in zip(args, forms):
            if form is not None and form[1] == block and \
                    form[0].checked_type.shape == value.checked_type.shape:
                operands.append(form[0])
                continue
            data = arg.data if isinstance(arg, Constant) and form is None else None
            const = None if data is None else _blocked_constant(data, call, block, channels)
            if const is None:
                return same_call(call, args)
            operands.append(Constant(const, arg.name))
        new = Call("add" if op == "nn.bias_add" else op, operands, {}, call.span)
    else:
        return same_call(call, args)
    return to_nchw(new, block, call.checked_type.shape)


def _saturating_pairs(words: np.ndarray, requested: bool) -> bool:
    """Whether an integer op over the quad weight ``words`` takes ``vpmaddubsw``'s saturating
    pair sums (attribute ``saturating_pairs``, docs/decisions/049): only where that is the
    target's fastest u8 × s8 product (``Target.int8_maddubs()``: AVX2 without VNNI or AMX),
    and then when ``requested`` (``int8_products="saturate"``) or when no pair sum can leave
    int16 (:func:`kiln.relay.op.integer.pair_sums_fit_int16`: exact)."""
    target = Target.current()
    if target is None or not target.int8_maddubs():
        return False
    return requested or pair_sums_fit_int16(words)


def _dense(call: Call, args: list[Expr], int8_products: str = "exact") -> Expr:
    """``nn.dense`` with constant weights → ``nn.dense_pack`` (weights packed here);
    ``qnn.dense`` → ``qnn.dense_pack`` (int8 weight packed, compensation per output)."""
    data, weight = args
    integer = call.op.name == "qnn.dense"
    if not isinstance(weight, Constant) or \
            weight.checked_type.dtype not in (("int8",) if integer else BLOCKED_DTYPES):
        return same_call(call, args)
    n = weight.checked_type.shape[0]
    full = dense_block_limit()
    block = full
    while n % block:
        block //= 2
    # A single row streams the weight once (bound by memory, not by vector width): no padding.
    rows = data.checked_type.shape[0]
    many = arith.bounds(rows)[1] >= DENSE_MIN_PAD_ROWS  # symbolic rows: as many as they may be
    padded = _padded_outputs(n, full, block) if many else n
    if integer and block % 16 and full % 16 == 0 and _amx_rows(rows, weight.data.shape[1]):
        padded = -(-n // full) * full  # AMX tiles are 16 columns wide (docs/decisions/026)
    if padded != n:
        block = full
    least = _int8_vector_block() if integer else 1
    if block < least:  # e.g. a 2-output head: one vector of zero-padded columns
        padded, block = -(-n // least) * least, least
    full_weight = _pad_rows(weight.data, padded)
    packed = Constant(pack_dense_weight(full_weight, block), weight.name)
    if integer:
        comp = compensation(full_weight, call.attrs["input_zero_point"], data.checked_type.dtype)
        attrs = {}
        if full_weight.shape[1] % 4 == 0:  # words of four k: the dot_u8i8x4 kernel
            packed = Constant(pack_quads(packed.data, DENSE_QUAD_AXIS), weight.name)
            if _saturating_pairs(packed.data, int8_products == "saturate"):
                attrs["saturating_pairs"] = True
        out = Call("qnn.dense_pack", [data, packed, Constant(comp)], attrs, call.span)
    else:
        out = Call("nn.dense_pack", [data, packed], {}, call.span)
    return out if padded == n else _crop(out, call.checked_type.shape)


def _int8_vector_block() -> int:
    """Fewest columns of an integer dense block on a target whose LLVM codegen has an 8-bit dot
    product form (``Target.int8_dot()``): one vector of int32. Narrower blocks were scalar
    integer IR that LLVM 22's SLP vectorizer miscompiled on x86 (6x8 u8 · 8x2 s8 with blocks
    of 2: one row wrong at O1-O3, exact with SLP off); padded they take the vector form. A
    multi-level target (``-mcpu=portable``) pads when any level has such a form, to its widest
    level's vector (layouts are shared by all levels). 1 elsewhere."""
    target = Target.current()
    if target is None or target.kind != "llvm":
        return 1
    levels = [target.level(name) for name in target.levels] or [target]
    if not any(level.int8_dot() for level in levels):
        return 1
    return target.vector_lanes("int32")


def _amx_rows(rows, k) -> bool:
    """Whether an integer dense of ``rows`` × ``k`` data tries the AMX kernel (a target with
    AMX-INT8, static rows filling a tile, K a multiple of 4 and at least 64): its weight blocks
    are then padded to a multiple of 16 columns, one tile row (docs/decisions/026-amx.md)."""
    target = Target.current()
    return target is not None and target.amx_int8() and isinstance(rows, int) and \
        rows >= 16 and k % 4 == 0 and k >= 64


def dense_block_limit() -> int:
    """Outputs of a packed dense block: DENSE_VECTORS float32 vectors of the current target
    (4 lanes when there is none: SSE/NEON width); a smaller power of two when it divides."""
    target = Target.current()
    lanes = target.vector_lanes("float32") if target is not None else 4
    return DENSE_VECTORS * lanes


def _blocked_operands(call: Call, args: list[Expr], forms, block: int,
                      as_blocked) -> list[Expr] | None:
    """Operands of a broadcast op on blocked values, or None if one cannot be blocked. A
    computed operand may be a scalar, one channel (``[N, 1, H, W]`` is ``[N, 1, H, W, 1]``
    blocked: a reshape) or per channel (``[C, 1, 1]``, made blocked: it is small) — the
    zero-point terms of dynamically quantized convs (fake_quantization_to_integer)."""
    out_shape = call.checked_type.shape
    new: list[Expr] = []
    for arg, form in zip(args, forms):
        if form is not None:
            n, c, h, w = arg.checked_type.shape
            # same channels, or one blocked by 1 (NCHW1c broadcasts against NCHW{b}c); H and
            # W equal or broadcast (1), as in a squeeze-excite scale
            same = c == out_shape[1] and form[1] == block
            if n != out_shape[0] or not (same or (c == 1 and form[1] == 1)) or \
                    h not in (1, out_shape[2]) or w not in (1, out_shape[3]):
                return None
            new.append(form[0])
        elif isinstance(arg, Constant):
            value = _blocked_constant(arg.data, call, block)
            if value is None:
                return None
            new.append(Constant(value, arg.name))
        else:
            value = _blocked_computed(arg, call.checked_type.shape, block, as_blocked)
            if value is None:
                return None
            new.append(value)
    return new


def _blocked_computed(arg: Expr, out_shape: tuple, block: int, as_blocked) -> Expr | None:
    """A computed operand of ``_blocked_operands`` broadcast against NCHW{block}c, or None."""
    t = arg.checked_type
    if t.ndim == 0:
        return arg
    if t.ndim > 4:
        return None
    full = (1,) * (4 - t.ndim) + tuple(t.shape)
    n, c, h, w = full
    if n not in (1, out_shape[0]) or h not in (1, out_shape[2]) or w not in (1, out_shape[3]):
        return None
    if c == 1:
        return Call("reshape", [arg], {"newshape": (n, 1, h, w, 1)})
    if c == out_shape[1] and h == w == 1 and isinstance(c, int):
        return as_blocked(Call("reshape", [arg], {"newshape": (n, c, 1, 1)}), block)
    return None


def _blocked_constant(data: np.ndarray, call: Call, block: int,
                      padded: int | None = None) -> np.ndarray | None:
    """``data`` (broadcast against an NCHW value) as a constant broadcast against NCHW{b}c;
    per-channel data is zero-padded to ``padded`` channels when given."""
    if data.ndim == 0:
        return data
    if call.op.name == "nn.bias_add":
        data = data.reshape(-1, 1, 1)
    if data.ndim > 4:
        return None
    full = data.reshape((1,) * (4 - data.ndim) + data.shape)
    if full.shape[1] == 1:
        return full.reshape(full.shape + (1,))
    channels = call.checked_type.shape[1]
    if full.shape[1] != channels:
        return None
    if padded is not None:
        full = np.pad(full, [(0, 0), (0, padded - channels), (0, 0), (0, 0)])
    return transform_array(np.ascontiguousarray(full), "NCHW", f"NCHW{block}c")
