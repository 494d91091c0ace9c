"""Weight-only quantized dense kernels, compiled (docs/decisions/018): ONNX MatMul with a weight
initializer (+ Add bias) built with ``kiln.build(quantize_weights=)``, run by the graph
executor (static rows) and the VM (symbolic rows), against numpy with the dequantized weights
(tight) and onnxruntime's float model (quantization error)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import run_exported, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.relay.op.weight_quant import dequantize_q4_1, quantize_int8, quantize_q4_1
from kiln.vm import VirtualMachine

RNG = np.random.default_rng(18)
MODES = ["int8", "q4"]
#: relative error of the quantized outputs against the float model (random weights, scaled
#: by 1/sqrt(K)): int8 ~1e-2, q4 ~1e-1 of the output's range
FLOAT_RTOL = {"int8": 0.03, "q4": 0.3}


def _model(k: int, n: int, rows, bias: bool = True) -> tuple[onnx.ModelProto, np.ndarray]:
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y" if not bias else "xw"])]
    inits = [numpy_helper.from_array(w, "W")]
    if bias:
        nodes.append(helper.make_node("Add", ["xw", "b"], ["y"]))
        inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "b"))
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, w


def _dequantized(w: np.ndarray, mode: str) -> np.ndarray:
    """The ``[K, N]`` weight the quantized kernel computes with."""
    if mode == "int8":
        q, scale = quantize_int8(w.T)
        return (q.astype(np.float32) * scale[:, None]).T
    return dequantize_q4_1(*quantize_q4_1(w.T)).T


def _check(got: np.ndarray, model: onnx.ModelProto, w: np.ndarray, x: np.ndarray,
           mode: str) -> None:
    b = [numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "b"]
    want = x.astype(np.float64) @ _dequantized(w, mode) + (b[0] if b else 0)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale + 1e-6
    (ort,) = run_onnxruntime(model, {"x": x})
    assert np.abs(got - ort).max() <= FLOAT_RTOL[mode] * scale


def _run_graph(model: onnx.ModelProto, x: np.ndarray, target: str, mode: str | None,
               path) -> np.ndarray:
    """Build with the graph executor, export, load, run once."""
    mod, params = from_onnx(model)
    lib = kiln.build(mod, target=target, params=params, quantize_weights=mode)
    return run_exported(lib, path, {"x": x})[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("k, n", [(576, 1536), (1536, 576)])
def test_static_rows(mode, rows, k, n, target, tmp_path):
    model, w = _model(k, n, rows)
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    _check(_run_graph(model, x, target, mode, tmp_path / "m.so"), model, w, x, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, n", [(576, 192), (1536, 576)])
def test_symbolic_rows_on_the_vm(mode, k, n, target, tmp_path):
    model, w = _model(k, n, "M")
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target=target, params=params, quantize_weights=mode)
    exe.export_library(str(tmp_path / "m.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "m.so")), kiln.cpu())
    for rows in (1, 3, 7, 64):
        x = RNG.standard_normal((rows, k)).astype(np.float32)
        got = vm["main"](x).numpy()
        _check(got, model, w, x, mode)


@pytest.mark.parametrize("mode", MODES)
def test_artifact_stores_quantized_weights(mode, tmp_path):
    model, _ = _model(576, 1536, 1, bias=False)
    mod, params = from_onnx(model)
    sizes = {}
    for m in (None, mode):
        lib = kiln.build(mod, target="llvm", params=params, quantize_weights=m)
        lib.export_library(str(tmp_path / f"{m}.so"))
        sizes[m] = (tmp_path / f"{m}.so").stat().st_size
    floats = 576 * 1536 * 4
    # int8: 1/4 of the float weight (+ scales); q4: 1/8 + float32 d and m per 32 (3/16)
    assert sizes[mode] - sizes[None] < -floats * (0.7 if mode == "int8" else 0.78)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_lm_head(mode, tmp_path):
    """SmolLM2-135M's output projection: 576 x 49152 (int8 in both modes: q4 keeps a
    vocabulary projection at 8 bits, QuantizeWeights.Q4_HEAD_CHANNELS)."""
    model, w = _model(576, 49152, 1, bias=False)
    x = RNG.standard_normal((1, 576)).astype(np.float32)
    _check(_run_graph(model, x, "llvm", mode, tmp_path / "m.so"), model, w, x, "int8")
