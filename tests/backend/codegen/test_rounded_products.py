"""A float Mul then Add are two roundings, as in onnxruntime (topi's ``multiply`` is a loop-IR
``fence``, ``llvm.arithmetic.fence``): the fused kernel of ``a * b + c`` does not contract them
into an FMA (decision 060). Contraction inside one op stays (the reductions, FastExp)."""

from __future__ import annotations

import numpy as np
from backend_helpers import compile_and_run, run_onnxruntime
from onnx import TensorProto, helper

HOST = "llvm -mcpu=native"


def _mul_add(n: int):
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["p"]), helper.make_node("Add", ["p", "c"], ["y"])],
        "mul_add", [helper.make_tensor_value_info(k, TensorProto.FLOAT, [n]) for k in "abc"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_mul_then_add_rounds_twice(tmp_path):
    rng = np.random.default_rng(7)
    n = 1 << 14
    inputs = {k: rng.standard_normal(n).astype(np.float32) for k in "abc"}
    model = _mul_add(n)
    got = compile_and_run(model, inputs, tmp_path, HOST)[0]
    twice = (inputs["a"] * inputs["b"]) + inputs["c"]  # numpy: each op rounds to float32
    np.testing.assert_array_equal(got, twice)
    np.testing.assert_array_equal(got, run_onnxruntime(model, inputs)[0])
