"""CPU schedules of the transformer encoder's row-wise ops (issue 17): LayerNorm, attention,
the reshape that merges attention heads.

Kept apart from :mod:`kiln.schedules.nn_cpu` (convolutions) and
:mod:`kiln.schedules.dense_cpu` (matrix products) so each file stays one concept. Imports
kiln.tir, kiln.schedules.cpu, and (inside functions) kiln.topi.attention and
kiln.schedules.nn_cpu.
"""

from __future__ import annotations

from kiln.schedules.cpu import register_schedule
from kiln.tir.lower import Schedule
from kiln.tir.te import Tensor


@register_schedule("layer_norm_sqsum")
def schedule_layer_norm(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``layer_norm_sqsum``: ``nn.layer_norm`` fused row by row.

    ``kiln.topi.nn.layer_norm``'s row sum, sum of squared deviations and normalized row are
    computed one row at a time in cache, both sums split into vector partial results
    (``sch.attrs["fuse_rows"]``: :func:`kiln.schedules.row_fusion.fuse_rows`). Before: three
    whole-tensor nests with scalar sums, 2.6 ns per element on paraphrase-MiniLM-L3's
    [1, 32, 384]. No split, no knob, no target property.

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        The sum-of-squares stage, x's shape with 1 along the normalized axis.
    """
    sch.attrs["fuse_rows"] = True


#: key columns of one register block of the attention scores: four AVX2 vectors (four
#: independent FMA chains over the head dimension), two AVX-512 vectors
SCORE_COLS = 64
#: query rows per block (kiln.topi.attention.ROW_BLOCK) and key columns of a blocked scores
#: register block: rows x cols / 8 accumulators on AVX2, each loaded key vector used by every
#: row of the block
BLOCK_SCORE_COLS = 16
#: value columns of a blocked context register block (``block x 16`` accumulators: a block of
#: 4 rows times a head of 32 would be 16 AVX2 vectors, more than the registers left)
BLOCK_CONTEXT_COLS = 16


@register_schedule("attention_scores")
def schedule_attention(sch: Schedule, scores: Tensor) -> None:
    """Schedule of stages tagged ``attention_scores``: ``nn.attention`` by blocks of query rows.

    By blocks of ROW_BLOCK (4) query rows where the queries are at least a block (or symbolic,
    while tails are allowed) and the keys static or blockable by BLOCK_SCORE_COLS
    (:func:`_schedule_row_blocks`), else one query row at a time (:func:`_schedule_rows`);
    ``attention_exp`` and ``attention_inv`` are materialized, and
    :mod:`kiln.schedules.row_fusion` (``sch.attrs["fuse_rows"]``) then fuses the stages under the
    (batch, head, row or block) loops. Blocks: the scores in ``block × BLOCK_SCORE_COLS`` (16)
    accumulators (``n, c, i_o, j_o, d, i_i (unrolled), j_i (vectorized)``), the context in
    ``block × BLOCK_CONTEXT_COLS`` (16) (``n, c, i_o, k_o, r, i_i (unrolled), k_i
    (vectorized)``). Rows: the scores in blocks of SCORE_COLS (64) keys (``n, c, i, j_o, d,
    j_i (vectorized)``), the context row ``n, c, i, r, [chain (unrolled),] k (vectorized)``.
    Splits are ``tail="shift"``; register blocks ``cache_write_local``. No knob, no target
    property.

    Parameters
    ----------
    sch : Schedule
    scores : te.Tensor
        The scores stage ``[B, H, S, T]``, reduce axis ``d`` (:func:`kiln.topi.attention.
        attention`).
    """
    from kiln.schedules.nn_cpu import _blockable
    from kiln.topi.attention import row_block

    rows, keys = scores.axes[2].extent, scores.axes[3].extent
    block = row_block(rows)
    # (a symbolic key count in a kernel's small-extent version: row by row, as its rows)
    if block > 1 and _blockable(rows, block) and (isinstance(keys, int)
                                                  or _blockable(keys, BLOCK_SCORE_COLS)):
        _schedule_row_blocks(sch, scores, block)
    else:
        _schedule_rows(sch, scores)
    sch.attrs["fuse_rows"] = True


def _schedule_row_blocks(sch: Schedule, scores: Tensor, block: int) -> None:
    """Each stage's query-row axis split in blocks of ``block`` (the last block moved back to
    end at the row count), the block's rows inside the register blocks: the scores in
    ``block x BLOCK_SCORE_COLS`` accumulators (``jo, d, ii, ji``: one contiguous piece of a
    transposed-key row loaded, times ``block`` broadcast query values), the context
    ``Σ_t e[ii, t] · v[t, :]`` in ``block x E`` accumulators (``r, ii, k``: one value row
    loaded per key for the block's rows) times the inverse sum as its epilogue; the
    row max, exp and sum row by row inside the block."""
    from kiln.schedules.nn_cpu import _blockable

    for t in sch.order:
        stage = sch[t]
        if t.tag in ("attention_exp", "attention_inv"):
            stage.compute_root()
        if stage.inline or len(t.axes) < 3:
            continue
        n, c, i, *rest = stage.all_axes()
        io, ii = stage.split(i, block, tail="shift")
        if t is scores:
            j, d = rest
            if _blockable(j.extent, BLOCK_SCORE_COLS):
                jo, ji = stage.split(j, BLOCK_SCORE_COLS, tail="shift")
                stage.reorder(n, c, io, jo, d, ii, ji)
                stage.unroll(ii)
                stage.vectorize(ji)
                stage.cache_write_local()
            else:  # fewer keys than a block (a static count, see schedule_attention)
                stage.reorder(n, c, io, ii, d, j)
                stage.vectorize(j)
                stage.cache_write_local()
        elif t.tag == "attention_context":
            k, r = rest
            if _blockable(k.extent, BLOCK_CONTEXT_COLS):
                ko, ki = stage.split(k, BLOCK_CONTEXT_COLS, tail="shift")
                stage.reorder(n, c, io, ko, r, ii, ki)
            else:
                ki = k
                stage.reorder(n, c, io, r, ii, k)
            stage.unroll(ii)
            stage.vectorize(ki)
            stage.cache_write_local()


def _schedule_rows(sch: Schedule, scores: Tensor) -> None:
    """One query row at a time: the scores row in register blocks of SCORE_COLS keys
    (``j_o, d, j_i`` vectorized: one broadcast query value times a contiguous piece of a
    transposed-key row), the exp row materialized (the sum and the product read it), the
    context row ``Σ_t e[t] · v[t, :]`` in vector registers with the product by 1 / sum as
    its epilogue. Keys fewer than a block (or a symbolic count where tails are not allowed)
    keep ``d`` outside one vectorized row."""
    from kiln.schedules.nn_cpu import _blockable

    stage = sch[scores]
    n, c, i, j = scores.axes
    (d,) = scores.body.axes
    if _blockable(j.extent, SCORE_COLS):
        jo, ji = stage.split(j, SCORE_COLS, tail="shift")
        stage.reorder(n, c, i, jo, d, ji)
        stage.vectorize(ji)
        stage.cache_write_local()
    else:
        stage.reorder(n, c, i, d, j)
    for t in sch.order:
        if t.tag in ("attention_exp", "attention_inv"):
            sch[t].compute_root()
        elif t.tag == "attention_context":
            ctx = sch[t]
            *rows, k = t.axes  # (n, c, i[, chain]), k
            (r,) = t.body.axes
            ctx.reorder(*rows[:3], r, *rows[3:], k)
            for ax in rows[3:]:
                ctx.unroll(ax)
            ctx.vectorize(k)
            ctx.cache_write_local()


@register_schedule("reshape")
def schedule_reshape(sch: Schedule, t: Tensor) -> None:
    """Schedule of stages tagged ``reshape`` ending a kernel that merges trailing axes.

    Attention heads back into the hidden axis (``[B, S, H, D] → [B, S, H·D]``): the output's
    last axis split by the source's last extent ``D``, the inner part vectorized, so each piece
    of ``D`` is one contiguous copy instead of a division and a remainder per element (with the
    reshape compute's own split of the index, kiln.topi.transform.reshape).
    paraphrase-MiniLM-L3's ``fused_transpose_reshape`` at [1, 12, 128, 32], 1 thread: 123 →
    8.4 us. Only for the kernel's output, static last extents with ``1 < D < last`` and
    ``last % D == 0``; no knob.

    Parameters
    ----------
    sch : Schedule
    t : te.Tensor
        The reshape stage.
    """
    if t is not sch.output:
        return
    (src,) = t.inputs()
    if not t.shape or not src.shape:  # to or from a scalar
        return
    last, inner = t.shape[-1], src.shape[-1]
    if not (isinstance(last, int) and isinstance(inner, int) and 1 < inner < last
            and last % inner == 0):
        return
    _, ji = sch[t].split(t.axes[-1], inner)
    sch[t].vectorize(ji)
