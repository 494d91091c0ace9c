"""Winograd F(2×2, 3×3) and F(4×4, 3×3) convolutions (issue 32) against onnxruntime on the
``c`` and ``llvm`` targets: single-Conv ONNX models (odd planes, padding 0 and 1, bias, ReLU
fused, batch 2) built with the rule forced on, and the rule's choice for real shapes
(docs/decisions/050).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from backend_helpers import run_exported, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.relay.transform import winograd

F32 = TensorProto.FLOAT
#: Largest |Kiln - onnxruntime| over the output's largest magnitude: measured on these models
#: F(2x2) 5.1e-7, F(4x4) 2.6e-6 (llvm and c alike); the bounds leave room for other inputs.
TOLERANCE = {2: 2e-6, 4: 2e-5}


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv_model(cin: int, cout: int, h: int, w: int, *, batch: int = 1, pad: int = 1,
               bias: bool = True, relu: bool = True):
    """One 3×3 stride-1 Conv (seeded weight, optional bias) and an optional Relu."""
    weight = rand(cout, cin, 3, 3, seed=1) / np.float32(3 * cin ** 0.5)
    inits = [numpy_helper.from_array(weight, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rand(cout, seed=2), "b"))
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"],
                              ["c" if relu else "y0"], pads=[pad] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y0"]))
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", F32, (batch, cin, h, w))],
        [helper.make_tensor_value_info("y0", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, {"x": rand(batch, cin, h, w)}


def kernel_names(lib) -> list[str]:
    return [n["attrs"]["func_name"] for n in json.loads(lib.get_graph_json())["nodes"]
            if n["op"] == "tvm_op"]


@pytest.fixture
def forced(monkeypatch):
    """The rule chooses Winograd for every qualifying conv (any channels and plane)."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd, "MIN_PIXELS", 1)
    return monkeypatch


CASES = [  # cin, cout, h, w, batch, pad, bias, relu
    (32, 32, 13, 11, 1, 1, True, True),    # odd plane: partial tiles on both axes
    (16, 48, 9, 9, 2, 0, True, False),     # batch 2, no padding (7x7 out)
    (32, 16, 8, 10, 1, 0, False, False),   # even plane, whole tiles, no epilogue
    (64, 32, 7, 7, 2, 1, False, True),     # resnet's last stage's plane
]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("cin,cout,h,w,batch,pad,bias,relu", CASES)
def test_winograd_conv_matches_onnxruntime(tmp_path, target, forced, tile, cin, cout, h, w,
                                           batch, pad, bias, relu):
    """Each model runs as one ``nn_conv2d_winograd_NCHWc`` kernel (bias and ReLU fused into
    its output transform) and matches onnxruntime within TOLERANCE of the output's scale."""
    forced.setattr(winograd, "TILE", tile)
    model, inputs = conv_model(cin, cout, h, w, batch=batch, pad=pad, bias=bias, relu=relu)
    mod, params = from_onnx(model, shape={"x": inputs["x"].shape})
    lib = kiln.build(mod, target=target, params=params)
    kernels = kernel_names(lib)
    fused = [k for k in kernels if "winograd" in k]
    assert len(fused) == 1, kernels
    if relu:
        assert "relu" in fused[0], kernels
    assert not any("conv2d_NCHWc" in k for k in kernels), kernels
    got = run_exported(lib, tmp_path / "model.so", inputs)[0]
    want = run_onnxruntime(model, inputs)[0]
    assert got.shape == want.shape
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < TOLERANCE[tile], error
