"""``nn.attention``: scaled dot-product attention of one layer's heads in one op.

``nn.attention(q, kt, v, mask; scale)`` with ``q`` ``[B, H, S, D]``, ``kt`` ``[B, H, D, T]``
(the keys transposed, as an exported BERT's ``Transpose(perm=[0, 2, 3, 1])`` makes them), ``v``
``[B, H, T, E]`` and ``mask`` broadcastable to ``[B, H, S, T]`` (an additive mask; a scalar 0
where the model has none), all one float dtype:
``softmax(q · kt · scale + mask, axis=-1) · v`` → ``[B, H, S, E]``. Made by
:mod:`kiln.relay.transform.fuse_attention` from the MatMul / Div / Add / Softmax / MatMul chain;
computed by blocks of query rows without materializing the ``[B, H, S, T]`` scores
(kiln.topi.attention, docs/decisions/025-fused-attention.md).
"""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import broadcast_shapes, expect_arity, expect_float, same_dtype
from kiln.relay.op_registry import OpPattern, register_op


def _same(a, b) -> bool:
    return arith.sub(a, b) == 0


def _attention_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 4)
    q, kt, v, mask = arg_types
    dtype = same_dtype(arg_types)
    expect_float(q)
    if not (q.ndim == kt.ndim == v.ndim == 4):
        raise ShapeError(f"nn.attention: q, kt, v must be rank 4, got {q.shape}, {kt.shape}, "
                         f"{v.shape}")
    b, h, s, d = q.shape
    ok = (_same(kt.shape[0], b) and _same(kt.shape[1], h) and _same(kt.shape[2], d)
          and _same(v.shape[0], b) and _same(v.shape[1], h) and _same(v.shape[2], kt.shape[3]))
    if not ok:
        raise ShapeError(f"nn.attention: q {q.shape}, kt {kt.shape}, v {v.shape} do not agree")
    scores = (b, h, s, kt.shape[3])
    if mask.ndim > 4 or broadcast_shapes(scores, mask.shape) != scores:
        raise ShapeError(f"nn.attention: mask {mask.shape} does not broadcast to {scores}")
    return TensorType((b, h, s, v.shape[3]), dtype)


def _attention_ref(q, kt, v, mask, scale: float) -> np.ndarray:
    x = np.matmul(q, kt) * np.asarray(scale, q.dtype) + mask
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.matmul(e / e.sum(axis=-1, keepdims=True), v).astype(q.dtype, copy=False)


register_op("nn.attention", _attention_infer, OpPattern.OUT_ELEMWISE_FUSABLE, _attention_ref)
