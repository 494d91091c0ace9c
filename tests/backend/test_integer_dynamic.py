"""MatMulInteger with a run-time activation zero point (what onnxruntime's
``quantize_dynamic`` writes after DynamicQuantizeLinear), compiled for ``c`` and ``llvm``:
FakeQuantizationToInteger makes it ``qnn.dense(reshape(a), B; 0) - zp · colsum(B)``
(docs/decisions/021), the int8 dense kernel with the zero-point term in its epilogue; the int32
output equals a numpy int64 reference exactly."""

from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx

RNG = np.random.default_rng(2118)


def _model(shape_a: tuple[int, ...], b: np.ndarray):
    """MatMulInteger(A uint8 ``shape_a``, B int8 constant ``[K, N]``, a_zero_point uint8
    scalar input) → int32."""
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zp"], ["Y"])
    graph = helper.make_graph(
        [node], "mmi",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, shape_a),
         helper.make_tensor_value_info("a_zp", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_matmul_integer_runtime_zero_point(target):
    """A 3-D A (MatMul's leading axes folded into rows): random rows, then rows of extreme
    operands (0 / 255 against -128 / 127); zero points 0, 131 and 255 on one build."""
    shape_a, n = (1, 7, 64), 40
    k = shape_a[-1]
    a = RNG.integers(0, 256, shape_a).astype(np.uint8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    a[0, 4:] = RNG.choice(np.array([0, 255], np.uint8), (3, k))
    b[:, n // 2:] = RNG.choice(np.array([-128, 127], np.int8), (k, n - n // 2))
    mod, params = from_onnx(_model(shape_a, b), shape={"A": shape_a, "a_zp": ()})
    lib = kiln.build(mod, target=target, params=params)
    kernels = [nd["attrs"]["func_name"] for nd in json.loads(lib.get_graph_json())["nodes"]
               if nd["op"] == "tvm_op"]
    assert any("qnn_dense" in name for name in kernels), kernels
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input("A", a)
    for zp in (0, 131, 255):
        gm.set_input("a_zp", np.array(zp, np.uint8))
        gm.run()
        got = gm.get_output(0).numpy()
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, (a.astype(np.int64) - zp) @ b.astype(np.int64))
