"""Models whose kernels compute one element, compiled for C and LLVM against onnxruntime.

Every loop of such a kernel has extent 1 and is simplified away, so the kernel body is FastExp's
lets and one store. Code generators once took those lets for MakePackedAPI's symbol bindings
(LLVM: "buffer p0 is used outside its allocation", C: a compile error); silero VAD v4's
decoder (a 1-channel Conv, Sigmoid, a reshape to [1, 1]) hit it in the model corpus.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import TARGETS, compile_and_run, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, x_shape, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "one_element", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _unary(op: str, shape: tuple[int, ...]):
    return _model([helper.make_node(op, ["x"], ["y"])], shape), shape


def _conv_sigmoid_reshape():
    """silero v4's decoder tail: Conv 8 -> 1 channel (blocked NCHWc, then back to NCHW),
    Sigmoid, Reshape to [1, 1]."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1, 8, 1)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["y"])]
    return _model(nodes, (1, 8, 1), [("w", w), ("shape", np.array([1, 1], np.int64))]), (1, 8, 1)


MODELS = {
    "Sigmoid [1]": lambda: _unary("Sigmoid", (1,)),
    "Sigmoid [1, 1, 1, 1]": lambda: _unary("Sigmoid", (1, 1, 1, 1)),
    "Tanh [1, 1]": lambda: _unary("Tanh", (1, 1)),
    "Exp [1]": lambda: _unary("Exp", (1,)),
    "Softmax [1, 1]": lambda: _unary("Softmax", (1, 1)),
    "Conv, Sigmoid, Reshape [1, 1]": _conv_sigmoid_reshape,
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_one_element_model_matches_onnxruntime(name, target, tmp_path):
    model, shape = MODELS[name]()
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = compile_and_run(model, {"x": x}, tmp_path, target=target)
    want = run_onnxruntime(model, {"x": x})
    assert got[0].shape == want[0].shape
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
