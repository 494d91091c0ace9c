"""Debug executor (per-node time and outputs) on an exported, re-loaded library and on a fresh
build, and the CLI that uses it: ``kiln run --profile --dump-outputs`` and
``kiln inspect --graph --params``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from executor_helpers import kernels, make_graph

import kiln.runtime as rt
from kiln.cli import main as cli
from kiln.debug_executor import DebugReport, GraphModuleDebug, NodeTime
from kiln.errors import KilnError
from kiln.graph_executor import create
from kiln.runtime.graph_executor.onnx_source import OnnxSource

SHAPE = (4, 16)
P0 = np.arange(64, dtype="float32").reshape(SHAPE) / 7
# out reuses add1's storage: add1's value is gone after a plain run.
GRAPH = make_graph(["x", "y", "p0"],
                   [("add1", "k_add", ["x", "y"]), ("mul2", "k_mul", ["add1", "p0"]),
                    ("out", "k_add", ["mul2", "x"])],
                   ["out"], {"x": SHAPE}, storage={"out": 3}, output_names=["result"])
X = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
Y = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
NODE_VALUES = {"add1": X + Y, "mul2": (X + Y) * P0, "out": (X + Y) * P0 + X}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("dbg") / "model.so")
    rt.GraphExecutorFactoryModule(GRAPH, kernels(), {"p0": P0}).export_library(path)
    return path


def test_debug_run_on_exported_library(exported, tmp_path):
    loaded = rt.load_module(exported)
    dbg = GraphModuleDebug(loaded["debug_create"]("default", rt.cpu()),
                           dump_root=tmp_path / "dump")
    report = dbg.run(repeat=3, x=X, y=Y)
    assert report is dbg.report
    assert [(n.nid, n.name, n.func_name) for n in report.nodes] == [
        (3, "add1", "k_add"), (4, "mul2", "k_mul"), (5, "out", "k_add")]
    for n in report.nodes:
        assert len(n.times_s) == 3 and min(n.times_s) > 0 and n.shapes == (SHAPE,)
    np.testing.assert_allclose(dbg.get_output(0).numpy(), NODE_VALUES["out"], rtol=1e-6)

    manifest = json.loads((tmp_path / "dump" / "nodes.json").read_text())
    assert [m["name"] for m in manifest] == ["x", "y", "add1", "mul2", "out"]
    for m in manifest[2:]:  # each node's own value, though add1's storage is reused by out
        got = np.load(tmp_path / "dump" / m["files"][0])
        np.testing.assert_allclose(got, NODE_VALUES[m["name"]], rtol=1e-6)
        assert m["median_us"] > 0 and m["shapes"] == [list(SHAPE)]
    np.testing.assert_array_equal(np.load(tmp_path / "dump" / "0000_x_0.npy"), X)
    assert json.loads((tmp_path / "dump" / "graph.json").read_text()) == json.loads(GRAPH)


def test_node_outputs_follow_execution(exported):
    dbg = GraphModuleDebug(rt.load_module(exported)["debug_create"](rt.cpu()))
    dbg.set_input(x=X, y=Y)
    with pytest.raises(KilnError, match=r"node 3 \(add1\) has not been executed yet"):
        dbg.get_node_output("add1")
    dbg.run()
    with pytest.raises(KilnError, match=r"node 3 \(add1\): its output was overwritten by node 5 "
                                        r"\(out\)"):
        dbg.get_node_output(3)
    dbg.execute_node("add1")
    np.testing.assert_allclose(dbg.get_node_output("add1").numpy(), NODE_VALUES["add1"])
    with pytest.raises(KilnError, match=r"node 4 \(mul2\) has not been executed yet"):
        dbg.get_node_output("mul2")
    dbg.execute_node("out")
    for name, want in list(NODE_VALUES.items())[1:]:
        np.testing.assert_allclose(dbg.get_node_output(name).numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(dbg.get_node_output("p0").numpy(), P0)
    with pytest.raises(KilnError, match="no node named 'nope'"):
        dbg.get_node_output("nope")
    with pytest.raises(KilnError, match="node index 17 out of range"):
        dbg.execute_node(17)
    times = dbg.module["run_individual_node"](4, 2, 3)
    assert len(times) == 3 and min(times) > 0
    np.testing.assert_allclose(dbg.get_node_output("mul2").numpy(), NODE_VALUES["mul2"])
    with pytest.raises(KilnError, match=r"node 0 \(x\) runs no kernel"):
        dbg.module["run_individual_node"](0)
    with pytest.raises(KilnError, match="repeat must be a positive integer"):
        dbg.run_individual(1, 0)


def test_debug_create_errors(exported):
    loaded = rt.load_module(exported)
    with pytest.raises(KilnError, match="this factory is 'default', not 'other'"):
        loaded["debug_create"]("other", rt.cpu())
    with pytest.raises(KilnError, match="needs a debug executor.*lacks run_individual"):
        GraphModuleDebug(loaded["default"](rt.cpu()))


def test_create_debug_on_fresh_build():
    dbg = create(GRAPH, kernels(), debug=True)
    assert isinstance(dbg, GraphModuleDebug)
    report = dbg.run(x=X, y=Y, p0=P0)
    assert len(report.nodes) == 3
    np.testing.assert_allclose(dbg.get_output("result").numpy(), NODE_VALUES["out"], rtol=1e-6)


def test_report_table():
    nodes = [NodeTime(3, "a", "k_a", ((2, 3),), ("float32",), (1e-6, 3e-6, 2e-6)),
             NodeTime(4, "bb", "k_b", ((4,), (5,)), ("float32", "float32"), (6e-6,))]
    report = DebugReport(nodes, number=1, repeat=3)
    assert report.total_us == pytest.approx(8.0)
    lines = report.table().splitlines()
    assert lines[0].split() == ["Node", "Name", "Ops", "Time(us)", "Min(us)", "Time(%)", "Shape"]
    assert lines[2].split() == ["bb", "k_b", "6.0", "6.0", "75.0", "4,", "5"]  # slowest first
    assert lines[3].split() == ["a", "k_a", "2.0", "1.0", "25.0", "2x3"]
    assert lines[5].split() == ["Total", "8.0", "100.0"]
    assert report.table(sort_by_time=False).splitlines()[2].startswith("a ")
    assert "... 1 more nodes" in report.table(top=1)
    assert report.to_dict()["nodes"][0]["median_us"] == pytest.approx(2.0)


def test_report_table_with_onnx_nodes():
    many = OnnxSource(tuple(f"Mul_{k}" for k in range(5)), ("Mul",) * 5, "m4", "NCHW8c",
                      (1, 20, 2, 2))
    nodes = [NodeTime(3, "a", "k_a", ((1, 3, 2, 2, 8),), ("float32",), (4e-6,), many),
             NodeTime(4, "b", "k_b", ((2, 3),), ("float32",), (1e-6,))]
    lines = DebugReport(nodes, number=1, repeat=1).table().splitlines()
    assert lines[0].split()[-3:] == ["Shape", "ONNX", "nodes"]
    assert lines[2].split()[-7:] == ["1x20x2x2", "(NCHW8c)", "Mul_0,", "Mul_1,", "Mul_2", "+2",
                                     "more"]
    assert lines[3].split()[-1] == "2x3"  # a kernel that covers no ONNX node: blank
    assert DebugReport(nodes, 1, 1).to_dict()["nodes"][0]["onnx_output"] == "m4"


# ------------------------------------------------------------------------------ CLI
def test_cli_profile_and_dump(exported, tmp_path, capsys):
    dump = tmp_path / "nodes"
    assert cli.main(["run", exported, "--profile", "--repeat", "2", "--dump-outputs",
                     str(dump), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "output result: shape (4, 16) float32" in out
    header = next(line for line in out.splitlines() if line.startswith("Node Name"))
    assert header.split()[2:] == ["Ops", "Time(us)", "Min(us)", "Time(%)", "Shape"]
    for name in ("add1", "mul2", "out", "Total"):
        assert any(line.split()[0] == name for line in out.splitlines() if line.strip())
    assert "median of 2 measurement(s)" in out
    files = {m["name"]: m["files"][0] for m in json.loads((dump / "nodes.json").read_text())}
    x, y = np.load(dump / files["x"]), np.load(dump / files["y"])
    np.testing.assert_allclose(np.load(dump / files["add1"]), x + y, rtol=1e-6)


def test_cli_library_without_onnx_attrs(exported, tmp_path, capsys):
    """A library whose graph JSON has no ``onnx_*`` attrs (built before them, or not from ONNX)
    still profiles: no ONNX column, no onnx_tensors.npz, trace events named by node."""
    trace = tmp_path / "t.json"
    assert cli.main(["run", exported, "--profile-json", str(trace), "--dump-outputs",
                     str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "ONNX nodes" not in out
    assert not (tmp_path / "d" / "onnx_tensors.npz").exists()
    calls = [e for e in json.loads(trace.read_text())["traceEvents"] if e["cat"] == "Node"]
    assert [e["name"] for e in calls] == ["add1", "mul2", "out"]
    assert all(e["dur"] > 0 and e["args"]["onnx_nodes"] == [] for e in calls)
    assert calls[0]["args"]["input_type_shape"] == [{"float32": list(SHAPE)}] * 2


def test_cli_profile_json_unwritable(exported, tmp_path, capsys):
    assert cli.main(["run", exported, "--profile-json", str(tmp_path / "no" / "t.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot write" in err[0] and "no" in err[0]


def test_cli_inspect_extracts_graph_and_params(exported, tmp_path, capsys):
    graph, params = tmp_path / "g.json", tmp_path / "m.params"
    assert cli.main(["inspect", exported, "--graph", str(graph), "--params", str(params)]) == 0
    out = capsys.readouterr().out
    assert "GraphExecutorFactory: debug_create, default" in out and "library: k_add" in out
    assert graph.read_text() == GRAPH
    loaded = rt.load_param_dict(params.read_bytes())
    assert list(loaded) == ["p0"]
    np.testing.assert_array_equal(loaded["p0"].numpy(), P0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "m.params"]  # no temp left


def test_cli_inspect_unwritable_output(exported, tmp_path, capsys):
    assert cli.main(["inspect", exported, "--params", str(tmp_path / "no" / "m.params")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kiln: error: cannot write")
