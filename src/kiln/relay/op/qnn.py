"""Quantization graph ops (TVM's ``qnn`` dialect, reduced to its two conversions):
``qnn.quantize`` and ``qnn.dequantize``, with the semantics of ONNX QuantizeLinear and
DequantizeLinear (linear quantization, round half to even, saturation).

- ``qnn.quantize(x, scale, zero_point; axis, block_size, out_dtype)``:
  ``y = saturate(round_half_even(x / scale) + zero_point)`` of ``out_dtype``. ``x`` and
  ``scale`` are floats of one dtype; ``zero_point`` has ``out_dtype`` (int8, uint8, int16 or
  uint16). The division is a true float division (not a multiplication by ``1/scale``) and the
  zero point is added in the float dtype; that is bit-exact against onnxruntime, ties included
  (tests/unit/frontend/test_frontend_quantization.py).
- ``qnn.dequantize(x, scale, zero_point; axis, block_size)``:
  ``y = float(int32(x) - int32(zero_point)) * scale``, in ``scale``'s dtype; ``x`` and
  ``zero_point`` have one integer dtype (int8, uint8, int16, uint16 or int32).

``scale`` and ``zero_point`` have one shape: rank 0 (per tensor), 1-D with one entry per index
of ``x``'s axis ``axis`` (per axis; ``axis`` normalized to ``[0, rank)``, ignored per tensor), or,
with ``block_size`` B > 0 (ONNX opset 21 blocked quantization), ``x``'s rank and shape except
``ceil(x.shape[axis] / B)`` along ``axis``: element ``i`` uses parameter ``i[axis] // B``.
Integer convolutions and matrix products (QLinearConv, ConvInteger, ...) need no op of their
own: they are ``nn.conv2d`` / ``nn.matmul`` on int32 operands (docs/decisions/011).
"""

from __future__ import annotations

import numpy as np

from kiln.errors import ShapeError
from kiln.relay.graph import TensorType
from kiln.relay.op.common import FLOAT_DTYPES, expect_arity, normalize_axis
from kiln.relay.op_registry import OpPattern, register_op

#: storage dtypes of quantized values (QuantizeLinear outputs)
QUANT_DTYPES = ("int8", "uint8", "int16", "uint16")
#: dtypes DequantizeLinear takes: quantized values and int32 (quantized biases)
DEQUANT_DTYPES = (*QUANT_DTYPES, "int32")


def _check_params(x: TensorType, scale: TensorType, zero_point: TensorType, attrs: dict) -> None:
    """Raise ShapeError unless scale/zero point are per tensor, per index of ``axis`` or per
    block of ``axis``."""
    axis, block = attrs["axis"], attrs["block_size"]
    if scale.shape != zero_point.shape:
        raise ShapeError(f"scale {scale.shape} and zero point {zero_point.shape} differ in shape")
    if scale.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"scale must be a float tensor, got {scale.dtype}")
    if block:
        axis = normalize_axis(axis, x.ndim)
        blocks = -(-x.shape[axis] // block)
        want = x.shape[:axis] + (blocks,) + x.shape[axis + 1:]
        if block < 0 or scale.shape != want:
            raise ShapeError(f"scale {scale.shape} does not give blocks of {block} along axis "
                             f"{axis} of {x.shape} (expected {want})")
        return
    if scale.ndim == 0:
        return
    if scale.ndim != 1:
        raise ShapeError(f"scale must have rank 0 or 1, got shape {scale.shape}")
    axis = normalize_axis(axis, x.ndim)
    if scale.shape[0] != x.shape[axis]:
        raise ShapeError(f"{scale.shape[0]} scales for axis {axis} of {x.shape}")


def along(param: np.ndarray, shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A per-tensor, per-axis or per-block parameter shaped to broadcast against a tensor of
    ``shape``."""
    if block:
        return np.repeat(param, block, axis=axis).take(range(shape[axis]), axis=axis)
    if param.ndim == 0:
        return param
    return param.reshape((-1,) + (1,) * (len(shape) - axis % len(shape) - 1))


def _quantize_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    x, scale, zero_point = arg_types
    out_dtype = attrs["out_dtype"]
    if out_dtype not in QUANT_DTYPES:
        raise ShapeError(f"cannot quantize to {out_dtype} (supported: {', '.join(QUANT_DTYPES)})")
    if x.dtype != scale.dtype:
        raise ShapeError(f"input {x.dtype} and scale {scale.dtype} differ in dtype")
    if zero_point.dtype != out_dtype:
        raise ShapeError(f"zero point {zero_point.dtype} is not of the output dtype {out_dtype}")
    _check_params(x, scale, zero_point, attrs)
    return TensorType(x.shape, out_dtype)


def _quantize_ref(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int,
                  block_size: int, out_dtype: str, unit_scale: bool = False) -> np.ndarray:
    info = np.iinfo(out_dtype)
    s, z = (along(p, x.shape, axis, block_size) for p in (scale, zero_point))
    with np.errstate(all="ignore"):
        q = np.rint(x if unit_scale else x / s) + z.astype(x.dtype)
        return np.clip(q, info.min, info.max).astype(out_dtype)


register_op("qnn.quantize", _quantize_infer, OpPattern.BROADCAST, _quantize_ref)


def _dequantize_infer(arg_types: list[TensorType], attrs: dict) -> TensorType:
    expect_arity(arg_types, 3)
    x, scale, zero_point = arg_types
    if x.dtype not in DEQUANT_DTYPES:
        raise ShapeError(f"cannot dequantize {x.dtype} (supported: {', '.join(DEQUANT_DTYPES)})")
    if zero_point.dtype != x.dtype:
        raise ShapeError(f"zero point {zero_point.dtype} is not of the input dtype {x.dtype}")
    _check_params(x, scale, zero_point, attrs)
    return TensorType(x.shape, scale.dtype)


def _dequantize_ref(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int,
                    block_size: int) -> np.ndarray:
    s, z = (along(p, x.shape, axis, block_size) for p in (scale, zero_point))
    with np.errstate(all="ignore"):
        return (x.astype(np.int32) - z.astype(np.int32)).astype(scale.dtype) * s


register_op("qnn.dequantize", _dequantize_infer, OpPattern.BROADCAST, _dequantize_ref)
