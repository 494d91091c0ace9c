"""kiln.driver.onnx_backend: ONNX's backend interface (prepare / run / run_node /
supports_device) and the binding of run-time inputs that Kiln needs at compile time."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from kiln.driver import onnx_backend as backend
from kiln.errors import UnsupportedOpError
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
    """Split's sizes are a graph input: the importer names it, the rep binds its value and
    compiles once per distinct value (cached)."""
    model = _model([helper.make_node("Split", ["x", "split"], ["y", "z"], axis=1)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                    helper.make_tensor_value_info("split", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, None])
                    for n in "yz"])
    with pytest.raises(NotConstantError) as err:
        from_onnx(model)
    assert err.value.inputs == ("split",)
    rep = backend.prepare(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    y, z = rep.run([x, np.array([2, 4], np.int64)])
    np.testing.assert_array_equal(z, x[:, 2:])
    y, z = rep.run({"x": x, "split": np.array([5, 1], np.int64)})
    np.testing.assert_array_equal(y, x[:, :5])
    assert rep.bound == {"split"}
    assert len(rep._compiled) == 2
    rep.run([x, np.array([2, 4], np.int64)])
    assert len(rep._compiled) == 2  # the first value's library is reused


def test_data_shape_compiles_once_for_every_value():
    """Reshape to a shape that is a graph input is data-dependent: one VM artifact runs
    every value (decision 016), nothing is bound."""
    rep = backend.prepare(_reshape_model())
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = rep.run([x, np.array([3, 4], np.int64)])
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    (y2,) = rep.run({"x": x, "shape": np.array([4, -1], np.int64)})
    np.testing.assert_array_equal(y2, x.reshape(4, 3))
    assert rep.bound == set() and not rep.static_values
    assert len(rep._compiled) == 1


def test_data_dependent_dims_that_do_not_broadcast_fall_back_to_binding():
    """Range(0, n) + ConstantOfShape([n]) meet two late symbols in an Add, which no type
    relation can prove equal: the rep imports again binding ``n``."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Reshape", ["n", "one"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=helper.make_tensor("v", i64, [1], [7])),
             helper.make_node("Add", ["r", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("n", i64, [])],
                              [helper.make_tensor_value_info("y", i64, [None])],
                              [helper.make_tensor("zero", i64, [], [0]),
                               helper.make_tensor("one", i64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(model)
    (y,) = rep.run([np.array(4, np.int64)])
    np.testing.assert_array_equal(y, np.arange(4) + 7)
    assert rep.static_values and rep.bound == {"n"}


def test_unsupported_op_fails_in_prepare():
    model = _model([helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
                    helper.make_tensor_value_info("rois", TensorProto.FLOAT, [1, 4]),
                    helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    with pytest.raises(UnsupportedOpError, match="RoiAlign"):
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
