"""The ``com.microsoft`` ops of onnxruntime's transformers optimizer, as standard ONNX ops:
Gelu/FastGelu/BiasGelu/QuickGelu, FusedMatMul, SkipLayerNormalization and its RMS form,
EmbedLayerNormalization and Attention (semantics: onnxruntime ``docs/ContribOperators.md``)."""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.contrib import Body, contrib_op


def _gelu(b: Body, x: str, approximate: str) -> str:
    return b.op("Gelu", x, approximate=approximate)


def _biased(b: Body, x: str, bias_input: int) -> str:
    return b.op("Add", x, b.input(bias_input)) if b.has_input(bias_input) else x


@contrib_op("Gelu")
def gelu(b: Body) -> None:
    """``0.5 x (1 + erf(x / sqrt 2))``."""
    b.output(0, _gelu(b, b.input(0), "none"))


@contrib_op("BiasGelu")
def bias_gelu(b: Body) -> None:
    """``Gelu(A + B)`` (erf form), B broadcast over A's last axis."""
    b.output(0, _gelu(b, b.op("Add", b.input(0), b.input(1)), "none"))


@contrib_op("FastGelu")
def fast_gelu(b: Body) -> None:
    """The tanh approximation of Gelu of ``X + bias`` (bias optional)."""
    b.output(0, _gelu(b, _biased(b, b.input(0), 1), "tanh"))


@contrib_op("QuickGelu")
def quick_gelu(b: Body) -> None:
    """``x * sigmoid(alpha x)``, alpha 1.702 by default."""
    x = b.input(0)
    alpha = float(b.attr("alpha", 1.702))
    dtype = np.dtype(b.input_type(0).dtype)
    scaled = b.op("Mul", x, b.const(np.array(alpha, dtype=dtype)))
    b.output(0, b.op("Mul", x, b.op("Sigmoid", scaled)))


def _swap_last_two(b: Body, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.op("Transpose", x, perm=perm)


@contrib_op("FusedMatMul")
def fused_matmul(b: Body) -> None:
    """``alpha * op(A) @ op(B)`` where op transposes the last two axes when transA/transB
    is set. The batch-transposing forms (transBatchA/B) are refused."""
    if b.attr("transBatchA", 0) or b.attr("transBatchB", 0):
        raise b.unsupported("transBatchA/transBatchB are not supported")
    a, w = b.input(0), b.input(1)
    if b.attr("transA", 0):
        a = _swap_last_two(b, a, len(b.input_type(0).shape))
    if b.attr("transB", 0):
        w = _swap_last_two(b, w, len(b.input_type(1).shape))
    y = b.op("MatMul", a, w)
    alpha = float(b.attr("alpha", 1.0))
    if alpha != 1.0:
        y = b.op("Mul", y, b.const(np.array(alpha, dtype=np.dtype(b.input_type(0).dtype))))
    b.output(0, y)


def _skip_sum(b: Body) -> str:
    """``input + skip (+ bias)``: inputs 0, 1 and the bias at input 4 (3 for the RMS form)."""
    total = b.op("Add", b.input(0), b.input(1))
    bias = 3 if b.node.op_type == "SkipSimplifiedLayerNormalization" else 4
    return _biased(b, total, bias)


@contrib_op("SkipLayerNormalization")
def skip_layer_norm(b: Body) -> None:
    """LayerNormalization over the last axis of ``input + skip + bias`` with gamma and beta;
    outputs: the result, mean, inverse std dev (shape of input with the last axis 1), and the
    sum itself (what the next SkipLayerNormalization takes as its skip)."""
    total = _skip_sum(b)
    scale_bias = [b.input(2)] + ([b.input(3)] if b.has_input(3) else [])
    y, mean, inv_std = b.op("LayerNormalization", total, *scale_bias, outputs=3, axis=-1,
                            epsilon=float(b.attr("epsilon", 1e-12)))
    b.output(0, y)
    b.output(1, mean)
    b.output(2, inv_std)
    b.output(3, total)


def _rms_norm(b: Body, x: str, gamma: str, epsilon: float) -> tuple[str, str]:
    """``x / sqrt(mean(x^2) + epsilon) * gamma`` over the last axis; (y, inverse rms)."""
    dtype = np.dtype(b.input_type(0).dtype)
    mean_square = b.op("ReduceMean", b.op("Mul", x, x), b.const([-1]), keepdims=1)
    inv_rms = b.op("Reciprocal", b.op("Sqrt", b.op(
        "Add", mean_square, b.const(np.array(epsilon, dtype=dtype)))))
    return b.op("Mul", b.op("Mul", x, inv_rms), gamma), inv_rms


@contrib_op("SkipSimplifiedLayerNormalization")
def skip_simplified_layer_norm(b: Body) -> None:
    """RMS normalization (no mean, no beta) of ``input + skip + bias``; outputs: the result,
    (mean: unused by onnxruntime, refused), inverse rms, the sum."""
    if b.wants_output(1):
        raise b.unsupported("output 1 (mean) is not produced by the simplified form")
    total = _skip_sum(b)
    y, inv_rms = _rms_norm(b, total, b.input(2), float(b.attr("epsilon", 1e-12)))
    b.output(0, y)
    b.output(2, inv_rms)
    b.output(3, total)


@contrib_op("EmbedLayerNormalization")
def embed_layer_norm(b: Body) -> None:
    """BERT's embedding layer: ``LayerNorm(word[input_ids] + position[position_ids or 0..S-1]
    + segment[segment_ids])``; output 1 (mask_index, int32 [B]) is the number of 1s in each
    row of the mask; output 2 the sum before the normalization.

    Inputs: input_ids (int32 [B, S]), segment_ids (optional, [B, S]), word_embedding [V, H],
    position_embedding [P, H], segment_embedding (optional), gamma [H], beta [H], mask
    (optional, int32 [B, S]), position_ids (optional, [B, S] or [1, S]).
    """
    ids = b.input(0)
    total = b.op("Gather", b.input(2), ids, axis=0)
    if b.has_input(8):
        positions = b.op("Gather", b.input(3), b.input(8), axis=0)
    else:  # rows 0..S-1 of the position table, broadcast over the batch
        length = b.op("Slice", b.op("Shape", ids), b.const([1]), b.const([2]))
        positions = b.op("Unsqueeze", b.op("Slice", b.input(3), b.const([0]), length,
                                           b.const([0])), b.const([0]))
    total = b.op("Add", total, positions)
    if b.has_input(1) and b.has_input(4):
        total = b.op("Add", total, b.op("Gather", b.input(4), b.input(1), axis=0))
    y = b.op("LayerNormalization", total, b.input(5), b.input(6), axis=-1,
             epsilon=float(b.attr("epsilon", 1e-12)))
    b.output(0, y)
    if b.wants_output(1):
        if not b.has_input(7):
            raise b.unsupported("output 1 (mask_index) needs input 7 (mask)")
        rows = b.op("ReduceSum", b.op("Cast", b.input(7), to=6), b.const([1]), keepdims=0)
        b.output(1, rows)
    b.output(2, total)


def _heads(b: Body, x: str, num_heads: int, width: int, perm: list[int]) -> str:
    """[B, S, width] -> [B, N, S, width/N] (or with ``perm`` [0, 2, 3, 1], K transposed)."""
    split = b.op("Reshape", x, b.const([0, 0, num_heads, width // num_heads]))
    return b.op("Transpose", split, perm=perm)


def _key_mask(b: Body, mask: str, keys: str, dtype: np.dtype) -> str:
    """The additive mask [B, 1, 1, S_kv] of a 2-D raw mask (1 attend, 0 not) or a 1-D mask of
    end positions (keys at and past the position are masked), 0 where attended."""
    rank = len(b.input_type(3).shape)
    if rank == 2:
        keep = b.op("Cast", mask, to=1)
    elif rank == 1:
        length = b.op("Squeeze", b.op("Slice", b.op("Shape", keys), b.const([1]), b.const([2])),
                      b.const([0]))
        index = b.op("Range", b.const(np.array(0, np.int32)),
                     b.op("Cast", length, to=6), b.const(np.array(1, np.int32)))
        keep = b.op("Cast", b.op("Less", b.op("Unsqueeze", index, b.const([0])),
                                 b.op("Unsqueeze", b.op("Cast", mask, to=6), b.const([1]))),
                    to=1)
    else:
        raise b.unsupported(f"a {rank}-D mask_index (only 1-D end positions or a 2-D mask)")
    one = b.const(np.array(1, dtype))
    fill = b.const(np.array(float(b.attr("mask_filter_value", -10000.0)), dtype))
    additive = b.op("Mul", b.op("Sub", one, b.op("Cast", keep, to=1)), fill)
    return b.op("Unsqueeze", additive, b.const([1, 2]))


def _causal_mask(b: Body, scores: str, dtype: np.dtype) -> str:
    """mask_filter_value above the diagonal of the last two axes of ``scores``, else 0."""
    shape = b.op("Shape", scores)
    rows = b.op("Squeeze", b.op("Slice", shape, b.const([2]), b.const([3])), b.const([0]))
    cols = b.op("Squeeze", b.op("Slice", shape, b.const([3]), b.const([4])), b.const([0]))
    i = b.op("Range", b.const(np.array(0, np.int64)), rows, b.const(np.array(1, np.int64)))
    j = b.op("Range", b.const(np.array(0, np.int64)), cols, b.const(np.array(1, np.int64)))
    future = b.op("Less", b.op("Unsqueeze", i, b.const([1])), b.op("Unsqueeze", j,
                                                                    b.const([0])))
    fill = b.const(np.array(float(b.attr("mask_filter_value", -10000.0)), dtype))
    return b.op("Mul", b.op("Cast", future, to=1), fill)


@contrib_op("Attention")
def attention(b: Body) -> None:
    """Multi-head self-attention of BERT/GPT-2 exports: ``input @ weights + bias`` split into
    Q, K, V (``qkv_hidden_sizes`` or three equal parts), ``num_heads`` heads, scores scaled by
    ``scale`` (default 1/sqrt(head size)), an optional key mask (``mask_index``: 2-D raw mask
    or 1-D end positions, masked scores get ``mask_filter_value``), an optional
    ``attention_bias`` and a causal mask with ``unidirectional``. A past state (input 4,
    output 1), 3-D/4-D masks and rotary embeddings are refused."""
    if b.has_input(4) or b.wants_output(1) or b.has_input(6):
        raise b.unsupported("past/present state is not supported")
    if b.attr("do_rotary", 0):
        raise b.unsupported("do_rotary is not supported")
    num_heads = int(b.attr("num_heads"))
    width = b.input_type(1).shape[1]
    sizes = list(b.attr("qkv_hidden_sizes", None) or [width // 3] * 3)
    dtype = np.dtype(b.input_type(0).dtype)
    qkv = _biased(b, b.op("MatMul", b.input(0), b.input(1)), 2)
    q, k, v = b.op("Split", qkv, b.const(sizes), axis=-1, outputs=3)
    q = _heads(b, q, num_heads, sizes[0], [0, 2, 1, 3])
    k_t = _heads(b, k, num_heads, sizes[1], [0, 2, 3, 1])
    v = _heads(b, v, num_heads, sizes[2], [0, 2, 1, 3])
    scale = float(b.attr("scale", 0.0)) or 1.0 / float(np.sqrt(sizes[0] // num_heads))
    scores = b.op("Mul", b.op("MatMul", q, k_t), b.const(np.array(scale, dtype)))
    if b.has_input(3):
        scores = b.op("Add", scores, _key_mask(b, b.input(3), b.input(0), dtype))
    if b.has_input(5):
        scores = b.op("Add", scores, b.input(5))
    if b.attr("unidirectional", 0):
        scores = b.op("Add", scores, _causal_mask(b, scores, dtype))
    context = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
    merged = b.op("Transpose", context, perm=[0, 2, 1, 3])
    b.output(0, b.op("Reshape", merged, b.const([0, 0, sizes[2]])))
