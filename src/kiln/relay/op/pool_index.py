"""``nn.max_pool2d_indices``: where ONNX MaxPool's maxima come from (its second output).

Attributes as ``nn.max_pool2d`` (NCHW only) plus ``storage_order`` (0: row major, 1: column
major). Output int64, shaped like the pool's: the flat index into the whole input tensor
(``((n * C + c) * H + h) * W + w``; column major: ``((n * C + c) * W + w) * H + h``) of the
first maximum of each window in scan order (rows, then columns).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import expect_arity, expect_rank
from kiln.relay.op.nn import pool_output_size
from kiln.relay.op_registry import OpPattern, register_op


def _infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 1)
    (data,) = arg_types
    expect_rank(data, 4, "data")
    if attrs["storage_order"] not in (0, 1):
        raise ShapeError(f"storage_order {attrs['storage_order']}")
    n, c, h, w = data.shape
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh = pool_output_size(h, kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = pool_output_size(w, kw, sw, pl, pr, dw, attrs["ceil_mode"])
    return TensorType((n, c, oh, ow), "int64")


def _ref(data: np.ndarray, pool_size, strides, padding, dilation, ceil_mode,
         storage_order) -> np.ndarray:
    _, c, h, w = data.shape
    out = _infer([TensorType(data.shape, str(data.dtype))],
                 {"pool_size": pool_size, "strides": strides, "padding": padding,
                  "dilation": dilation, "ceil_mode": ceil_mode,
                  "storage_order": storage_order}).shape
    result = np.zeros(out, dtype=np.int64)
    for b, ch, y, x in np.ndindex(*out):
        best, where = None, 0
        for i in range(pool_size[0]):
            for j in range(pool_size[1]):
                iy = y * strides[0] + i * dilation[0] - padding[0]
                ix = x * strides[1] + j * dilation[1] - padding[1]
                if 0 <= iy < h and 0 <= ix < w and (best is None or data[b, ch, iy, ix] > best):
                    best = data[b, ch, iy, ix]
                    base = b * c + ch
                    where = (base * h + iy) * w + ix if storage_order == 0 else \
                        (base * w + ix) * h + iy
        result[b, ch, y, x] = where
    return result


register_op("nn.max_pool2d_indices", _infer, OpPattern.OPAQUE, _ref)
