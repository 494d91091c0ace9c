"""Tiny ONNX models with one kernel each, for the tuner's tests (tests/unit/test_tune_*.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def one_node_model(nodes, inputs, output, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def conv_model(channels: int = 16, size: int = 6) -> onnx.ModelProto:
    """Conv 3x3 (pad 1) + Relu over 1 x 8 x size x size: one conv2d_NCHWc kernel."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((channels, 8, 3, 3)).astype("float32"), "w")
    return one_node_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, size, size])],
                  helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                [1, channels, size, size]), [w])


def dense_model(rows: int = 7, k: int = 16, n: int = 32) -> onnx.ModelProto:
    """MatMul rows x k by a constant k x n: one dense_pack kernel."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype("float32"), "w")
    return one_node_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n]), [w])


def depthwise_model() -> onnx.ModelProto:
    """Depthwise Conv 3x3 (group = channels) over 1 x 16 x 6 x 6."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((16, 1, 3, 3)).astype("float32"), "w")
    return one_node_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1],
                                            group=16)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6])],
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6]), [w])


def matmul_model() -> onnx.ModelProto:
    """MatMul of two activations (batched 1 x 12 x 8 by 1 x 8 x 16): nn.matmul."""
    return one_node_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 12, 8]),
                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8, 16])],
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 16]), [])


def einsum_model() -> onnx.ModelProto:
    """Attention scores as an Einsum (bhid,bhjd->bhij over 1 x 2 x 6 x 8 and 1 x 2 x 16 x 8)."""
    return one_node_model([helper.make_node("Einsum", ["a", "b"], ["y"],
                                            equation="bhid,bhjd->bhij")],
                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 6, 8]),
                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 2, 16, 8])],
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 16]), [])


def qdq_conv_model() -> onnx.ModelProto:
    """QDQ Conv 3x3 (pad 1) over 1 x 8 x 6 x 6, per-tensor scales (0-d constants, as
    onnxruntime's quantize_static writes them), uint8 activations, int8 weights: one
    qnn conv2d_NCHWc kernel whose scales and zero points are scalar parameters."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in (
        ("xs", 0.02, "float32"), ("xz", 128, "uint8"), ("ws", 0.01, "float32"),
        ("wz", 0, "int8"), ("ys", 0.05, "float32"), ("yz", 120, "uint8"))]
    inits.append(numpy_helper.from_array(rng.integers(-127, 127, (16, 8, 3, 3), dtype="int8"),
                                         "w"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"])]
    return one_node_model(nodes,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                          helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6]),
                          inits)
