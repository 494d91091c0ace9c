"""CPU schedules of the matrix products: ``nn.matmul`` and matmul-like ``einsum`` (activations
times activations), ``nn.dense_pack`` (float and integer, weights packed ``[N/b, K, b]`` at
compile time: docs/decisions/003, 021) and the weight-quantized ``nn.dense_q8`` /
``nn.dense_q4`` (docs/decisions/018). Each keeps a block of rows × one or two vectors of
columns in registers and streams the reduction through it (TVM's topi/x86 ``dense_pack``
schedule, much simpler)."""

from __future__ import annotations

import math

import numpy as np

from kiln import arith
from kiln.schedules.amx import amx_call
from kiln.schedules.conv_blocks import _divisors
from kiln.schedules.cpu import MIN_PARALLEL_EXTENT, register_schedule, tails_allowed
from kiln.schedules.knobs import knob
from kiln.schedules.nn_cpu import UNROLL_CHOICES, _blockable, wide_block_scale
from kiln.target import Target
from kiln.tir import te
from kiln.tir.lower import Schedule
from kiln.tir.te import IterVar, Tensor

#: rows of a dense register block. First measured on a 128×384 · 384×1536 GEMM, one core: 4
#: rows 82 GFLOP/s, 8 rows 131 (onnxruntime ~165), before the reduction was unrolled by 8
#: (DENSE_K_UNROLL). With that unroll, on a Xeon with AVX-512 (one core, llvm): 8 rows 36
#: GFLOP/s, 6 rows 77, 4 rows 73 (the 128×384 · 384×384 GEMM: 1018, 519, 544 us; MiniLM-L3 at
#: [4, 33], whose 132 rows took 6-row blocks, ran its GEMMs twice as fast as at [1, 128]).
DENSE_ROWS = 6
#: the tuner's choices of rows a dense / matmul register block (knob ``tile_y``)
ROW_CHOICES = (1, 2, 3, 4, 6, 8)

#: reduction steps of a dense unrolled around its register block (as INPUT_UNROLL for convs):
#: paraphrase-MiniLM-L3 at [1, 128], its 128×384·384×1536 and 128×1536·1536×384 GEMMs 8–10%
#: faster than not unrolled (4: 6%; 16: within noise of 8); the batch-1 GEMVs unchanged.
DENSE_K_UNROLL = 8


#: quads of the AVX2 int8 dense (activation pairs, kiln.topi.integer._dense_pairs) unrolled around
#: its register block: 2, not DENSE_K_UNROLL's 8 — with 8 the 4 x 16 block of MiniLM's GEMMs
#: spilled accumulators (40 stack accesses in the loop, llvm-mca for znver3: 106 cycles per 128
#: vpmaddwd; 2: none, 94) and ran 2-10% slower (benchmarks/int8_dense.py, docs/decisions/021)
PAIRS_K_UNROLL = 2


#: columns of a matmul register block: two AVX2 vectors, one AVX-512 vector (as dense_pack's
#: packed weight block)
MATMUL_COLS = 16


@register_schedule("matmul")
def schedule_matmul(sch: Schedule, mm: Tensor) -> None:
    """Schedule of stages tagged ``matmul`` (``nn.matmul``: attention scores, weighted values).

    As dense_pack without packing: ``*batch, i_o, j_o, k_o, k_i (unrolled), i_i (unrolled), j_i
    (vectorized)`` (:func:`_register_block`) with the ``tile_y × MATMUL_COLS`` block of
    accumulators in registers (``cache_write_local``); each ``k`` loads one contiguous piece of a
    row of B. Rows split by ``tile_y`` with a tail block (clamped reads, guarded stores),
    columns by MATMUL_COLS (16) with the last block moved back to end at the row's end
    (``split(tail="shift")``). Rows below DENSE_ROWS or columns below 16 (static; symbolic ones
    where tails are not allowed) keep the order ``*batch, i, k, j`` (a contiguous output row).
    Knobs: ``tile_y`` (ROW_CHOICES up to a static row count, default DENSE_ROWS = 6),
    ``unroll_k`` (the largest divisors of K up to UNROLL_CHOICES, default up to
    DENSE_K_UNROLL = 8). Reads no target property; the loop-level schedule parallelizes.

    Parameters
    ----------
    sch : Schedule
    mm : te.Tensor
        The stage: ``[*batch, M, N]``, one reduce axis ``k`` (:func:`kiln.topi.nn.matmul`).
    """
    *outer, i, j = mm.axes
    (k,) = mm.body.axes
    stage = sch[mm]
    if not (_blockable(i.extent, DENSE_ROWS) and _blockable(j.extent, MATMUL_COLS)):
        stage.reorder(*outer, i, k, j)
        return
    most = i.extent if isinstance(i.extent, int) else max(ROW_CHOICES)
    rows = stage.split(i, knob("tile_y", [r for r in ROW_CHOICES if r <= most], DENSE_ROWS),
                       tail=True)
    cols = stage.split(j, MATMUL_COLS, tail="shift")
    _register_block(stage, outer, rows, cols, k)


@register_schedule("einsum")
def schedule_einsum(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``einsum``: a matmul-like einsum register-blocked as ``nn.matmul``.

    Only with ``t.matmul_roles`` (:func:`kiln.topi.einsum.matmul_roles`), one reduce axis and a
    column axis (the last output axis) of at least MATMUL_COLS (16); other einsums keep the
    default loop nest. Rows are an operand-A axis: a symbolic one (the sequence) split with a
    tail block (knob ``tile_y``: ROW_CHOICES, default DENSE_ROWS), or the largest static one
    of extent >= 2 taken in divisor blocks (knob ``tile_y``: its divisors up to 8, default the
    largest up to DENSE_ROWS: the three query heads per key head of grouped attention) when
    the columns are symbolic and gathered (B not packed: :func:`kiln.topi.einsum.pack_columns`)
    or no symbolic row axis can be blocked (one decoded token: the kernel's version 1, whose
    symbolic columns keep their blocks; version 2, for fewer columns, has none). Columns split
    by 2 × MATMUL_COLS when static, a multiple of 32, and rows blocks of <= 3 (four of the
    target's vectors instead with 32 vector registers, when they divide the columns), or when
    B is packed; else by MATMUL_COLS, the last block shifted back; then
    :func:`_register_block` (the other axes outermost; knob ``unroll_k``).

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        The einsum stage (:func:`kiln.topi.einsum.einsum`).
    """
    roles = getattr(t, "matmul_roles", None)
    if roles is None or len(t.body.axes) != 1:
        return
    axes = list(t.axes)
    j = axes[roles.col]
    # symbolic columns (the cache length) keep their shifted blocks in the version for one
    # row (te.extents_version() 1); version 2 is the one for fewer columns than a block
    one_row_columns = not isinstance(j.extent, int) and te.extents_version() == 1
    if not (_blockable(j.extent, MATMUL_COLS) or one_row_columns):
        return
    stage = sch[t]
    candidates = [axes[p] for p in roles.rows]
    static = [ax for ax in candidates if isinstance(ax.extent, int) and ax.extent >= 2]
    symbolic = [ax for ax in candidates if not isinstance(ax.extent, int)
                and _blockable(ax.extent, DENSE_ROWS)]
    packed = any(x.tag == "einsum_pack" for x in t.inputs())
    # Unpacked symbolic columns are gathered: static rows (grouped heads) go first, the
    # fewest passes over the cache, and one decoded token keeps this main version. Packed
    # ones (kiln.topi.einsum.pack_columns) take the sequence's rows, six per block.
    if static and (not (isinstance(j.extent, int) or packed) or not symbolic):
        i = max(static, key=lambda ax: ax.extent)
        rows = stage.split(i, knob("tile_y", _divisors(i.extent, max(ROW_CHOICES)),
                                   max(_divisors(i.extent, DENSE_ROWS))))
    elif symbolic:
        i = symbolic[0]
        # packed columns: dense_pack's block, 32 columns by 6 rows (3 on AVX2)
        default = DENSE_ROWS // wide_block_scale(2 * MATMUL_COLS, t.dtype) if packed \
            else DENSE_ROWS
        rows = stage.split(i, knob("tile_y", ROW_CHOICES, default), tail=True)
    else:
        return
    # Three rows (grouped heads) leave registers for four column vectors: each pass over
    # the cache then reads two adjacent lines of a row, half the passes of a 16-column block
    # (its rows are 768 bytes apart: a latency-bound stride once the cache is out of L2).
    wide = isinstance(j.extent, int) and rows[1].extent <= 3 and j.extent % (2 * MATMUL_COLS) == 0
    block = 2 * MATMUL_COLS if wide or (packed and i in symbolic) else MATMUL_COLS
    # With 32 vector registers (AVX-512) three rows take four vectors: a decoded token's
    # context (3 grouped heads x 64) is one block, one pass over the value cache per head
    target = Target.current()
    if wide and target is not None and target.vector_registers() >= 32:
        four = 4 * target.vector_lanes(t.dtype)
        block = four if four > block and j.extent % four == 0 else block
    cols = stage.split(j, block, tail="shift")
    _register_block(stage, [ax for ax in axes if ax is not i and ax is not j], rows, cols,
                    t.body.axes[0])


@register_schedule("einsum_pack")
def schedule_einsum_pack(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``einsum_pack`` (:func:`kiln.topi.einsum.pack_columns`): B of
    a matmul-like einsum with its column letter last, materialized once per call (the einsum
    then reads it once per block of rows).

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        The packed operand: B's axes, the summed letter then the column letter last.
    """
    sch[t].compute_root()


#: a packed weight larger than this (a core's L2) is streamed once, its column panels outside
#: the row blocks, rather than once per block of rows (SmolLM2's 576x49152 LM head over 128
#: prompt tokens: the 113 MB weight read 22 times from memory)
L2_WEIGHT_BYTES = 1 << 20


def _packed_weight(dense: Tensor) -> Tensor:
    """The packed weight ``[N/b, K, b]`` of a dense (its 3-D input; the int8 dense's 3-D
    activation pairs ``qnn_pairs`` are not it)."""
    return next(t for t in dense.inputs() if len(t.shape) == 3 and t.tag != "qnn_pairs")


def _weight_bytes(dense: Tensor) -> int:
    packed = _packed_weight(dense)
    return math.prod(packed.shape) * np.dtype(packed.dtype).itemsize


def _register_block(stage, outer, rows: tuple[IterVar, IterVar], cols: tuple[IterVar, IterVar],
                    k: IterVar, outer_k: tuple[IterVar, ...] = (),
                    col_blocks: IterVar | None = None, k_unroll: int = 0,
                    cols_first: bool = False) -> None:
    """``*outer, i_o, j_o, *outer_k, k_o, k_i (unrolled), [col_blocks (unrolled),] i_i
    (unrolled), j_i (vectorized)`` over split rows and columns, the ``[col_blocks ×] i_i × j_i``
    block of accumulators kept local (registers), the reduction unrolled by up to
    DENSE_K_UNROLL or ``k_unroll`` (dense_pack, matmul; the quantized dense ops' block axis is
    ``outer_k``, their single-row blocks take ``col_blocks`` column blocks)."""
    (io, ii), (jo, ji) = rows, cols
    unroll = knob("unroll_k", [max(_divisors(k.extent, u)) for u in UNROLL_CHOICES],
                  max(_divisors(k.extent, k_unroll or DENSE_K_UNROLL)))
    ko, ki = stage.split(k, unroll)
    blocks = () if col_blocks is None else (col_blocks,)
    panels = (jo, io) if cols_first else (io, jo)
    stage.reorder(*outer, *panels, *outer_k, ko, ki, *blocks, ii, ji)
    stage.unroll(ki)
    for ax in blocks:
        stage.unroll(ax)
    stage.unroll(ii)
    stage.vectorize(ji)
    stage.cache_write_local()


@register_schedule("dense_pack")
def schedule_dense_pack(sch: Schedule, dense: Tensor) -> None:
    """Schedule of stages tagged ``dense_pack`` (``nn.dense_pack``, ``qnn.dense_pack``'s sum).

    ``i_o, j_o, k_o, k_i (unrolled), i_i (unrolled), j_i (vectorized)``: each ``k`` streams one
    contiguous row of the packed weight ``[N/b, K, b]`` into ``i_i × b`` accumulators held in
    registers (:func:`_register_block`, ``cache_write_local``); columns split by the weight
    block ``b``; a packed weight over L2_WEIGHT_BYTES (1 MiB) puts ``j_o`` outside ``i_o``
    (streamed once). The int8 dense's activation stages (tags ``qnn_quads``, ``qnn_pairs``)
    are materialized (``compute_root``). Knobs: ``tile_y`` (:func:`_row_limits`, default
    DENSE_ROWS // :func:`wide_block_scale`), ``unroll_k`` (default: up to DENSE_K_UNROLL, or
    PAIRS_K_UNROLL = 2 on pairs). Target properties: ``vector_bits`` and ``vector_lanes`` (the
    block's scale), ``amx_int8`` (``try_first`` = :func:`kiln.schedules.amx.amx_call`).

    Parameters
    ----------
    sch : Schedule
    dense : te.Tensor
        The stage: ``[M, N]``, one reduce axis ``k``; a 3-D input is the packed weight.
    """
    i, j = dense.axes
    (k,) = dense.body.axes
    block = _packed_weight(dense).shape[2]
    for t in dense.inputs():
        if t.tag in ("qnn_quads", "qnn_pairs"):  # the int8 dense's activation words: once a call
            sch[t].compute_root()
    stage = sch[dense]
    rows = _dense_rows(stage, i, wide_block_scale(block, dense.dtype))
    pairs = any(t.tag == "qnn_pairs" for t in dense.inputs())
    _register_block(stage, (), rows, stage.split(j, block), k,
                    k_unroll=PAIRS_K_UNROLL if pairs else 0,
                    cols_first=_weight_bytes(dense) > L2_WEIGHT_BYTES)
    stage.try_first = amx_call(dense)


#: Column blocks of a single-row quantized dense's register block, per op. One block (two
#: vectors) is bound by the latency of its two FMA chains: 576x1536 int8 GEMV 87 us, as
#: float32; four blocks (eight chains) 43 us. q4 keeps each block's ``d`` and ``m`` vectors
#: beside its accumulators: four blocks spilled them (docs/decisions/018).
DENSE_COL_BLOCKS = {"dense_q8": 4, "dense_q4": 2}
#: k steps of a quantized dense unrolled around its register block: q4 unrolls its whole block
#: of 32 (no loop inside a block: 576x1536 GEMV 210 -> 167 us, LLVM; the 4 x 8 version's
#: machine code had scalar byte loads and shuffles in its loop).
DENSE_QUANT_K_UNROLL = {"dense_q8": DENSE_K_UNROLL, "dense_q4": 32}


@register_schedule("dense_q8")
@register_schedule("dense_q4")
def schedule_dense_quant(sch: Schedule, dense: Tensor) -> None:
    """Schedule of stages tagged ``dense_q8`` / ``dense_q4`` (docs/decisions/018), as dense_pack's.

    The weights are widened to float in the vectorized channel loop ``j_i`` (the block ``b``);
    ``dense_q4_x`` (the rescaled activations) is materialized; ``nn.dense_q4`` reduces over
    (block ``kb``, ``k`` in the block), ``kb`` outside the register block so that its ``d`` and
    ``m`` vectors are invariant inside. A single-row block (``i_i`` of extent 1) accumulates
    several column blocks at once (unrolled), up to DENSE_COL_BLOCKS (q8: 4, q4: 2) while
    MIN_PARALLEL_EXTENT (16) column groups remain. Knobs: ``tile_y`` (as dense_pack's),
    ``tile_cb`` (the column blocks: divisors of N/b up to 8), ``unroll_k`` (default up to
    DENSE_QUANT_K_UNROLL: q8 8, q4 32). Target properties: ``vector_bits``, ``vector_lanes``
    (:func:`wide_block_scale`).

    Parameters
    ----------
    sch : Schedule
    dense : te.Tensor
        The stage: ``[M, N]`` (:func:`kiln.topi.weight_quant.dense_q8` / ``dense_q4``).
    """
    panel = next((t for t in dense.inputs() if t.tag == "dense_quant_panel"), None)
    if panel is not None:
        _schedule_panel_dense(sch, dense, panel)
        return
    i, j = dense.axes
    *outer_k, k = dense.body.axes
    block = next(t.shape[2] for t in dense.inputs() if len(t.shape) == 3)  # the packed weight
    for t in dense.inputs():
        if t.tag == "dense_q4_x":  # the rescaled activations: once per row, not per weight
            sch[t].compute_root()
    stage = sch[dense]
    rows = _dense_rows(stage, i, wide_block_scale(block, dense.dtype))
    jo, ji = stage.split(j, block)
    col_blocks = None
    if rows[1].extent == 1:
        groups = min(MIN_PARALLEL_EXTENT, jo.extent)
        count = max(d for d in _divisors(jo.extent, DENSE_COL_BLOCKS[dense.tag])
                    if jo.extent // d >= groups)
        count = knob("tile_cb", _divisors(jo.extent, max(UNROLL_CHOICES[:4])), count)
        jo, col_blocks = stage.split(jo, count)
    _register_block(stage, (), rows, (jo, ji), k, tuple(outer_k), col_blocks,
                    DENSE_QUANT_K_UNROLL[dense.tag])


def _schedule_panel_dense(sch: Schedule, dense: Tensor, panel: Tensor) -> None:
    """The several-row form of a quantized dense (docs/decisions/053): dense_pack's register
    blocks over the float panel ``[N/b, K, b]`` (q4: ``[N/b, K/8, 8, b]``, its 8 ``k`` of a word
    the unrolled steps), column blocks outermost, and the panel computed under the loop over
    them (``compute_at``: one block of ``b`` channels dequantized a time, its ``b`` lanes
    vectorized, into a local ``K × b`` buffer that every block of rows then reads)."""
    i, j = dense.axes
    block = panel.shape[-1]
    stage = sch[dense]
    rows = _dense_rows(stage, i, wide_block_scale(block, dense.dtype))
    cols = stage.split(j, block)
    *outer_k, k = dense.body.axes
    _register_block(stage, (), rows, cols, k, tuple(outer_k), k_unroll=k.extent
                    if outer_k else 0, cols_first=True)
    produce = sch[panel]
    produce.compute_at(stage, cols[0])
    *_, inner, lanes = panel.axes
    if len(panel.axes) == 4:  # q4: the 8 nibbles of a word, constant shifts once unrolled
        produce.unroll(inner)
    produce.vectorize(lanes)


def _row_limits(extent: arith.Dim, default: int) -> list[int]:
    """The tuner's choices of a dense's most rows a block (``tile_y``): each of ROW_CHOICES
    that splits a static ``extent`` differently from the ones before (and from ``default``);
    all of them for a symbolic one."""
    if not isinstance(extent, int):
        return list(ROW_CHOICES)

    def split(most: int) -> tuple[int, bool]:
        rows = max(_divisors(extent, most))
        return rows, extent > most and 2 * rows < most
    seen = {split(default)}
    out = []
    for most in ROW_CHOICES:
        if split(most) not in seen:
            seen.add(split(most))
            out.append(most)
    return out


def _dense_rows(stage, i: IterVar, scale: int = 1) -> tuple[IterVar, IterVar]:
    """The rows of a dense split into register blocks of up to DENSE_ROWS // ``scale``
    (:func:`wide_block_scale`)."""
    most = max(1, DENSE_ROWS // scale)
    most = knob("tile_y", _row_limits(i.extent, most), most)
    rows = max(_divisors(i.extent, most))  # symbolic rows: what their divisors allow
    static_tail = isinstance(i.extent, int) and i.extent > most and 2 * rows < most
    if static_tail or (rows < most and not isinstance(i.extent, int) and tails_allowed()):
        # symbolic rows (batch x sequence length), or a static count whose divisors make
        # small blocks (7, 13 rows: one pass over the weights a row): full blocks and a
        # partial last one; the kernel's other version (one row) keeps `rows`
        return stage.split(i, most, tail=True)
    return stage.split(i, rows)
