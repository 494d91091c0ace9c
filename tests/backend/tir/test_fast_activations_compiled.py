"""float32 sigmoid and tanh compiled (C, generic LLVM, the host's LLVM): within the rational
approximations' error of float64 over a dense sweep, and on x86-64 equal to onnxruntime's
bit for bit — single ops, and a chain of dynamically quantized layers where one ulp of an
activation would move a quantization scale (docs/decisions/060)."""

from __future__ import annotations

import platform

import numpy as np
import onnx
import pytest
from backend_helpers import TARGETS, build_kernels, compile_and_run, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from test_fast_activations import BOUND, REFERENCE, activation_kernel

import kiln
from kiln.tir.transform.fast_exp import lower_fast_exp
from kiln.tir.transform.make_packed_api import make_packed_api

N = 1 << 20
HOST = "llvm -mcpu=native"
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                              reason="onnxruntime's FMA3 kernels are x86-64's")


def sweep(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([np.linspace(-30.0, 30.0, n // 2, dtype=np.float32),
                           rng.normal(0.0, 3.0, n // 2).astype(np.float32),
                           np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 18, -18, 9, -9],
                                    np.float32)])


@pytest.mark.parametrize("target", [*TARGETS, HOST])
@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_compiled_activation_matches_float64(name, target):
    x = sweep(N)
    lib = build_kernels([make_packed_api(lower_fast_exp(activation_kernel(len(x), name)))],
                        target)
    out = kiln.runtime.empty(x.shape, "float32")
    lib.get_function("act")(kiln.runtime.array(x), out)
    got = out.numpy()
    finite = np.isfinite(x)
    err = np.abs(got[finite] - REFERENCE[name](x[finite].astype(np.float64)))
    assert err.max() <= BOUND[name], f"{name} on {target}: max error {err.max():.3g}"
    assert np.isnan(got[np.isnan(x)]).all()


def _single_op(op: str, n: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], op,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8)


@x86_only
@pytest.mark.parametrize("op", ["Sigmoid", "Tanh"])
def test_activation_equals_onnxruntime_bit_for_bit(op, tmp_path):
    x = sweep(1 << 18)
    model = _single_op(op, len(x))
    got = compile_and_run(model, {"x": x}, tmp_path, HOST)[0]
    want = run_onnxruntime(model, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def dynamic_quantized_chain(channels: int = 32, layers: int = 4) -> onnx.ModelProto:
    """``quantize_dynamic``'s operator format, as ddddocr's OCR model has it: per layer
    DynamicQuantizeLinear → ConvInteger (uint8 weights with a zero point) → Cast → Mul by the
    two scales → SiLU (Sigmoid, Mul), tanh on the last layer."""
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        w = rng.integers(0, 256, (channels, channels, 3, 3)).astype(np.uint8)
        inits += [numpy_helper.from_array(w, f"w{k}"),
                  numpy_helper.from_array(np.array(128, np.uint8), f"wz{k}"),
                  numpy_helper.from_array(np.array(0.002 + 0.001 * k, np.float32), f"ws{k}")]
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [x], [f"q{k}", f"s{k}", f"z{k}"]),
            helper.make_node("ConvInteger", [f"q{k}", f"w{k}", f"z{k}", f"wz{k}"], [f"acc{k}"],
                             pads=[1, 1, 1, 1]),
            helper.make_node("Cast", [f"acc{k}"], [f"f{k}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"s{k}", f"ws{k}"], [f"m{k}"]),
            helper.make_node("Mul", [f"f{k}", f"m{k}"], [f"y{k}"]),
        ]
        if k < layers - 1:
            nodes += [helper.make_node("Sigmoid", [f"y{k}"], [f"g{k}"]),
                      helper.make_node("Mul", [f"y{k}", f"g{k}"], [f"a{k}"])]
            x = f"a{k}"
        else:
            nodes.append(helper.make_node("Tanh", [f"y{k}"], ["out"]))
    shape = [1, channels, 24, 24]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8)


@x86_only
def test_dynamically_quantized_chain_equals_onnxruntime(tmp_path):
    """With ``1 / (1 + exp(-x))`` and libm's tanh, SiLU values an ulp off at a layer's range
    moved its run-time scale by an ulp, every value after it with it, and 1123 of the 18432
    outputs differed (in ddddocr's OCR model such a scale also moved roundings, and the logits
    were 0.15 off)."""
    model = dynamic_quantized_chain()
    x = np.random.default_rng(2).normal(0.0, 1.0, (1, 32, 24, 24)).astype(np.float32)
    got = compile_and_run(model, {"x": x}, tmp_path, HOST)[0]
    np.testing.assert_array_equal(got, run_onnxruntime(model, {"x": x})[0])
