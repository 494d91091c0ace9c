"""An input declared as a scalar (ONNX shape ``[]``) takes what onnxruntime takes there: one
element of any rank (silero VAD v4's ``sr``, fed as ``[16000]`` by the corpus); more elements are
refused with a ShapeError naming the input (kiln.runtime.scalar_inputs). Both executors: the
graph executor (static model; set_input and set_input_zero_copy) and the VM (symbolic ``n``),
with numpy arrays and NDArrays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper

import kiln
from kiln.errors import ShapeError
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

FED = [(), (1,), (1, 1)]


def _model(n: int | str) -> onnx.ModelProto:
    """``y = x * sr + (sr == 16000)``: an int64 scalar ``sr`` used by a broadcast and a
    comparison, as silero's If condition uses it."""
    nodes = [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "srf"], ["m"]),
             helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("Cast", ["is16k"], ["flag"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["m", "flag"], ["y"])]
    graph = helper.make_graph(
        nodes, "scalar_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [helper.make_tensor("rate", TensorProto.INT64, [], [16000])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _built(model: onnx.ModelProto, path) -> kiln.runtime.Module:
    mod, params = from_onnx(model)
    kiln.build(mod, target="llvm", params=params).export_library(str(path))
    return kiln.runtime.load_module(str(path))


@pytest.fixture(scope="module")
def graph_module(tmp_path_factory):
    lib = _built(_model(3), tmp_path_factory.mktemp("scalar") / "static.so")
    return kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    lib = _built(_model("n"), tmp_path_factory.mktemp("scalar") / "symbolic.so")
    return VirtualMachine(lib, kiln.cpu())


X = np.array([0.5, -1.0, 2.0], np.float32)


def _want(sr: np.ndarray) -> np.ndarray:
    (y,) = run_onnxruntime(_model(3), {"x": X, "sr": sr})  # onnxruntime takes each shape
    return y.reshape(X.shape)  # (and keeps the fed rank where it broadcasts: Kiln does not)


@pytest.mark.parametrize("shape", FED)
def test_graph_executor_takes_a_one_element_scalar_input(graph_module, shape):
    sr = np.full(shape, 16000, np.int64)
    graph_module.set_input("x", X)
    graph_module.set_input("sr", sr)
    graph_module.run()
    np.testing.assert_array_equal(graph_module.get_output(0).numpy(), _want(sr))
    graph_module.set_input_zero_copy("sr", kiln.runtime.array(np.full(shape, 8000, np.int64)))
    graph_module.run()
    want = _want(np.array(8000, np.int64))
    np.testing.assert_array_equal(graph_module.get_output(0).numpy(), want)


@pytest.mark.parametrize("shape", FED)
def test_vm_takes_a_one_element_scalar_input(vm, shape):
    sr = np.full(shape, 16000, np.int64)
    np.testing.assert_array_equal(vm["main"](X, sr).numpy(), _want(sr))
    got = vm["main"](X, kiln.runtime.array(np.full(shape, 8000, np.int64))).numpy()
    np.testing.assert_array_equal(got, _want(np.array(8000, np.int64)))


def test_a_scalar_input_refuses_more_elements(graph_module, vm):
    expected = r"input 'sr': expected a scalar \(shape \(\), or one element of any rank\), got " \
               r"shape \({}\)"
    two = np.array([16000, 8000], np.int64)
    with pytest.raises(ShapeError, match=expected.format("2,")):
        graph_module.set_input("sr", two)
    with pytest.raises(ShapeError, match=expected.format("2,")):
        vm["main"](X, two)
    with pytest.raises(ShapeError, match=expected.format("1, 0")):
        vm["main"](X, np.zeros((1, 0), np.int64))
