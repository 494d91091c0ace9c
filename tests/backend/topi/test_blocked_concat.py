"""A channel concatenation of blocked convolution outputs whose blocks differ (a 4-channel
box head beside two 1-channel maps, each in its own NCHW{b}c) concatenates in NCHW; it was a
ShapeError in AlterOpLayout (ddddocr's detector: "shapes ... differ off axis 1")."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import compile_and_run, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper


def _heads_model():
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for k, cout in enumerate((4, 1, 1)):
        w = (rng.standard_normal((cout, 8, 3, 3)) * 0.2).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        nodes.append(helper.make_node("Conv", ["x", f"w{k}"], [f"h{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Sigmoid", [f"h{k}"], [f"s{k}"]))
        outs.append(f"s{k}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    graph = helper.make_graph(nodes, "heads",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, 8, 13, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [1, 6, 13, 13])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_concat_of_differently_blocked_heads(target, tmp_path):
    model = _heads_model()
    x = np.random.default_rng(1).standard_normal((1, 8, 13, 13)).astype(np.float32)
    (got,) = compile_and_run(model, {"x": x}, tmp_path, target)
    np.testing.assert_allclose(got, run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
