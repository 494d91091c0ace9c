"""benchmarks/flops.py: FLOP counts of tiny hand-built graphs against hand-computed numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "flops.py"
_spec = importlib.util.spec_from_file_location("bench_flops", _PATH)
flops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flops)


def _weight(name: str, shape: tuple[int, ...]):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _conv_gemm_model(batch_dim):
    """x 3×8×8 → Conv 3→4 3×3 pad 1 → Relu → Conv 4→4 1×1 group 2 stride 2 → Flatten → Gemm →10."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[1, 1], strides=[2, 2],
                         group=2),
        helper.make_node("Flatten", ["c2"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    inits = [_weight("w1", (4, 3, 3, 3)), _weight("b1", (4,)), _weight("w2", (4, 2, 1, 1)),
             _weight("wf", (10, 64)), _weight("bf", (10,))]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                        [batch_dim, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 10])], inits)


# conv1: 2·1·4·8·8·(3/1)·3·3 = 13824; conv2: 2·1·4·4·4·(4/2)·1·1 = 256; gemm: 2·1·10·64 = 1280
CONV_GEMM_FLOPS = 13824 + 256 + 1280


def test_conv_gemm():
    assert flops.count_flops(_conv_gemm_model(1)) == CONV_GEMM_FLOPS


def test_symbolic_batch_gets_the_given_shape():
    model = _conv_gemm_model("N")
    # an exporter's stale symbolic intermediate shape must not hide the static one
    model.graph.value_info.append(
        helper.make_tensor_value_info("c2", TensorProto.FLOAT, ["N", 4, 4, 4]))
    assert flops.count_flops(model, {"x": (2, 3, 8, 8)}) == 2 * CONV_GEMM_FLOPS
    with pytest.raises(ValueError, match="no static shape"):
        flops.count_flops(model)


def test_batched_matmul_and_transposed_gemm():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]),          # 2·(2·3)·7·5 = 420
             helper.make_node("Reshape", ["m", "s"], ["r"]),
             helper.make_node("Gemm", ["r", "g"], ["y"], transA=1)]  # 2·7·4·6 = 336
    inits = [_weight("b", (5, 7)), numpy_helper.from_array(np.array([6, 7], np.int64), "s"),
             _weight("g", (6, 4))]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 4])], inits)
    assert flops.count_flops(model) == 420 + 336
