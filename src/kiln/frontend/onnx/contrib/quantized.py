"""The quantized ``com.microsoft`` ops onnxruntime's quantizers write, as standard ONNX ops.

``quantize_static`` writes QLinearAdd/Mul/Concat/Sigmoid/LeakyRelu/GlobalAveragePool in QOperator
format: each is ``QuantizeLinear(f(DequantizeLinear(x)...))`` here, the QDQ pattern Kiln's int8
passes already rewrite into integer kernels. ``quantize_dynamic`` writes DynamicQuantizeMatMul,
MatMulIntegerToFloat and DynamicQuantizeLSTM (an LSTM with those projections,
:mod:`kiln.frontend.onnx.recurrent_scan`); the 4-bit weight quantizer writes MatMulNBits
(semantics: onnxruntime ``docs/ContribOperators.md``, ``onnxruntime/contrib_ops/cpu/``).
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.onnx.contrib import Body, contrib_op
from kiln.frontend.onnx.recurrent_scan import Layer, recurrent_scan


def _dequantize(b: Body, x: int, scale: int, zero_point: int, **attrs) -> str:
    return b.op("DequantizeLinear", b.input(x), b.input(scale), b.input(zero_point), **attrs)


def _quantize(b: Body, y: str, scale: int, zero_point: int) -> str:
    return b.op("QuantizeLinear", y, b.input(scale), b.input(zero_point))


def _binary(op_type: str):
    def build(b: Body) -> None:
        total = b.op(op_type, _dequantize(b, 0, 1, 2), _dequantize(b, 3, 4, 5))
        b.output(0, _quantize(b, total, 6, 7))

    build.__doc__ = (f"``C = quantize({op_type}(dequantize(A), dequantize(B)))``; inputs A, "
                     "A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point.")
    return build


contrib_op("QLinearAdd")(_binary("Add"))
contrib_op("QLinearMul")(_binary("Mul"))


@contrib_op("QLinearSigmoid")
def qlinear_sigmoid(b: Body) -> None:
    """``Y = quantize(Sigmoid(dequantize(X)))``; inputs X, X_scale, X_zero_point, Y_scale,
    Y_zero_point."""
    b.output(0, _quantize(b, b.op("Sigmoid", _dequantize(b, 0, 1, 2)), 3, 4))


@contrib_op("QLinearLeakyRelu")
def qlinear_leaky_relu(b: Body) -> None:
    """``Y = quantize(LeakyRelu(dequantize(X), alpha))`` (alpha 0.01 by default)."""
    y = b.op("LeakyRelu", _dequantize(b, 0, 1, 2), alpha=float(b.attr("alpha", 0.01)))
    b.output(0, _quantize(b, y, 3, 4))


@contrib_op("QLinearGlobalAveragePool")
def qlinear_global_average_pool(b: Body) -> None:
    """The quantized GlobalAveragePool over every axis after the channels (``channels_last``:
    the channels are the last axis, as an NHWC model has them)."""
    x = _dequantize(b, 0, 1, 2)
    rank = len(b.input_type(0).shape)
    if b.attr("channels_last", 0):
        to_first = [0, rank - 1, *range(1, rank - 1)]
        pooled = b.op("GlobalAveragePool", b.op("Transpose", x, perm=to_first))
        y = b.op("Transpose", pooled, perm=[0, *range(2, rank), 1])
    else:
        y = b.op("GlobalAveragePool", x)
    b.output(0, _quantize(b, y, 3, 4))


@contrib_op("QLinearConcat")
def qlinear_concat(b: Body) -> None:
    """``Y = quantize(Concat(dequantize(X_i)...))``; inputs Y_scale, Y_zero_point, then a
    (X, X_scale, X_zero_point) triple per tensor."""
    count = (len(b.node.input) - 2) // 3
    parts = [_dequantize(b, 2 + 3 * k, 3 + 3 * k, 4 + 3 * k) for k in range(count)]
    y = b.op("Concat", *parts, axis=int(b.attr("axis")))
    b.output(0, _quantize(b, y, 0, 1))


def _scaled_integer_matmul(b: Body, a_q: str, a_zero_point: str, a_scale: str, w: str,
                           w_zero_point: str, w_scale: str) -> str:
    """``(MatMulInteger(A_q, B) as float) * (a_scale * b_scale)``, the multiplier formed
    first as onnxruntime does; b_scale and the zero point may be per column of B."""
    acc = b.op("MatMulInteger", a_q, w, a_zero_point, w_zero_point)
    return b.op("Mul", b.op("Cast", acc, to=1), b.op("Mul", a_scale, w_scale))


def _biased(b: Body, y: str, bias: int) -> str:
    return b.op("Add", y, b.input(bias)) if b.has_input(bias) else y


@contrib_op("DynamicQuantizeMatMul")
def dynamic_quantize_matmul(b: Body) -> None:
    """``A @ dequantize(B)``, with A quantized to uint8 per call as DynamicQuantizeLinear does;
    inputs A (float), B (int8/uint8), b_scale, b_zero_point, bias (the last two optional)."""
    a_q, a_scale, a_zero_point = b.op("DynamicQuantizeLinear", b.input(0), outputs=3)
    y = _scaled_integer_matmul(b, a_q, a_zero_point, a_scale, b.input(1), b.input(3),
                               b.input(2))
    b.output(0, _biased(b, y, 4))


@contrib_op("MatMulIntegerToFloat")
def matmul_integer_to_float(b: Body) -> None:
    """``MatMulInteger(A, B, a_zero_point, b_zero_point) * a_scale * b_scale (+ bias)`` as
    float; inputs A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias."""
    y = _scaled_integer_matmul(b, b.input(0), b.input(4), b.input(2), b.input(1), b.input(5),
                               b.input(3))
    b.output(0, _biased(b, y, 6))


def _unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> their ``8 // bits`` codes each, the low bits first (the last axis grows
    by that factor)."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


def _nbits_weight(b: Body) -> np.ndarray:
    """MatMulNBits' B dequantized: float32 [K, N] (``(code - zero_point) * scale`` per block of
    ``block_size`` along K)."""
    k, n = int(b.attr("K")), int(b.attr("N"))
    bits, block = int(b.attr("bits", 4)), int(b.attr("block_size"))
    if bits not in (2, 4, 8):
        raise b.unsupported(f"bits={bits} (2, 4 or 8)")
    if b.has_input(4):
        raise b.unsupported("g_idx (input 4) is not supported")
    blocks = -(-k // block)
    codes = _unpack_codes(b.constant(1, "B").reshape(n, blocks, -1), bits).astype(np.float32)
    scales = b.constant(2, "scales").astype(np.float32).reshape(n, blocks, 1)
    if not b.has_input(3):
        zero = np.float32(1 << (bits - 1))
    else:
        raw = b.constant(3, "zero_points")
        if raw.dtype == np.uint8:  # packed like B, each row padded to whole bytes
            zero = _unpack_codes(raw.reshape(n, -1), bits)[:, :blocks].astype(np.float32)
        else:
            zero = raw.astype(np.float32).reshape(n, blocks)
        zero = zero.reshape(n, blocks, 1)
    weight = ((codes - zero) * scales).reshape(n, blocks * block)[:, :k]
    return np.ascontiguousarray(weight.T)


@contrib_op("MatMulNBits")
def matmul_nbits(b: Body) -> None:
    """``A @ dequantize(B)^T (+ bias)`` with B block-quantized to 2/4/8 bits along K; the
    constant weight is dequantized once, at compile time, to float32 [K, N]. With
    ``accuracy_level=4`` A is first rounded to int8 per block of K (:func:`_int8_blocks`), as
    onnxruntime computes it."""
    dtype = np.dtype(b.input_type(0).dtype)
    a = b.input(0)
    if _int8_activations(b):
        a = _int8_blocks(b, a, int(b.attr("K")), int(b.attr("block_size")))
    y = b.op("MatMul", a, b.const(_nbits_weight(b).astype(dtype)))
    b.output(0, b.op("Add", y, b.input(5)) if b.has_input(5) else y)


def _int8_activations(b: Body) -> bool:
    """Whether onnxruntime quantizes A to int8 here: ``accuracy_level`` 4 ("A can be quantized
    with the same block_size to int8"), where MLAS has an int8 kernel (``CompInt8``) for the
    weight's bits and block: 4 and 8 bits in any block, 2 bits in blocks of 32 and more (in
    blocks of 16 it computes in float; measured against onnxruntime 1.31, docs/decisions/055)."""
    if int(b.attr("accuracy_level", 0)) != 4:
        return False
    bits, block = int(b.attr("bits", 4)), int(b.attr("block_size"))
    return bits in (4, 8) or block >= 32


def _int8_blocks(b: Body, a: str, k: int, block: int) -> str:
    """A [..., K] rounded to int8 per block of ``block`` along K and scaled back, as MLAS's
    ``QuantizeARow_CompInt8`` quantizes it: scale ``amax / 127``, codes round-half-even of
    ``a · 127 / amax`` (0 where a block is all zeros; a partial last block on its own). The
    integer products of those codes with B's times the two scales are the float products of the
    rounded A with the dequantized B up to float32 summation order, so the MatMul stays a float
    MatMul."""
    blocks = -(-k // block)
    rank, dtype = len(b.input_type(0).shape), np.dtype(b.input_type(0).dtype)
    x = a
    if blocks * block != k:  # zeros change neither a block's amax nor the products
        x = b.op("Pad", x, b.const([0] * (2 * rank - 1) + [blocks * block - k]))
    x = b.op("Reshape", x, b.const([0] * (rank - 1) + [blocks, block]))
    amax = b.op("ReduceMax", b.op("Abs", x), b.const([-1]))
    zero = b.op("Equal", amax, b.const(0.0, dtype))
    inverse = b.op("Where", zero, b.const(0.0, dtype), b.op("Div", b.const(127.0, dtype), amax))
    codes = b.op("Round", b.op("Mul", x, inverse))
    x = b.op("Mul", codes, b.op("Div", amax, b.const(127.0, dtype)))
    x = b.op("Reshape", x, b.const([0] * (rank - 1) + [blocks * block]))
    if blocks * block != k:
        x = b.op("Slice", x, b.const([0]), b.const([k]), b.const([-1]))
    return x


class _DynamicQuantizeLSTMLayer(Layer):
    """The LSTM of a DynamicQuantizeLSTM node as onnxruntime computes it (``DeepCpuLstmOp``
    with quantized weights, ``onnxruntime/core/providers/cpu/rnn/uni_directional_lstm.cc`` and
    ``rnn_helpers.cc``'s quantized ``ComputeGemm``): X is quantized to uint8 once over the whole
    sequence, and ``h`` once per step, each as DynamicQuantizeLinear does; each product is an
    integer matrix product with the int8/uint8 W or R [D, in, 4H] scaled by
    ``a_scale * w_scale`` (per direction, or per direction and column); the step adds
    ``X W^T + h R^T`` first and ``Wb + Rb`` after."""

    op = "LSTM"

    def input_projection(self, d: int) -> str:
        b = self.b
        x_q, x_scale, x_zero_point = b.op("DynamicQuantizeLinear", self.x, outputs=3)
        return _scaled_integer_matmul(b, x_q, x_zero_point, x_scale, *self._weight(1, 8, 9, d))

    def recurrent_weights(self, d: int) -> tuple:
        wb, rb = self.bias(d, 0), self.bias(d, 1)
        bias = self.b.op("Add", wb, rb) if wb else None
        return (*self._weight(2, 10, 11, d), bias)

    def lstm_preactivation(self, s: Body, xw_t: str, h: str, weights: tuple) -> str:
        *weight, bias = weights
        h_q, h_scale, h_zero_point = s.op("DynamicQuantizeLinear", h, outputs=3)
        pre = s.op("Add", xw_t, _scaled_integer_matmul(s, h_q, h_zero_point, h_scale, *weight))
        return s.op("Add", pre, bias) if bias else pre

    def _weight(self, w: int, scale: int, zero_point: int, d: int) -> tuple[str, str, str]:
        """Direction ``d`` of W or R [in, 4H], its zero point and its scale (scalars, or
        [4H] per column)."""
        return self.take(w, d), self.take(zero_point, d), self.take(scale, d)


@contrib_op("DynamicQuantizeLSTM")
def dynamic_quantize_lstm(b: Body) -> None:
    """An ONNX LSTM whose projections quantize X (once) and h (every step) to uint8 and
    multiply them with the int8/uint8 W [D, in, 4H] and R [D, hidden, 4H] in integers, as
    onnxruntime does (``_DynamicQuantizeLSTMLayer``); inputs X, W, R, B, sequence_lens,
    initial_h, initial_c, P, W_scale, W_zero_point, R_scale, R_zero_point. onnxruntime
    quantizes ``h`` per thread's share of the batch when it splits a batch over threads
    (batch > 4, or 2-4 with hidden <= 256); Kiln quantizes the whole batch, as onnxruntime does
    on one thread."""
    for k, what in ((9, "W_zero_point"), (11, "R_zero_point")):
        _check_lstm_zero_point(b, k, what)
    recurrent_scan(b, _DynamicQuantizeLSTMLayer)


def _check_lstm_zero_point(b: Body, k: int, what: str) -> None:
    """onnxruntime's checks of a per-column weight zero point [D, 4H] (its kernel uses one
    zero point per direction): all 0 for int8 weights, one value for uint8 ones."""
    if len(b.input_type(k).shape) != 2:
        return
    zero_point = b.constant(k, what)
    if b.input_type(k).dtype == "int8" and np.any(zero_point):
        raise b.unsupported(f"{what}: a per-column zero point of int8 weights must be 0 (as "
                            "onnxruntime requires)")
    if np.any(zero_point != zero_point.reshape(-1)[0]):
        raise b.unsupported(f"{what}: a per-column zero point of uint8 weights must be one "
                            "value (as onnxruntime requires)")
