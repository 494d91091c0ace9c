"""MatMulInteger with a run-time activation zero point (what onnxruntime's
``quantize_dynamic`` writes after DynamicQuantizeLinear), compiled for ``c`` and ``llvm``:
FakeQuantizationToInteger makes it ``qnn.dense(reshape(a), B; 0) - zp · colsum(B)``
(docs/decisions/021), the int8 dense kernel with the zero-point term in its epilogue; the int32
output equals a numpy int64 reference exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

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


def _dynamic_dense_model(shape_x: tuple[int, ...], b: np.ndarray, w_scale: float,
                         bias: np.ndarray):
    """``quantize_dynamic``'s MatMul: DynamicQuantizeLinear(X) → MatMulInteger(Xq, B, zp) →
    Cast(float) → Mul(·, x_scale · w_scale) → Add(bias), the nodes in its order."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["X"], ["Xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["Xq", "B", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y0"]),
             helper.make_node("Add", ["y0", "bias"], ["Y"])]
    graph = helper.make_graph(
        nodes, "dyn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape_x)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.float32(w_scale), "ws"),
         numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _dynamic_dense_reference(x, b, w_scale, bias):
    """ONNX's DynamicQuantizeLinear (round half to even) and an int64 product, then the
    float32 ops in the graph's order."""
    lo, hi = np.float32(min(x.min(), 0)), np.float32(max(x.max(), 0))
    scale = np.float32((hi - lo) / np.float32(255)) or np.float32(1)
    zp = np.uint8(np.clip(np.rint(np.float32(0) - lo / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.int64)
    acc = ((q - int(zp)) @ b.astype(np.int64)).astype(np.float32)
    return acc * (scale * np.float32(w_scale)) + bias


def test_dynamic_quantized_dense_is_one_kernel_after_the_quantization(target):
    """The run-time terms of the dense's epilogue (``zp · colsum(B)``, ``x_scale · w_scale``)
    are computed in the dense kernel, not in kernels of their own (FuseOps' side inputs), and
    the range reductions (vectorized min / max, rows of 160 with a tail) stay exact: the
    output equals the reference to float32 rounding."""
    shape_x, n = (9, 160), 48
    b = RNG.integers(-128, 128, (shape_x[-1], n)).astype(np.int8)
    bias = RNG.standard_normal(n).astype(np.float32)
    mod, params = from_onnx(_dynamic_dense_model(shape_x, b, 0.02, bias))
    lib = kiln.build(mod, target=target, params=params)
    kernels = [nd["attrs"]["func_name"] for nd in json.loads(lib.get_graph_json())["nodes"]
               if nd["op"] == "tvm_op"]
    dense = [k for k in kernels if "qnn_dense" in k]
    # min, max → scale, zero point, quantize, and the dense with its whole epilogue
    assert len(dense) == 1 and len(kernels) == 5, kernels
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    for x in (RNG.standard_normal(shape_x).astype(np.float32) * 3,
              np.abs(RNG.standard_normal(shape_x)).astype(np.float32)):  # min(x, 0) = 0
        gm.set_input("X", x)
        gm.run()
        np.testing.assert_allclose(gm.get_output(0).numpy(),
                                   _dynamic_dense_reference(x, b, 0.02, bias), rtol=1e-6,
                                   atol=1e-5)


@pytest.mark.parametrize("target", ["c", "llvm -mcpu=native"])
def test_matmul_integer_symbolic_rows(target, tmp_path):
    """Symbolic rows (the VM): register blocks with a partial last one and the version for
    fewer rows than a block — on an AVX2 machine the activation pairs stage (``qnn_pairs``)
    over a symbolic extent — equal numpy's int64 product for 1 to 37 rows."""
    k, n = 64, 48
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    mod, params = from_onnx(_model(("n", k), b), dim_bounds={"n": (1, None)})
    kiln.build(mod, target=target, params=params).export_library(str(tmp_path / "mmi.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "mmi.so")), kiln.cpu())
    for rows in (1, 2, 5, 13, 37):
        a = RNG.integers(0, 256, (rows, k)).astype(np.uint8)
        got = vm["main"](a, np.array(7, np.uint8))
        got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
        np.testing.assert_array_equal(got, (a.astype(np.int64) - 7) @ b.astype(np.int64))


def _u8u8_model(shape_a: tuple[int, ...], b: np.ndarray, b_zp: int, a_zp: int | None):
    """MatMulInteger(A uint8, B uint8 constant ``[K, N]`` with zero point ``b_zp``; A's zero
    point a run-time scalar input, or the constant ``a_zp``) → int32: ``quantize_dynamic``'s
    U8U8 models (weight_type QUInt8, e.g. ddddocr's OCR head)."""
    inits = [numpy_helper.from_array(b, "B"),
             numpy_helper.from_array(np.array(b_zp, np.uint8), "b_zp")]
    inputs = [helper.make_tensor_value_info("A", TensorProto.UINT8, shape_a)]
    if a_zp is None:
        inputs.append(helper.make_tensor_value_info("a_zp", TensorProto.UINT8, []))
    else:
        inits.append(numpy_helper.from_array(np.array(a_zp, np.uint8), "a_zp"))
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zp", "b_zp"], ["Y"])
    graph = helper.make_graph([node], "mmi_u8u8", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.INT32, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("a_zp", [None, 77])
@pytest.mark.parametrize("b_zp", [119, 200, 30])
def test_matmul_integer_uint8_weights_with_a_zero_point(target, b_zp, a_zp):
    """B less its zero point spans 256 values outside int8 (-119..136, -200..55, -30..225): it
    is an int8 weight plus a constant, whose term is a row sum of A; still the int8 dense
    kernel, still exact — extreme operands included."""
    shape_a, n = (2, 5, 48), 24
    k = shape_a[-1]
    a = RNG.integers(0, 256, shape_a).astype(np.uint8)
    a[0, 3:] = RNG.choice(np.array([0, 255], np.uint8), (2, k))
    b = RNG.integers(0, 256, (k, n)).astype(np.uint8)
    b[:, : n // 2] = RNG.choice(np.array([0, 255], np.uint8), (k, n // 2))
    shapes = {"A": shape_a} if a_zp is not None else {"A": shape_a, "a_zp": ()}
    mod, params = from_onnx(_u8u8_model(shape_a, b, b_zp, a_zp), shape=shapes)
    lib = kiln.build(mod, target=target, params=params)
    kernels = [nd["attrs"]["func_name"] for nd in json.loads(lib.get_graph_json())["nodes"]
               if nd["op"] == "tvm_op"]
    assert any("qnn_dense" in name for name in kernels), kernels
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input("A", a)
    for zp in ((0, 131, 255) if a_zp is None else (a_zp,)):
        if a_zp is None:
            gm.set_input("a_zp", np.array(zp, np.uint8))
        gm.run()
        want = (a.astype(np.int64) - zp) @ (b.astype(np.int64) - b_zp)
        np.testing.assert_array_equal(gm.get_output(0).numpy(), want)
