"""A small QDQ ResNet-style network (stem conv, two residual blocks, a strided 1x1 projection,
global pooling, Gemm) quantized by onnxruntime's ``quantize_static`` — U8S8 (uint8 activations,
per-tensor weights) and S8S8 (its default int8 activations, per-channel weights) — compiled by
Kiln with FakeQuantizationToInteger (docs/decisions/021): the compiled graph runs every
convolution and the Gemm as integer kernels with int8 weights (no float convolution left, no
float weight), and its top 5 of 100 classes is onnxruntime's on smooth image-like inputs.

The logits are within one quantization step of onnxruntime running the QDQ graph as float ops
(graph optimizations off: the format's meaning). onnxruntime's int8 run is compared by its top
5 only, not taken as ground truth: its AVX2 U8S8 convolution sums u8 x s8 pairs in int16 with
saturation (``vpmaddubsw``), and on the S8S8 model its logits were 2 to 7 steps from its own
float run of the same graph, where Kiln's were equal to it; Kiln's kernels are exact
(tests/backend/topi/test_integer_kernels.py).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx

RNG = np.random.default_rng(2021)
CLASSES = 100
SIZE = 32


def _float_model() -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> str:
        name = f"c{len(nodes)}"
        w = (RNG.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype("f4")
        inits.extend([numpy_helper.from_array(w, name + "_w"),
                      numpy_helper.from_array((RNG.standard_normal(cout) * 0.1).astype("f4"),
                                              name + "_b")])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name],
                                      pads=[k // 2] * 4, strides=[stride, stride]))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_r"]))
        return name + "_r"

    def block(x: str, cin: int, cout: int, stride: int) -> str:
        y = conv(conv(x, cin, cout, 3, stride), cout, cout, 3, relu=False)
        short = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, relu=False)
        out = f"add{len(nodes)}"
        nodes.append(helper.make_node("Add", [y, short], [out]))
        nodes.append(helper.make_node("Relu", [out], [out + "_r"]))
        return out + "_r"

    y = block(block(conv("x", 3, 16, 3), 16, 16, 1), 16, 32, 2)
    nodes.append(helper.make_node("GlobalAveragePool", [y], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"]))
    fc = (RNG.standard_normal((CLASSES, 32)) * 0.3).astype("f4")
    inits.extend([numpy_helper.from_array(fc, "fc_w"),
                  numpy_helper.from_array(np.zeros(CLASSES, "f4"), "fc_b")])
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes, "small_resnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _image(seed: int) -> np.ndarray:
    """A smooth image-like input: a few random low-frequency waves per channel."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    img = np.zeros((1, 3, SIZE, SIZE))
    for c in range(3):
        for _ in range(3):
            fy, fx, phase = rng.uniform(0, 3, 2).tolist() + [rng.uniform(0, 6.3)]
            img[0, c] += np.sin(2 * np.pi * (fy * yy + fx * xx) + phase)
    return (img / 2).astype("f4")


@pytest.fixture(scope="module")
def qdq_models(tmp_path_factory) -> dict[str, onnx.ModelProto]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    folder = tmp_path_factory.mktemp("qdq_small")
    onnx.save(_float_model(), str(folder / "float.onnx"))

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{"x": _image(s)} for s in range(8)])

        def get_next(self):
            return next(self.samples, None)

    out = {}
    for variant, act, per_channel in (("u8s8", QuantType.QUInt8, False),
                                      ("s8s8", QuantType.QInt8, True)):
        path = folder / f"{variant}.onnx"
        quantize_static(str(folder / "float.onnx"), str(path), Calibration(),
                        quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=act, weight_type=QuantType.QInt8)
        out[variant] = onnx.load(str(path))
    return out


@pytest.mark.parametrize("variant", ["u8s8", "s8s8"])
def test_small_qdq_resnet_integer(qdq_models, variant):
    import onnxruntime as ort

    model = qdq_models[variant]
    mod, params = from_onnx(model)
    lib = kiln.build(mod, target="llvm", params=params)
    nodes = json.loads(lib.get_graph_json())["nodes"]
    kernels = [n["attrs"]["func_name"] for n in nodes if n["op"] == "tvm_op"]
    assert sum("qnn_conv2d_NCHWc" in k for k in kernels) == 6, kernels  # every conv
    assert any("qnn_dense_pack" in k for k in kernels), kernels
    assert not any("nn_conv2d" in k.replace("qnn_conv2d", "") for k in kernels), kernels
    # weights stay one byte each: int8, or int32 words of four int8 (the quad layout)
    weights = sum(numpy_helper.to_array(i).size for i in model.graph.initializer
                  if i.data_type == TensorProto.INT8)
    held = {k: v.numpy() for k, v in lib.get_params().items()}
    assert not any(v.dtype.kind == "f" and v.size >= 256 for v in held.values())
    assert sum(v.nbytes for v in held.values() if v.size >= 256) <= 1.1 * weights

    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    as_float = ort.InferenceSession(model.SerializeToString(), plain,
                                    providers=["CPUExecutionProvider"])
    step = float(numpy_helper.to_array(
        next(i for i in model.graph.initializer if i.name == "logits_scale")))
    for seed in (100, 101, 102):
        x = _image(seed)
        gm.set_input("x", x)
        gm.run()
        got = gm.get_output(0).numpy().reshape(-1)
        want = sess.run(None, {"x": x})[0].reshape(-1)
        # the QDQ graph's own meaning (onnxruntime, QDQ run as float ops): within a step
        exact = as_float.run(None, {"x": x})[0].reshape(-1)
        assert np.abs(got - exact).max() <= step * 1.001, (seed, np.abs(got - exact).max())
        # same top five (ties on the quantization grid may come in either order)
        top5 = np.argsort(-got)[:5]
        assert want[top5].min() >= np.sort(want)[-5], (seed, top5, want[top5])
