"""Compute of ``nn.attention`` (kiln.relay.op.attention): per (batch, head, query row) the
scores row, its max, the exp row, its sum, then the exp row times ``v`` divided by the sum.

Stages (tags for :mod:`kiln.schedules.transformer_cpu`): ``attention_scores`` ``q · kt``
``[B, H, S, T]``; the scaled, masked scores (inlined where read); the row max; ``attention_exp``
``exp(x - max)`` (materialized: read by the sum and the product); the row sum;
``attention_inv`` its inverse (materialized: one division per row); ``attention_context``
``Σ_t exp · v`` ``[B, H, S, E]``; the output, times the inverse sum (the context's epilogue).
The schedule fuses them row by row or by blocks of query rows (kiln.schedules.row_fusion), so
each intermediate is one row or one block of rows of one head in cache, never the whole
``[B, H, S, T]`` tensor.
"""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.transform.fast_exp import NORMAL_LOW
from kiln.topi.broadcast import broadcast_load
from kiln.topi.registry import register_compute

#: interleaved partial sums of the context over the keys when their count is a static multiple
#: and the query rows are computed one at a time: one query row's context over 32 values is
#: four vector FMA chains, as long as the keys, on AVX2; two sets of them hide the FMA latency
CONTEXT_CHAINS = 2
#: query rows computed together (kiln.schedules.transformer_cpu): each key and value row loaded
#: serves this many rows, whose accumulators are the independent FMA chains
ROW_BLOCK = 4


def row_block(rows) -> int:
    """The query rows per block for ``rows`` query rows: ROW_BLOCK, or 1 for fewer static rows.

    Parameters
    ----------
    rows : int or arith.Dim
        The query count ``S`` (static, or a shape symbol).

    Returns
    -------
    int
        ROW_BLOCK (4), or 1 (row by row) when ``rows`` is a static int below ROW_BLOCK.
    """
    return 1 if isinstance(rows, int) and rows < ROW_BLOCK else ROW_BLOCK


def _shifted(y: L.PrimExpr) -> L.PrimExpr:
    """The exp argument ``x - max`` (at most 0) of a float32 row clamped to
    [NORMAL_LOW, 0]: below ln 2^-126 an exp is under 1.2e-38 against a row sum of at least 1, and
    with the range explicit FastExp needs no clamp of its own and one scale factor
    (kiln.tir.transform.fast_exp: half the instructions of the general exp)."""
    if y.dtype != "float32":
        return y
    # constants first: min/max are ``a < b ? a : b`` selects in both codegens, which return
    # their second operand for a NaN, so a NaN score stays NaN (as onnxruntime's softmax)
    return L.minimum(L.const(0.0, y.dtype), L.maximum(L.const(NORMAL_LOW, y.dtype), y))


@register_compute("nn.attention")
def attention(inputs, attrs, out_type):
    """Scaled dot-product attention ``softmax(q · kt · scale + mask, axis=-1) · v``.

    Vaswani et al. 2017, "Attention Is All You Need", eq. (1), with an additive mask (the chain
    kiln.relay.transform.fuse_attention matches); docs/decisions/025-fused-attention.md.
    The softmax is ``exp(x - max) * (1 / sum)``; a float32 ``x - max`` is clamped to
    [NORMAL_LOW, 0] (:func:`_shifted`). With one query row a block (:func:`row_block`) and a
    static key count ``T`` divisible by CONTEXT_CHAINS, the context is summed as CONTEXT_CHAINS
    interleaved partial sums over the keys (stage ``[B, H, S, CONTEXT_CHAINS, E]``).

    Parameters
    ----------
    q : te.Tensor
        4-D, [batch, heads, queries, head_dim] (``[B, H, S, D]``), float.
    kt : te.Tensor
        4-D, [batch, heads, head_dim, keys] (``[B, H, D, T]``, the keys transposed), q's dtype.
    v : te.Tensor
        4-D, [batch, heads, keys, value_dim] (``[B, H, T, E]``), q's dtype.
    mask : te.Tensor
        Broadcastable to ``[B, H, S, T]`` (numpy rule, :func:`broadcast_load`), added to the
        scaled scores (a scalar 0 where the model has no mask), q's dtype.
    scale : float
        attrs: the factor of the scores (``1 / sqrt(D)`` in BERT-like models).

    Returns
    -------
    te.Tensor
        4-D, ``[B, H, S, E]`` (``out_type.shape``), q's dtype; stages tagged
        ``attention_scores``, ``attention_exp``, ``attention_inv``, ``attention_context`` (module
        docstring), the output ``elemwise``.
    """
    q, kt, v, mask = inputs
    b, h, s, d = q.shape
    t = kt.shape[3]
    scale = L.const(attrs["scale"], q.dtype)
    rd = te.reduce_axis(d, "d")
    scores = te.compute(
        (b, h, s, t), lambda n, c, i, j: te.sum(q[n, c, i, rd.var] * kt[n, c, rd.var, j], [rd]),
        name="attention_scores", tag="attention_scores")
    x = te.compute((b, h, s, t), lambda *i: scores[i] * scale + broadcast_load(mask, i),
                   name="attention_logits", tag="elemwise")
    rm = te.reduce_axis(t, "r")
    top = te.compute((b, h, s), lambda n, c, i: te.max_reduce(x[n, c, i, rm.var], [rm]),
                     name="attention_max", tag="reduce")
    e = te.compute((b, h, s, t),
                   lambda n, c, i, j: L.call("exp", _shifted(x[n, c, i, j] - top[n, c, i])),
                   name="attention_exp", tag="attention_exp")
    rs = te.reduce_axis(t, "r")
    row_sum = te.compute((b, h, s), lambda n, c, i: te.sum(e[n, c, i, rs.var], [rs]),
                         name="attention_sum", tag="reduce")
    # one division per row, then a multiplication per output (materialized by the schedule)
    total = te.compute((b, h, s), lambda n, c, i: L.const(1.0, q.dtype) / row_sum[n, c, i],
                       name="attention_inv", tag="attention_inv")
    if row_block(s) == 1 and isinstance(t, int) and t % CONTEXT_CHAINS == 0:
        # CONTEXT_CHAINS partial sums over interleaved keys (more independent FMA chains)
        p = CONTEXT_CHAINS
        rv = te.reduce_axis(t // p, "r")
        part = te.compute(
            (b, h, s, p, out_type.shape[3]),
            lambda n, c, i, q, k: te.sum(e[n, c, i, rv.var * p + q] * v[n, c, rv.var * p + q, k],
                                         [rv]),
            name="attention_context", tag="attention_context")

        def combine(n, c, i, k):
            acc = part[n, c, i, 0, k]
            for q in range(1, p):
                acc = acc + part[n, c, i, q, k]
            return acc * total[n, c, i]

        return te.compute(out_type.shape, combine, name="attention", tag="elemwise")
    rv = te.reduce_axis(t, "r")
    context = te.compute(
        out_type.shape, lambda n, c, i, k: te.sum(e[n, c, i, rv.var] * v[n, c, rv.var, k], [rv]),
        name="attention_context", tag="attention_context")
    return te.compute(out_type.shape, lambda n, c, i, k: context[n, c, i, k] * total[n, c, i],
                      name="attention", tag="elemwise")
