"""Profiles and dumps in the model's terms on a real compiled conv model: the ONNX nodes each
fused kernel covers in the graph JSON and the ``--profile`` table, ``--dump-outputs`` tensors
keyed by ONNX tensor name in NCHW (compared with onnxruntime's values of the same tensors), and
the ``--profile-json`` Chrome trace."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
import kiln.runtime as rt
from kiln.cli import main as cli
from kiln.debug_executor import GraphModuleDebug
from kiln.frontend import from_onnx

SHAPE = (1, 3, 12, 12)


def conv_model() -> onnx.ModelProto:
    """Conv+Add+HardSwish, Conv+BatchNorm+Relu (100 channels: with blocks of 8 padded to 104,
    which the dump crops), MaxPool, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(0)

    def init(name, shape, low=None):
        value = rng.standard_normal(shape).astype("float32") * 0.3
        return numpy_helper.from_array(np.abs(value) + low if low else value, name)

    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="Conv_0"),
        node("Add", ["c1", "a1"], ["s1"], name="Add_1"),
        node("HardSwish", ["s1"], ["h1"], name="HardSwish_2"),
        node("Conv", ["h1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="Conv_3"),
        node("BatchNormalization", ["c2", "g", "bb", "m", "v"], ["n2"], name="BN_4"),
        node("Relu", ["n2"], ["r2"], name="Relu_5"),
        node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="MaxPool_6"),
        node("GlobalAveragePool", ["p2"], ["g2"], name="GAP_7"),
        node("Flatten", ["g2"], ["f2"], name="Flatten_8"),
        node("Gemm", ["f2", "wf", "bf"], ["y"], transB=1, name="Gemm_9"),
    ]
    inits = [init("w1", (16, 3, 3, 3)), init("b1", (16,)), init("a1", (1, 16, 1, 1)),
             init("w2", (100, 16, 3, 3)), init("g", (100,)), init("bb", (100,)), init("m", (100,)),
             init("v", (100,), low=0.5), init("wf", (10, 100)), init("bf", (10,))]
    graph = helper.make_graph(nodes, "convnet",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


MODEL = conv_model()
NODE_NAMES = {n.name for n in MODEL.graph.node}
TENSOR_NAMES = {o for n in MODEL.graph.node for o in n.output} | {"x"}


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> str:
    mod, params = from_onnx(MODEL)
    path = str(tmp_path_factory.mktemp("onnxprof") / "convnet.so")
    kiln.build(mod, target="llvm", params=params).export_library(path)
    return path


def ort_values(names: list[str], x: np.ndarray) -> dict[str, np.ndarray]:
    """onnxruntime's values of the tensors ``names``: the model with them as graph outputs."""
    model = onnx.ModelProto.FromString(MODEL.SerializeToString())
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))


def kernel_nodes(library: str) -> list[dict]:
    dbg = GraphModuleDebug(rt.load_module(library)["debug_create"](rt.cpu()))
    graph = json.loads(dbg.module["get_graph_json"]())
    return [n for n in graph["nodes"] if n["op"] == "tvm_op"]


def test_graph_json_names_the_onnx_nodes(library):
    nodes = kernel_nodes(library)
    covered = {tuple(json.loads(n["attrs"]["onnx_nodes"])): n["attrs"] for n in nodes
               if "onnx_nodes" in n["attrs"]}
    assert ("Conv_0", "Add_1", "HardSwish_2") in covered
    first = covered[("Conv_0", "Add_1", "HardSwish_2")]
    assert json.loads(first["onnx_op_types"]) == ["Conv", "Add", "HardSwish"]
    assert first["onnx_output"] == "h1" and first["onnx_layout"].startswith("NCHW")
    assert json.loads(first["onnx_shape"]) == [1, 16, 12, 12]
    for names in covered:
        assert set(names) <= NODE_NAMES
    outputs = [a["onnx_output"] for a in covered.values() if "onnx_output" in a]
    assert len(outputs) == len(set(outputs)) and "y" in outputs
    dbg = GraphModuleDebug(rt.load_module(library)["debug_create"](rt.cpu()))
    name = next(n["name"] for n in nodes if n["attrs"].get("onnx_output") == "h1")
    source = dbg.onnx_source(name)
    assert source.nodes == ("Conv_0", "Add_1", "HardSwish_2") and source.shape == (1, 16, 12, 12)
    assert dbg.onnx_source("x") is None  # a graph input


def test_profile_table_lists_onnx_nodes(library, capsys):
    assert cli.main(["run", library, "--profile"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("Node Name"))
    assert header.split()[-2:] == ["ONNX", "nodes"]
    row = next(line for line in lines if "Conv_0, Add_1, HardSwish_2" in line)
    assert "1x16x12x12 (NCHW" in row  # the model's shape, then the layout the kernel keeps
    assert any(line.rstrip().endswith("Gemm_9") for line in lines)


def test_dump_outputs_match_onnxruntime(library, tmp_path):
    dump = tmp_path / "dump"
    assert cli.main(["run", library, "--dump-outputs", str(dump), "--seed", "4"]) == 0
    with np.load(dump / "onnx_tensors.npz") as z:
        got = {k: z[k] for k in z.files}
    assert set(got) <= TENSOR_NAMES
    assert {"h1", "r2", "p2", "g2", "y"} <= set(got)
    assert got["r2"].shape == (1, 100, 12, 12)  # NCHW, not NCHWc, and without padded channels
    want = ort_values(sorted(set(got) - {"x", "y"}), got["x"])
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    manifest = json.loads((dump / "nodes.json").read_text())
    conv = next(m for m in manifest if m.get("onnx_output") == "h1")
    assert conv["onnx_nodes"] == ["Conv_0", "Add_1", "HardSwish_2"]
    assert len(conv["shapes"][0]) == 5  # the raw .npy keeps the kernel's layout


def test_profile_json_is_a_chrome_trace(library, tmp_path, capsys):
    trace_path = tmp_path / "trace.json"
    assert cli.main(["run", library, "--profile-json", str(trace_path), "--repeat", "3"]) == 0
    assert f"wrote {trace_path}" in capsys.readouterr().out
    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"]
    calls = [e for e in events if e["cat"] == "Node"]
    assert len(calls) == 3 * len(kernel_nodes(library))
    assert len([e for e in events if e["name"] == "model_run"]) == 3
    for e in events:
        assert e["ph"] == "X" and e["dur"] > 0 and e["ts"] >= 0
        assert {"pid", "tid", "args"} <= set(e)
    assert [e["ts"] for e in calls] == sorted(e["ts"] for e in calls)
    named = [e for e in calls if e["args"]["onnx_nodes"]]
    assert named and all(set(e["args"]["onnx_nodes"]) <= NODE_NAMES for e in named)
    conv = next(e for e in named if e["args"]["onnx_nodes"][0] == "Conv_0")
    assert conv["name"] == "Conv_0, Add_1, HardSwish_2"
    assert conv["args"]["onnx_op_types"] == ["Conv", "Add", "HardSwish"]
    assert conv["args"]["input_type_shape"][0] == {"float32": list(SHAPE)}
    assert conv["args"]["onnx_output"] == "h1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # no temp file left


def test_vm_library_profile_names_the_onnx_nodes(tmp_path, capsys):
    """A VM library (symbolic batch): the table and the trace name each call's ONNX nodes (the
    executable's sources section); events are timestamped when the VM called the kernel."""
    from model_helpers import with_symbolic_batch

    from kiln.vm import VirtualMachine

    mod, params = from_onnx(with_symbolic_batch(MODEL))
    path = tmp_path / "convnet_vm.so"
    kiln.build(mod, target="llvm", params=params).export_library(str(path))
    x = np.random.default_rng(2).standard_normal((2, *SHAPE[1:])).astype("float32")
    calls = VirtualMachine(rt.load_module(str(path)), kiln.cpu()).profile("main", x).rows
    assert ("Conv_0", "Add_1", "HardSwish_2") in [r.onnx_nodes for r in calls]
    trace_path = tmp_path / "vm.json"
    assert cli.main(["run", str(path), "--input-shape", "x:2x3x12x12", "--repeat", "2",
                     "--profile-json", str(trace_path)]) == 0
    out = capsys.readouterr().out
    assert any(line.rstrip().endswith("Conv_0, Add_1, HardSwish_2") for line in out.splitlines())
    events = json.loads(trace_path.read_text())["traceEvents"]
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 2 * len(calls)
    assert all(e["dur"] > 0 and set(e["args"]["onnx_nodes"]) <= NODE_NAMES for e in nodes)
    runs = [e for e in events if e["name"] == "model_run"]
    assert len(runs) == 2
    for e in nodes:  # inside its run
        run = runs[0] if e["ts"] < runs[1]["ts"] else runs[1]
        assert run["ts"] <= e["ts"] and e["ts"] + e["dur"] <= run["ts"] + run["dur"] + 0.01
    gemm = next(e for e in nodes if e["args"]["onnx_nodes"] == ["Gemm_9"])
    assert gemm["args"]["output_type_shape"] == [{"float32": [2, 10]}]
