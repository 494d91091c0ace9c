"""Weight-only quantized dense ops and their weight formats (docs/decisions/018).

A dense ``y[M, N] = x[M, K] · W[N, K]ᵀ`` whose constant weight is stored in a few bits and
dequantized inside the kernel (the activations stay float32):

- ``nn.dense_q8(data, qweight, scale)``: symmetric int8 per output channel.
  ``data`` float32 ``[M, K]``; ``qweight`` int8 ``[N/b, K, b]`` (``q[n, k]`` at
  ``[n // b, k, n % b]``: ``b`` consecutive output channels side by side for each ``k``, the
  ``dense_pack`` layout); ``scale`` float32 ``[N]``.
  ``y[m, n] = scale[n] · Σ_k x[m, k] · float(q[n, k])``.
- ``nn.dense_q4(data, qweight, d, m)``: GGUF's Q4_1 blocks (32 consecutive ``k`` of one output
  channel, ``w ≈ d · q + m`` with ``q`` in 0..15). ``qweight`` uint32 ``[N/b, K/8, b]``: the
  word at ``[n // b, k // 8, n % b]`` holds ``q[n, k]`` in its bits ``4 (k % 8)`` to
  ``4 (k % 8) + 3`` (:func:`pack_nibble_words`: one 32-bit lane per output channel, so a
  vector load brings eight ``k`` of ``b`` channels and a mask isolates one ``k``); ``d`` and
  ``m`` float16 ``[N/b, K/32, b]`` (block ``k // 32``; widened to float32 in the kernel).
  ``y[m, n] = Σ_k x[m, k] · (d[n, k // 32] · q[n, k] + m[n, k // 32])``.

The Q4_1 format is ggml's (llama.cpp ``ggml/src/ggml-quants.c``, ``quantize_row_q4_1_ref`` and
``dequantize_row_q4_1``: per block of 32, ``d = (max - min) / 15``, ``m = min``,
``q = min(15, (int)((w - min) · (1/d) + 0.5))``). ``d`` and ``m`` are float16 as ggml stores
them (0.625 bytes a weight in all); ggml pairs ``k`` with ``k + 16`` in a byte, here the
nibbles are repacked along output channels for vector loads. A block that was itself
dequantized from Q4_1 (float16 ``d`` and ``m``, ``q`` spanning 0..15) quantizes back to the
same ``q``, ``d`` and ``m`` exactly (:func:`quantize_q4_1`).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_rank
from kiln.relay.op.nn import pack_dense_weight, unpack_dense_weight
from kiln.relay.op_registry import OpPattern, register_op
from kiln.topi.weight_quant import Q4_BLOCK, Q4_WORD

#: largest int8 magnitude of the symmetric format (-128 is never used: ``-q`` stays in range)
Q8_MAX = 127


# ---------------------------------------------------------------------------------------------
# formats (numpy, compile time)


def quantize_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of a dense weight.

    Parameters
    ----------
    weight : float32 ``[N, K]``

    Returns
    -------
    q : int8 ``[N, K]``, ``round(W / scale)`` clipped to [-127, 127] (round half to even)
    scale : float32 ``[N]``, ``max_k |W[n, k]| / 127`` (1 for an all-zero channel)
    """
    w = weight.astype(np.float32, copy=False)
    scale = np.abs(w).max(axis=1) / np.float32(Q8_MAX)
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -Q8_MAX, Q8_MAX).astype(np.int8)
    return q, scale


def quantize_q4_1(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q4_1 quantization of a dense weight, blocks of 32 consecutive ``k``.

    Parameters
    ----------
    weight : float32 ``[N, K]``, ``K`` a multiple of 32, ``|W|`` below
        :data:`Q4_MAX_MAGNITUDE` (float16's range).

    Returns
    -------
    q : uint8 ``[N, K]`` in 0..15
    d, m : float16 ``[N, K / 32]``: ``W ≈ d · q + m`` per block

    As ggml's ``quantize_row_q4_1_ref``: ``q`` from the float32 ``d`` and ``min``
    (``(w - min) · (1/d) + 0.5`` truncated, at most 15), then ``d`` and ``min`` stored as
    float16. A block dequantized from a GGUF file (float16 ``d`` and ``m``) so round-trips bit
    for bit.

    Raises
    ------
    ShapeError
        ``K`` not a multiple of 32, or a weight outside float16's range.
    """
    n, k = weight.shape
    if k % Q4_BLOCK:
        raise ShapeError(f"Q4_1 needs K a multiple of {Q4_BLOCK}, got weight {weight.shape}")
    w = weight.astype(np.float32, copy=False).reshape(n, k // Q4_BLOCK, Q4_BLOCK)
    if not q4_representable(w):
        raise ShapeError(f"Q4_1 stores float16 scales: weight {weight.shape} has values beyond "
                         f"±{Q4_MAX_MAGNITUDE:g} or not finite")
    lo, hi = w.min(axis=2), w.max(axis=2)
    d = (hi - lo) / np.float32(15)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    scaled = (w - lo[..., None]) * inv[..., None] + np.float32(0.5)
    q = np.minimum(np.trunc(scaled), 15).astype(np.uint8)
    return q.reshape(n, k), d.astype(np.float16), lo.astype(np.float16)


#: the largest weight magnitude Q4_1 takes: its ``min`` and ``d`` must be finite float16
#: (a block's ``d`` is at most ``2 · max|w| / 15``)
Q4_MAX_MAGNITUDE = float(np.finfo(np.float16).max)


def q4_representable(weight: np.ndarray) -> bool:
    """Whether every value is finite and within :data:`Q4_MAX_MAGNITUDE` (float16 ``d`` and
    ``m``)."""
    return bool(np.all(np.abs(weight) <= Q4_MAX_MAGNITUDE))


def _dequantize_blocks(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``d · q + m`` in float32 over ``[N, K/32, 32]`` blocks (``d``, ``m`` widened)."""
    d, m = d.astype(np.float32), m.astype(np.float32)
    return q.astype(np.float32) * d[..., None] + m[..., None]


def dequantize_q4_1(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``[N, K]`` uint8 ``q``, ``[N, K/32]`` ``d`` and ``m`` (float16 or float32) → float32
    ``[N, K]`` weight."""
    n, k = q.shape
    return _dequantize_blocks(q.reshape(n, k // Q4_BLOCK, Q4_BLOCK), d, m).reshape(n, k)


def pack_nibbles(q: np.ndarray, block: int) -> np.ndarray:
    """uint8 ``[N, K]`` in 0..15 → uint8 ``[N/b, K/2, b]``: ``k`` even in the low nibble,
    ``k + 1`` in the high nibble of one byte."""
    pairs = q[:, 0::2] | (q[:, 1::2] << 4)
    return pack_dense_weight(pairs.astype(np.uint8), block)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 ``[N/b, K/2, b]`` → uint8 ``[N, K]`` (the inverse of :func:`pack_nibbles`)."""
    pairs = unpack_dense_weight(packed)
    q = np.empty((pairs.shape[0], 2 * pairs.shape[1]), np.uint8)
    q[:, 0::2], q[:, 1::2] = pairs & 15, pairs >> 4
    return q


def pack_nibble_words(q: np.ndarray, block: int) -> np.ndarray:
    """uint8 ``[N, K]`` in 0..15 → uint32 ``[N/b, K/8, b]``, ``q[n, k]`` at bits ``4 (k % 8)``
    of word ``[n // b, k // 8, n % b]`` (``nn.dense_q4``'s ``qweight``)."""
    n, k = q.shape
    nib = q.reshape(n, k // Q4_WORD, Q4_WORD).astype(np.uint32)
    words = np.bitwise_or.reduce(nib << (4 * np.arange(Q4_WORD, dtype=np.uint32)), axis=2)
    return pack_dense_weight(words.astype(np.uint32), block)


def unpack_nibble_words(packed: np.ndarray) -> np.ndarray:
    """uint32 ``[N/b, K/8, b]`` → uint8 ``[N, K]`` (the inverse of :func:`pack_nibble_words`)."""
    words = unpack_dense_weight(packed)
    nib = (words[..., None] >> (4 * np.arange(Q4_WORD, dtype=np.uint32))) & 15
    return nib.reshape(words.shape[0], -1).astype(np.uint8)


def dense_q8_weight(qweight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float32 ``[N, K]`` weight that ``nn.dense_q8`` operands stand for."""
    return unpack_dense_weight(qweight).astype(np.float32) * scale[:, None]


def dense_q4_weight(qweight: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The float32 ``[N, K]`` weight that ``nn.dense_q4`` operands stand for."""
    return dequantize_q4_1(unpack_nibble_words(qweight), unpack_dense_weight(d),
                           unpack_dense_weight(m))


# ---------------------------------------------------------------------------------------------
# ops


def _check_data(data: TensorType) -> None:
    expect_rank(data, 2, "data")
    if data.dtype != "float32":
        raise ShapeError(f"data must be float32, got {data.dtype}")


def _expect(t: TensorType, dtype: str, shape: tuple, what: str) -> None:
    if t.dtype != dtype or t.shape != shape:
        raise ShapeError(f"{what}: expected {dtype} {shape}, got {t.dtype} {t.shape}")


def _dense_q8_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    data, qweight, scale = arg_types
    _check_data(data)
    expect_rank(qweight, 3, "qweight")
    nb, _, b = qweight.shape
    _expect(qweight, "int8", (nb, data.shape[1], b), "qweight")
    _expect(scale, "float32", (nb * b,), "scale")
    return TensorType((data.shape[0], nb * b), "float32")


def _dense_q8_ref(data: np.ndarray, qweight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    q = unpack_dense_weight(qweight).astype(np.float32)
    return (np.matmul(data, q.T) * scale).astype(np.float32)


register_op("nn.dense_q8", _dense_q8_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _dense_q8_ref)


def _dense_q4_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 4)
    data, qweight, d, m = arg_types
    _check_data(data)
    expect_rank(qweight, 3, "qweight")
    nb, _, b = qweight.shape
    k = data.shape[1]
    if not isinstance(k, int) or k % Q4_BLOCK:
        raise ShapeError(f"dense_q4: K must be a multiple of {Q4_BLOCK}, got {k}")
    _expect(qweight, "uint32", (nb, k // Q4_WORD, b), "qweight")
    _expect(d, "float16", (nb, k // Q4_BLOCK, b), "d")
    _expect(m, "float16", (nb, k // Q4_BLOCK, b), "m")
    return TensorType((data.shape[0], nb * b), "float32")


def _dense_q4_ref(data: np.ndarray, qweight: np.ndarray, d: np.ndarray,
                  m: np.ndarray) -> np.ndarray:
    return np.matmul(data, dense_q4_weight(qweight, d, m).T).astype(np.float32)


register_op("nn.dense_q4", _dense_q4_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _dense_q4_ref)
