"""ONNX Pow to a constant 2 or 3: onnxruntime squares and cubes (``x * x``, ``(x * x) * x``),
and so does Kiln, bit for bit on every target; other exponents stay ``pow``. GELU's tanh form
(GPT-2, Funnel) cubes every activation: a libm ``powf`` per element cost 6.6 ns of it."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import TARGETS, compile_and_run, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from kiln.frontend import from_onnx
from kiln.relay.graph import Call, post_order


def _pow_model(exponent: np.ndarray, opset: int = 17):
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])], "pow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 257])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 257])],
        [numpy_helper.from_array(exponent, "e")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _ops(model) -> set[str]:
    mod, _ = from_onnx(model)
    return {n.op.name for n in post_order(mod["main"].outputs) if isinstance(n, Call)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("exponent", [np.array(2.0, np.float32), np.array(3.0, np.float32),
                                      np.array([3], np.int64)], ids=["2.0", "3.0", "int 3"])
def test_square_and_cube_equal_onnxruntime(exponent, target, tmp_path):
    model = _pow_model(exponent, opset=13 if exponent.dtype == np.int64 else 17)
    assert "power" not in _ops(model)
    x = (np.random.default_rng(0).standard_normal((8, 257)) * 3).astype(np.float32)
    (got,) = compile_and_run(model, {"x": x}, tmp_path, target)
    (want,) = run_onnxruntime(model, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_other_exponents_stay_pow(tmp_path):
    model = _pow_model(np.array(2.5, np.float32))
    assert "power" in _ops(model)
    x = np.random.default_rng(1).uniform(0.1, 3, (8, 257)).astype(np.float32)
    (got,) = compile_and_run(model, {"x": x}, tmp_path, "llvm")
    np.testing.assert_allclose(got, run_onnxruntime(model, {"x": x})[0], rtol=1e-6)
