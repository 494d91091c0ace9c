"""kiln.frontend.onnx.backend: ONNX's backend interface (prepare / run / run_node /
supports_device) and the binding of run-time inputs that Kiln needs at compile time."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx import backend
from kiln.frontend.onnx.context import NotConstantError
from kiln.frontend.onnx.importer import from_onnx


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "t", inputs, outputs)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets))


def _reshape_model():
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                   helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])])


def test_supports_cpu_only():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    with pytest.raises(UnsupportedOpError, match="CUDA"):
        backend.prepare(_reshape_model(), "CUDA")


def test_shape_input_is_bound_from_run_values():
    """Reshape's shape is a graph input: the importer names it, the rep binds its value and
    compiles once per distinct value (cached)."""
    model = _reshape_model()
    with pytest.raises(NotConstantError) as err:
        from_onnx(model)
    assert err.value.inputs == ("shape",)
    rep = backend.prepare(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = rep.run([x, np.array([3, 4], np.int64)])
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    (y2,) = rep.run({"x": x, "shape": np.array([4, -1], np.int64)})
    np.testing.assert_array_equal(y2, x.reshape(4, 3))
    assert rep.bound == {"shape"}
    assert len(rep._compiled) == 2
    rep.run([x, np.array([3, 4], np.int64)])
    assert len(rep._compiled) == 2  # the first value's library is reused


def test_unsupported_op_fails_in_prepare():
    model = _model([helper.make_node("Unique", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    with pytest.raises(UnsupportedOpError, match="Unique"):
        backend.prepare(model)


def test_unsupported_dtype_is_clean():
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
                   [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4])])
    with pytest.raises(UnsupportedOpError, match="BFLOAT16"):
        backend.prepare(model)


def test_run_node():
    node = helper.make_node("Mod", ["a", "b"], ["c"], fmod=1)
    a = np.array([-7.5, 7.5, 3.0], np.float32)
    b = np.array([2.0, -2.0, 3.0], np.float32)
    (c,) = backend.run_node(node, [a, b])
    np.testing.assert_allclose(c, np.fmod(a, b))


def test_float16_computes_in_float32_and_returns_float16():
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 5])])
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float16)
    (y,) = backend.prepare(model).run([x])
    assert y.dtype == np.float16
    e = np.exp(x.astype(np.float32) - x.astype(np.float32).max(-1, keepdims=True))
    np.testing.assert_allclose(y, (e / e.sum(-1, keepdims=True)).astype(np.float16),
                               rtol=1e-3)
