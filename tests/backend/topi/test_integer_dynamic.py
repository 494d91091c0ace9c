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
    _check_over_zero_points(_u8u8_model(shape_a, b, b_zp, a_zp), target, "qnn_dense", "A", a,
                            a_zp, lambda zp: (a.astype(np.int64) - zp) @ (b.astype(np.int64)
                                                                          - b_zp))


def _check_over_zero_points(model, target: str, kernel: str, name: str, data: np.ndarray,
                            zero_point: int | None, want) -> None:
    """Build ``model`` (graph executor): a kernel named with ``kernel``, and the int32 output
    equal to ``want(zp)`` for the constant ``zero_point``, or for 0, 131 and 255 fed as the
    run-time scalar input ``<name>_zp`` when it is None."""
    zp_name = f"{name.lower()}_zp"
    shapes = {name: data.shape} if zero_point is not None else {name: data.shape, zp_name: ()}
    mod, params = from_onnx(model, shape=shapes)
    lib = kiln.build(mod, target=target, params=params)
    kernels = [nd["attrs"]["func_name"] for nd in json.loads(lib.get_graph_json())["nodes"]
               if nd["op"] == "tvm_op"]
    assert any(kernel in k for k in kernels), kernels
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(name, data)
    for zp in ((0, 131, 255) if zero_point is None else (zero_point,)):
        if zero_point is None:
            gm.set_input(zp_name, np.array(zp, np.uint8))
        gm.run()
        np.testing.assert_array_equal(gm.get_output(0).numpy(), want(zp))


def _conv_integer_model(shape_x, w: np.ndarray, w_zp: int, pads, strides, group: int,
                        x_zp: int | None):
    """ConvInteger(x uint8, w uint8 or int8 constant with zero point ``w_zp``; x's zero point a
    run-time scalar input, or the constant ``x_zp``) → int32."""
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array(w_zp, w.dtype), "w_zp")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, shape_x)]
    if x_zp is None:
        inputs.append(helper.make_tensor_value_info("x_zp", TensorProto.UINT8, []))
    else:
        inits.append(numpy_helper.from_array(np.array(x_zp, np.uint8), "x_zp"))
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=pads,
                            strides=strides, group=group)
    graph = helper.make_graph([node], "conv_integer", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _conv_reference(x, w, x_zp, w_zp, pads, strides, group):
    """int64 ``Σ_valid taps (x - x_zp) · (w - w_zp)``: x padded with its zero point."""
    xp = np.pad(x.astype(np.int64) - x_zp, ((0, 0), (0, 0), (pads[0], pads[2]),
                                            (pads[1], pads[3])))
    wk = w.astype(np.int64) - w_zp
    o, cg, kh, kw = wk.shape
    n, _, hp, wp = xp.shape
    oh, ow = (hp - kh) // strides[0] + 1, (wp - kw) // strides[1] + 1
    y = np.zeros((n, o, oh, ow), np.int64)
    per = o // group
    for co in range(o):
        g = co // per
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i:i + strides[0] * oh:strides[0],
                           j:j + strides[1] * ow:strides[1]]
                y[:, co] += np.einsum("nchw,c->nhw", patch, wk[co, :, i, j])
    return y


@pytest.mark.parametrize("x_zp,w_zp,group,strides", [
    (None, 0, 1, (1, 1)),      # int8-range weights, DynamicQuantizeLinear's zero point
    (None, 0, 4, (1, 1)),      # grouped
    (None, 119, 1, (2, 2)),    # U8U8: weights less their zero point span -119..136
    (77, 178, 1, (1, 1)),      # constant activation zero point, -178..77
])
def test_conv_integer_runtime_zero_point_and_uint8_weights(target, x_zp, w_zp, group,
                                                          strides):
    """quantize_dynamic's ConvInteger (ddddocr's OCR model): the int8 convolution kernel with
    the zero-point terms over each output pixel's valid taps (the borders have fewer), exact."""
    shape_x, o, pads = (1, 8, 9, 11), 16, [1, 1, 1, 1]
    x = RNG.integers(0, 256, shape_x).astype(np.uint8)
    x[0, :, :2] = 255
    wshape = (o, 8 // group, 3, 3)
    w = (RNG.integers(0, 256, wshape).astype(np.uint8) if w_zp else
         RNG.integers(-128, 128, wshape).astype(np.int8))
    model = _conv_integer_model(shape_x, w, w_zp, pads, strides, group, x_zp)
    _check_over_zero_points(model, target, "qnn", "x", x, x_zp, lambda zp: _conv_reference(
        x, w, zp, w_zp, pads, strides, group))


def test_conv_integer_runtime_zero_point_symbolic_width(target, tmp_path):
    """A symbolic width (the VM): the mask of the padding comes from a padded plane of ones at
    run time; U8U8 weights and DynamicQuantizeLinear's zero point, exact at widths 1 to 23."""
    w = RNG.integers(0, 256, (8, 4, 3, 3)).astype(np.uint8)
    model = _conv_integer_model((1, 4, 6, "width"), w, 119, [1, 1, 1, 1], [1, 1], 1, None)
    mod, params = from_onnx(model, dim_bounds={"width": (1, None)})
    kiln.build(mod, target=target, params=params).export_library(str(tmp_path / "ci.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "ci.so")), kiln.cpu())
    for width, zp in ((1, 0), (5, 131), (23, 255)):
        x = RNG.integers(0, 256, (1, 4, 6, width)).astype(np.uint8)
        got = vm["main"](x, np.array(zp, np.uint8))
        got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
        np.testing.assert_array_equal(got, _conv_reference(x, w, zp, 119, [1, 1, 1, 1],
                                                           (1, 1), 1))


def test_conv_integer_zero_point_terms_stay_blocked():
    """Structural: the window-sum and ``zx · colsum`` terms of a U8U8 ConvInteger after
    DynamicQuantizeLinear broadcast in the blocked layout, so the whole epilogue is fused into
    the conv and after it only the graph's output changes layout (before: every conv's output
    went back to NCHW for them, 2.1 of ddddocr-old's 11.3 ms)."""
    w = RNG.integers(0, 256, (32, 16, 3, 3)).astype(np.uint8)
    model = _conv_integer_model((1, 16, 12, 12), w, 119, [1, 1, 1, 1], [1, 1], 1, None)
    model.graph.node.append(helper.make_node("Cast", ["y"], ["f"], to=TensorProto.FLOAT))
    model.graph.node.append(helper.make_node("Relu", ["f"], ["r"]))
    model.graph.node.append(helper.make_node("Cast", ["r"], ["out"], to=TensorProto.INT32))
    model.graph.output[0].name = "out"
    mod, params = from_onnx(model, shape={"x": (1, 16, 12, 12), "x_zp": ()})
    lib = kiln.build(mod, target="llvm", params=params)
    kernels = [nd["attrs"]["func_name"] for nd in json.loads(lib.get_graph_json())["nodes"]
               if nd["op"] == "tvm_op"]
    (conv,) = [k for k in kernels if "qnn_conv2d" in k]
    assert "subtract_add" in conv and "relu" in conv, kernels
    after = kernels[kernels.index(conv) + 1:]
    assert len(after) == 1 and "layout_transform" in after[0], kernels
