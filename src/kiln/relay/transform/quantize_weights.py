"""QuantizeWeights: weight-only quantization of dense layers with constant weights
(docs/decisions/018).

Each ``nn.dense(x, W)`` whose weight ``W`` is a float32 Constant ``[N, K]`` with ``N`` and ``K``
at least :data:`MIN_DIM` becomes

- mode ``"int8"``: ``nn.dense_q8(x, q, scale)``, symmetric int8 per output channel;
- mode ``"q4"``: ``nn.dense_q4(x, q, d, m)``, GGUF Q4_1 blocks of 32 ``k`` (a weight whose ``K``
  is not a multiple of 32 stays float32: no padding; so does one with values beyond float16's
  range, which its float16 ``d`` and ``m`` cannot hold). A vocabulary projection (at least
  :data:`Q4_HEAD_CHANNELS` output channels) gets int8 instead, as llama.cpp's 4-bit files keep
  their output head at 6 or 8 bits: SmolLM2 with a 4-bit head answered "What is the capital of
  France?" with "L'Étoile", with an int8 head "Paris", as onnxruntime on the float model;

with the quantized weight packed here, in numpy, in blocks of output channels as
AlterOpLayout packs float ones (``dense_pack``: two SIMD vectors of the current target). ONNX
MatMul with a weight initializer arrives as such a dense (the frontend transposes the weight,
FoldConstant folds the transpose). The formats are on :mod:`kiln.relay.op.weight_quant`.

Run after BindParams and FoldConstant (weights must be constants), before AlterOpLayout (which
would pack the float weight otherwise) and FuseOps (bias adds fuse into the quantized kernels).
"""

from __future__ import annotations

from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Expr, Function, rewrite, same_call
from kiln.relay.op.nn import pack_dense_weight
from kiln.relay.op.weight_quant import (
    Q4_BLOCK,
    pack_nibble_words,
    q4_representable,
    quantize_int8,
    quantize_q4_1,
)
from kiln.relay.transform.alter_op_layout import dense_block_limit

name = "QuantizeWeights"

#: the modes: int8 per output channel, GGUF Q4_1
MODES = ("int8", "q4")
#: Weights with fewer output channels or reduction steps stay float32: the bytes saved are few
#: and the quantization error of small layers (heads, gates) weighs more.
MIN_DIM = 64
#: in mode "q4", weights with this many output channels or more (an LM head over a vocabulary)
#: are quantized to int8
Q4_HEAD_CHANNELS = 16384


def quantize_weights(func: Function, mode: str) -> Function:
    """``func`` with its large constant dense weights quantized (see the module doc).

    Parameters
    ----------
    func : the graph, weights bound as Constants (after BindParams and FoldConstant).
    mode : ``"int8"`` or ``"q4"``.

    Raises
    ------
    CompileError
        An unknown mode.
    """
    if mode not in MODES:
        raise CompileError(f"unknown weight quantization {mode!r}: expected one of {MODES}")

    def visit(call: Call, args: list[Expr]) -> Expr:
        if call.op.name == "nn.dense" and _quantizable(args[1], mode):
            return _quantized_dense(call, args, mode)
        return same_call(call, args)

    return rewrite(func, visit)


def _quantizable(weight: Expr, mode: str) -> bool:
    if not isinstance(weight, Constant) or weight.checked_type.dtype != "float32":
        return False
    n, k = weight.checked_type.shape
    if min(n, k) < MIN_DIM:
        return False
    if mode != "q4":
        return True
    # a q4 model's head is int8, which holds any finite scale
    return k % Q4_BLOCK == 0 and (n >= Q4_HEAD_CHANNELS or q4_representable(weight.data))


def _channel_block(n: int) -> int:
    """Output channels of a packed block: the float dense's (``dense_block_limit``), halved
    until it divides ``n``."""
    block = dense_block_limit()
    while n % block:
        block //= 2
    return block


def _quantized_dense(call: Call, args: list[Expr], mode: str) -> Call:
    data, weight = args
    w = weight.data
    block = _channel_block(w.shape[0])

    def const(value, suffix: str) -> Constant:
        return Constant(value, f"{weight.name}_{suffix}" if weight.name else None)

    if mode == "int8" or w.shape[0] >= Q4_HEAD_CHANNELS:
        q, scale = quantize_int8(w)
        operands = [const(pack_dense_weight(q, block), "q8"), const(scale, "scale")]
        return Call("nn.dense_q8", [data, *operands], {}, call.span)
    q, d, m = quantize_q4_1(w)
    operands = [const(pack_nibble_words(q, block), "q4"), const(pack_dense_weight(d, block), "d"),
                const(pack_dense_weight(m, block), "m")]
    return Call("nn.dense_q4", [data, *operands], {}, call.span)
