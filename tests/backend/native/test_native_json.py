"""The ``kiln_json`` BYOC runtime in the native runtime (src/kiln/native/src/rt_json*.c): models
partitioned with ``byoc=["kiln_json"]`` (JSON graphs behind the const loader), exported once,
run by ``kiln_run`` vs onnxruntime and vs the Python runtime on the same file; every built-in
kernel's edge cases (broadcasting, batched matmul, grouped/strided/dilated convolution,
ceil-mode pooling...) as hand-written kiln_json graphs vs ``kiln.runtime.JSONRuntimeModule``;
the loader's errors, and the same under AddressSanitizer + UndefinedBehaviorSanitizer. Damaged
kiln_json modules: tests/backend/native/test_native_fuzz.py (its corpus has them).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from test_native_runtime import assert_close, kiln_run, model_inputs

import kiln
import kiln.runtime as rt
from kiln import models
from kiln.frontend import from_onnx
from kiln.runtime.module import modules_dfs

SEED = 20240601
SANITIZER_ENV = {**os.environ, "ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=1",
                 "UBSAN_OPTIONS": "print_stacktrace=1", "KILN_NUM_THREADS": "1"}


def ops_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model whose kiln_json regions use every built-in kernel but ``nn.conv2d`` alone (the
    composites run the same code): a grouped, strided, dilated, asymmetrically padded conv with
    bias and relu, ceil-mode max pooling, clip, global average pooling, concatenate, reshape,
    dense with bias, a broadcast batched matmul, add and multiply with broadcasting, relu."""
    rng = np.random.default_rng(SEED)

    def w(name, *shape):
        return nh.from_array(rng.standard_normal(shape).astype("float32"), name)

    inits = [w("w1", 8, 2, 3, 3), w("b1", 8), w("w2", 6, 8, 1, 1), w("wd", 10, 24), w("bd", 10),
             w("wm", 4, 5), w("s", 6, 1, 1), nh.from_array(np.array([2, 24], "int64"), "shape"),
             nh.from_array(np.array(-0.5, "float32"), "lo"),
             nh.from_array(np.array(0.75, "float32"), "hi")]
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=2, strides=[2, 1],
                     dilations=[1, 2], pads=[1, 2, 0, 1]),
        oh.make_node("Relu", ["c1"], ["r1"]),
        oh.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 2], strides=[2, 2],
                     pads=[1, 0, 1, 1], ceil_mode=1),
        oh.make_node("Conv", ["p1", "w2"], ["c2"]),
        oh.make_node("Mul", ["c2", "s"], ["m2"]),
        oh.make_node("Clip", ["m2", "lo", "hi"], ["k2"]),
        oh.make_node("GlobalAveragePool", ["k2"], ["g"]),
        oh.make_node("Concat", ["g", "g", "g", "g"], ["cat"], axis=1),
        oh.make_node("Reshape", ["cat", "shape"], ["flat"]),
        oh.make_node("Gemm", ["flat", "wd", "bd"], ["dense"], transB=1),
        oh.make_node("MatMul", ["y", "wm"], ["mm"]),
        oh.make_node("Add", ["mm", "z"], ["sum"]),
        oh.make_node("MatMul", ["y", "q"], ["mm2"]),
        oh.make_node("Mul", ["mm2", "sum"], ["prod"]),
        oh.make_node("Relu", ["prod"], ["act"]),
    ]
    shapes = {"x": (2, 4, 9, 11), "y": (2, 3, 4), "z": (3, 1), "q": (1, 4, 5)}
    graph = oh.make_graph(
        nodes, "kiln_json_ops",
        [oh.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in shapes.items()],
        [oh.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("dense", "act", "k2")],
        inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    return model, {k: rng.standard_normal(s).astype("float32") for k, s in shapes.items()}


def export(model: onnx.ModelProto, inputs: dict[str, np.ndarray], path: Path) -> Path:
    mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
    kiln.build(mod, target="c", params=params, byoc=["kiln_json"]).export_library(str(path))
    return path


@pytest.fixture(scope="module")
def ops_so(tmp_path_factory):
    model, inputs = ops_model()
    return export(model, inputs, tmp_path_factory.mktemp("json-ops") / "ops.so"), model, inputs


def python_outputs(so: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    gm = kiln.graph_executor.GraphModule(rt.load_module(str(so))["default"](kiln.cpu()))
    gm.run(**inputs)
    return [gm.get_output(k).numpy() for k in range(gm.get_num_outputs())]


def check_model(build: Path, so: Path, model, inputs, reference, tmp_path, env=None) -> str:
    want = reference(model, inputs)
    got, stdout = kiln_run(build, so, list(inputs.values()), [(w.shape, w.dtype) for w in want],
                           tmp_path, repeat=1, env=env)
    assert_close(got, want)
    # the Python runtime on the same file: numpy's im2col + BLAS vs direct loops in C
    assert_close(got, python_outputs(so, inputs), rtol=1e-5)
    return stdout


def test_ops_model(native_rt, ops_so, reference, tmp_path):
    so, model, inputs = ops_so
    kernels = {n["name"] for m in modules_dfs(rt.load_module(str(so))) if m.type_key == "kiln_json"
               for n in json.loads(m.graph_json)["nodes"] if n["op"] == "kernel"}
    assert kernels == {"kiln_json.conv2d_bias_relu", "kiln_json.conv2d", "nn.max_pool2d", "clip",
                       "nn.global_avg_pool2d", "concatenate", "reshape", "nn.dense",
                       "nn.bias_add", "nn.matmul", "add", "multiply", "nn.relu"}
    check_model(native_rt, so, model, inputs, reference, tmp_path)


def test_ops_model_under_sanitizers(native_rt_asan, ops_so, reference, tmp_path):
    so, model, inputs = ops_so
    check_model(native_rt_asan, so, model, inputs, reference, tmp_path, env=SANITIZER_ENV)


def test_squeezenet(native_rt, reference, tmp_path):
    """A whole model: squeezenet's convolutions, fire modules (multi-output regions) and pooling
    on kiln_json, random weights."""
    model = models.randomize_weights(onnx.load(models.light_model_path("squeezenet")), seed=SEED)
    inputs = model_inputs(model)
    so = export(model, inputs, tmp_path / "squeezenet.so")
    print(check_model(native_rt, so, model, inputs, reference, tmp_path))


def t(*shape: int) -> dict:
    return {"shape": [list(shape)], "dtype": ["float32"]}


def kernel(name: str, inputs: list[int], out: dict, **attrs) -> dict:
    return {"op": "kernel", "name": name, "inputs": [[i, 0, 0] for i in inputs],
            "attrs": {**attrs, **out}}


def json_factory(graph: dict, consts: dict[str, np.ndarray], symbol: str = "f",
                 mutate=None) -> rt.GraphExecutorFactoryModule:
    """One kiln_json function ``symbol`` behind a const loader, called by a one-op graph
    (inputs ``in0...`` in ``arg_nodes`` order, outputs the heads); ``mutate(module)`` may
    damage the function after the Python side's checks."""
    ext = rt.JSONRuntimeModule(symbol, json.dumps(graph), list(consts))
    if mutate:
        mutate(ext)
    nodes = graph["nodes"]
    types = [nodes[a]["attrs"] for a in graph["arg_nodes"]]
    types += [{"shape": [nodes[h]["attrs"]["shape"][i]], "dtype": [nodes[h]["attrs"]["dtype"][i]]}
              for h, i, _ in graph["heads"]]
    n_in, n_out = len(graph["arg_nodes"]), len(graph["heads"])
    doc = {"nodes": [{"op": "null", "name": f"in{k}", "inputs": []} for k in range(n_in)] + [
        {"op": "tvm_op", "name": symbol, "inputs": [[k, 0, 0] for k in range(n_in)],
         "attrs": {"func_name": symbol, "num_inputs": str(n_in), "num_outputs": str(n_out),
                   "flatten_data": "0"}}],
           "arg_nodes": list(range(n_in)), "heads": [[n_in, k, 0] for k in range(n_out)],
           "node_row_ptr": [*range(n_in + 1), n_in + n_out],
           "attrs": {"dltype": ["list_str", [ty["dtype"][0] for ty in types]],
                     "storage_id": ["list_int", list(range(len(types)))],
                     "shape": ["list_shape", [ty["shape"][0] for ty in types]]}}
    loader = rt.ConstLoaderModule(consts, {symbol: list(consts)} if consts else {})
    loader.import_module(rt.CSourceModule("", []))
    loader.import_module(ext)
    return rt.GraphExecutorFactoryModule(json.dumps(doc), loader, {})


def json_library(path: Path, graph: dict, consts: dict[str, np.ndarray], mutate=None) -> None:
    """:func:`json_factory` exported to ``path``."""
    json_factory(graph, consts, mutate=mutate).export_library(str(path))


def _conv_graph() -> tuple[dict, dict]:
    conv = {"strides": [2, 1], "padding": [0, 1, 2, 1], "dilation": [2, 1], "groups": 4,
            "data_layout": "NCHW", "kernel_layout": "OIHW"}
    g = {"nodes": [{"op": "input", "name": "x", "attrs": t(1, 4, 9, 7)},
                   {"op": "const", "name": "f_const_0", "attrs": t(8, 1, 3, 2)},
                   kernel("nn.conv2d", [0, 1], t(1, 8, 4, 8), **conv),
                   {"op": "input", "name": "b", "attrs": t(8)},
                   kernel("nn.bias_add", [2, 3], t(1, 8, 4, 8), axis=-3),
                   kernel("nn.max_pool2d", [4], t(1, 8, 2, 3), pool_size=[2, 3],
                          strides=[2, 3], padding=[0, 1, 1, 1], dilation=[1, 2],
                          ceil_mode=True)],
         "arg_nodes": [0, 3], "heads": [[5, 0, 0], [2, 0, 0], [3, 0, 0]]}
    return g, {"f_const_0": np.random.default_rng(1).standard_normal((8, 1, 3, 2), "float32")}


def _matmul_graph() -> tuple[dict, dict]:
    g = {"nodes": [{"op": "input", "name": "a", "attrs": t(2, 1, 3)},
                   {"op": "input", "name": "b", "attrs": t(4, 1)},
                   kernel("add", [0, 1], t(2, 4, 3)),
                   kernel("multiply", [2, 1], t(2, 4, 3)),
                   {"op": "input", "name": "v", "attrs": t(3)},
                   kernel("nn.matmul", [3, 4], t(2, 4)),
                   {"op": "const", "name": "f_const_0", "attrs": t(3, 3)},
                   kernel("nn.matmul", [4, 6], t(3)),
                   kernel("nn.matmul", [3, 6], t(2, 4, 3)),
                   {"op": "input", "name": "m", "attrs": t(3, 1, 2, 4)},
                   kernel("nn.dense", [8, 6], t(2, 4, 3)),
                   kernel("concatenate", [10, 3, 10], t(2, 4, 9), axis=-1),
                   kernel("reshape", [11], t(8, 9)),
                   kernel("clip", [12], t(8, 9), a_min=-1.5, a_max=2),
                   kernel("nn.relu", [13], t(8, 9)),
                   kernel("nn.matmul", [9, 3], t(3, 2, 2, 3))],
         "arg_nodes": [0, 1, 4, 9],
         "heads": [[14, 0, 0], [5, 0, 0], [14, 0, 0], [7, 0, 0], [15, 0, 0], [4, 0, 0]]}
    return g, {"f_const_0": np.random.default_rng(2).standard_normal((3, 3), "float32")}


@pytest.mark.parametrize("build", ["native_rt", "native_rt_asan"], ids=["O2", "sanitizers"])
@pytest.mark.parametrize("graph", [_conv_graph, _matmul_graph], ids=["conv", "matmul"])
def test_kernels_vs_python(request, build, graph, tmp_path):
    """Hand-written graphs: depthwise strided dilated conv with asymmetric padding, bias_add
    on a negative axis, dilated ceil-mode pooling; broadcast add/multiply, 1-D and batched
    matmul, dense over a 3-D input, concatenate on a negative axis, reshape, clip, relu; an
    input and a repeated kernel as outputs. kiln_run vs the Python runtime on the same file."""
    g, consts = graph()
    json_library(tmp_path / "f.so", g, consts)
    rng = np.random.default_rng(3)
    ins = [rng.standard_normal(g["nodes"][a]["attrs"]["shape"][0], "float32")
           for a in g["arg_nodes"]]
    want = python_outputs(tmp_path / "f.so", {f"in{k}": x for k, x in enumerate(ins)})
    got, _ = kiln_run(request.getfixturevalue(build), tmp_path / "f.so", ins,
                      [(w.shape, w.dtype) for w in want], tmp_path, repeat=1, env=SANITIZER_ENV)
    assert_close(got, want, rtol=1e-5)


def _set_graph(edit):
    def mutate(ext: rt.JSONRuntimeModule) -> None:
        g = json.loads(ext.graph_json)
        edit(g)
        ext.graph_json = json.dumps(g)
    return mutate


@pytest.mark.parametrize("mutate, consts, message", [
    (_set_graph(lambda g: g["nodes"][2]["attrs"].update(strides=[1, 1])), None,
     "kiln_json module 'f': node 2 (nn.conv2d): input and output shapes do not fit nn.conv2d"),
    (_set_graph(lambda g: g["nodes"][5].update(name="nn.softmax")), None,
     "kiln_json module 'f': node 5: no kiln_json kernel for 'nn.softmax'"),
    (_set_graph(lambda g: g["nodes"][5]["attrs"].update(dtype=["float64"])), None,
     "node 5 (nn.max_pool2d): the C kiln_json kernels take float32, output 0 is float64"),
    (_set_graph(lambda g: g["nodes"][4]["attrs"].pop("axis")), None,
     "node 4 (nn.bias_add): attr 'axis' must be an integer"),
    (None, {"f_const_0": np.zeros((8, 1, 2, 3), "float32")},
     "kiln_json f: constant f_const_0 is (8, 1, 2, 3) float32, expected (8, 1, 3, 2)"),
], ids=["shapes", "kernel", "dtype", "attr", "constant"])
def test_load_errors_name_the_module_and_node(native_rt, mutate, consts, message, tmp_path):
    g, good = _conv_graph()
    json_library(tmp_path / "f.so", g, consts or good, mutate)
    x = tmp_path / "x.bin"
    np.zeros((1, 4, 9, 7), "float32").tofile(x)
    np.zeros(8, "float32").tofile(tmp_path / "b.bin")
    proc = subprocess.run([str(native_rt / "kiln_run"), str(tmp_path / "f.so"), str(x),
                           str(tmp_path / "b.bin"), *[str(tmp_path / f"o{k}") for k in range(3)]],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
