"""Run-time control flow through the VM: an ONNX If whose condition is data, with symbolic
shapes, branches reading outer values and weights, two outputs; against ONNX's reference
evaluator, on c and llvm, and through the ONNX backend."""

from __future__ import annotations

import numpy as np
import onnx_loops
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import compile_vm

import kiln
from kiln.driver import onnx_backend as backend
from kiln.errors import CompileError
from kiln.frontend import from_onnx
from kiln.relay.graph import IfCall, post_order


def _if_model():
    """z = (sum(x) > 0 ? relu(x * w) : x - w) + x, and the branch's own y as a second output."""
    f = TensorProto.FLOAT
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["o"]),
         helper.make_node("Identity", ["w"], ["ow"])],
        "then", [], [helper.make_tensor_value_info("o", f, ["n", 4]),
                     helper.make_tensor_value_info("ow", f, [4])])
    other = helper.make_graph(
        [helper.make_node("Sub", ["x", "w"], ["o2"]), helper.make_node("Neg", ["w"], ["nw"])],
        "else", [], [helper.make_tensor_value_info("o2", f, ["n", 4]),
                     helper.make_tensor_value_info("nw", f, [4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y", "v"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["y", "x"], ["z"])]
    inits = [helper.make_tensor("w", f, [4], [1, -2, 3, -4]),
             helper.make_tensor("zero", f, [], [0.0])]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", f, ["n", 4])],
                              [helper.make_tensor_value_info("z", f, ["n", 4]),
                               helper.make_tensor_value_info("v", f, [4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cases():
    rng = np.random.default_rng(0)
    for sign, n in ((1, 3), (-1, 5), (1, 1), (-1, 2)):
        yield sign * np.abs(rng.standard_normal((n, 4))).astype("float32")


def test_data_condition_becomes_a_run_time_if():
    mod, _ = from_onnx(_if_model())
    (node,) = [n for n in post_order(mod["main"].outputs) if isinstance(n, IfCall)]
    assert node.num_outputs == 2 and len(node.then_body.params) == len(node.args) - 1
    mod, _ = from_onnx(_if_model(), shape={"x": (2, 4)})  # static: still needs the VM
    with pytest.raises(CompileError, match="If or Loop decided by data"):
        kiln.build(mod, target="c", executor="graph", params={})


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_if_runs_either_branch_at_any_shape(target, tmp_path):
    model = _if_model()
    vm = compile_vm(model, tmp_path / "if.so", target, instruction=" if ")
    ref = ReferenceEvaluator(model)
    for x in _cases():
        got = [o.numpy() for o in vm["main"](x)]
        for g, w in zip(got, ref.run(None, {"x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_an_if_on_data_replays_the_branch_it_traced(tmp_path):
    """A function with an If on data is replayed: the trace follows the branch the recorded
    call took and checks the condition first; a call that takes the other branch fails the
    guard, is interpreted (right values) and traced again. A stream that keeps its branch
    (silero VAD's sample rate) replays every call after the first."""
    model = _if_model()
    vm = compile_vm(model, tmp_path / "if.so", "c", instruction=" if ")
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(1)
    signs = (1, 1, 1, -1, -1, -1, 1, 1)
    for sign in signs:
        x = sign * np.abs(rng.standard_normal((3, 4))).astype("float32")
        for g, w in zip(vm["main"](x), ref.run(None, {"x": x})):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)
    stats = vm.replay_stats()
    assert stats["guard_failures"] == 2  # (the two changes of branch)
    assert stats["replays"] == len(signs) - 1 - 2
    assert stats["recordings"] == 3
    # the kernels before the condition, its guard, the branch's kernels and the copies of its
    # results into the If's (C calls in the batch, not Python steps)
    (trace,) = vm.module._traces.values()
    assert [s[0] for s in trace.steps] == ["batch", "py", "batch"]


def test_onnx_backend_runs_the_if_model():
    model = _if_model()
    rep = backend.prepare(model)
    for x in _cases():
        for g, w in zip(rep.run([x]), ReferenceEvaluator(model).run(None, {"x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def _loop_model():
    """y = x; up to M times while the condition holds: y = 2 y + w, cond = sum(y) < 100."""
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "two"], ["t"]),
         helper.make_node("Add", ["t", "w"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", i64, []),
                 helper.make_tensor_value_info("c_in", b, []),
                 helper.make_tensor_value_info("y_in", f, ["n", 3])],
        [helper.make_tensor_value_info("c_out", b, []),
         helper.make_tensor_value_info("y_out", f, ["n", 3])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "c0", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("x", f, ["n", 3]),
         helper.make_tensor_value_info("M", i64, []), helper.make_tensor_value_info("c0", b, [])],
        [helper.make_tensor_value_info("y", f, ["n", 3])],
        [helper.make_tensor("two", f, [], [2.0]), helper.make_tensor("w", f, [3], [0.5, -1, 1]),
         helper.make_tensor("limit", f, [], [100.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


LOOP_CASES = [((2, 3), 5, True), ((4, 3), 50, True), ((1, 3), 3, False), ((3, 3), 0, True)]


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_loop_with_data_trip_count_and_condition(target, tmp_path):
    model = _loop_model()
    vm = compile_vm(model, tmp_path / "loop.so", target, instruction=" goto ")
    ref = ReferenceEvaluator(model)
    for shape, trips, cond in LOOP_CASES:  # runs the trip count, stops early, or not at all
        feed = {"x": np.full(shape, 0.5, "float32"), "M": np.array(trips, np.int64),
                "c0": np.array(cond)}
        got = vm["main"](feed["x"], feed["M"], feed["c0"]).numpy()
        np.testing.assert_allclose(got, ref.run(None, feed)[0], rtol=1e-6)


LOOP_SCAN_CASES = [(onnx_loops.trip_count_model, onnx_loops.trip_count_feeds, "c"),
                   (onnx_loops.trip_count_model, onnx_loops.trip_count_feeds, "llvm"),
                   (onnx_loops.threshold_model, onnx_loops.threshold_feeds, "c"),
                   (onnx_loops.downstream_model, onnx_loops.downstream_feeds, "c")]


@pytest.mark.parametrize("make, feeds, target", LOOP_SCAN_CASES,
                         ids=["trip_count-c", "trip_count-llvm", "threshold-c", "downstream-c"])
def test_loop_stacks_scan_outputs_over_a_run_time_count(make, feeds, target, tmp_path):
    """(a) a data trip count, (b) no trip count and a data condition, (c) no iteration
    (in the feeds: M = 0, c0 false), (d) the stacked outputs feeding kernels."""
    model = make()
    vm = compile_vm(model, tmp_path / "loop_scan.so", target, instruction="vm.builtin.list_stack")
    for feed in feeds():
        got = [o.numpy() for o in vm["main"](*feed.values())]
        onnx_loops.check_references(model, feed, got)


def test_loop_scan_outputs_are_empty_of_the_element_shape(tmp_path):
    vm = compile_vm(onnx_loops.threshold_model(), tmp_path / "empty.so", "c",
                    instruction="list_new")
    x = np.ones((3, 2), np.float32)
    outs = [o.numpy() for o in vm["main"](x, np.array(False), np.array(1.0, np.float32))]
    assert [o.shape for o in outs] == [(3, 2), (0,), (0, 3, 2), (0,)]
    vm = compile_vm(onnx_loops.downstream_model(), tmp_path / "down.so", "c",
                    instruction="list_new")
    total, sq = (o.numpy() for o in vm["main"](np.ones(4, np.float32), np.array(0, np.int64)))
    np.testing.assert_array_equal(total, np.zeros(4, np.float32))
    assert sq.shape == (0,)


def test_onnx_backend_runs_the_loop_scan_model():
    model = onnx_loops.trip_count_model()
    rep = backend.prepare(model)
    for feed in list(onnx_loops.trip_count_feeds())[:3]:
        onnx_loops.check_references(model, feed, list(rep.run(list(feed.values()))))
    assert not rep.bound, "the trip count stays an input (one VM artifact for every count)"


def _squeeze_guard_model():
    """The exporters' ``squeeze(-1)`` on a symbolic dim: ``If(Shape(x)[2] == 1, Squeeze,
    Identity)``, then a MatMul that needs rank 2 (only the Squeeze branch fits it)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "last"], ["sq"])], "then", [],
                             [helper.make_tensor_value_info("sq", f, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["id"])], "else", [],
                              [helper.make_tensor_value_info("id", f, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "two"], ["t"], axis=0),
             helper.make_node("Equal", ["t", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["y", "w"], ["z"])]
    inits = [helper.make_tensor("last", i64, [1], [2]), helper.make_tensor("two", i64, [], [2]),
             helper.make_tensor("one", i64, [], [1]),
             helper.make_tensor("w", f, [4, 3], np.arange(12) / 7)]
    graph = helper.make_graph(nodes, "squeeze_guard",
                              [helper.make_tensor_value_info("x", f, ["n", 4, "t"])],
                              [helper.make_tensor_value_info("z", f, ["n", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_condition_on_a_symbolic_dim_refines_its_branch(tmp_path):
    """The condition is computed from the shape heap at run time; the Squeeze branch sees
    ``t == 1``; the Identity branch, whose rank-3 result cannot have the other's type, is an
    error when taken."""
    from kiln.errors import ShapeError

    model = _squeeze_guard_model()
    vm = compile_vm(model, tmp_path / "guard.so", "c", instruction="shape_to_tensor")
    ref = ReferenceEvaluator(model)
    for n in (1, 5):
        x = np.random.default_rng(n).standard_normal((n, 4, 1)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), ref.run(None, {"x": x})[0],
                                   rtol=1e-5)
    with pytest.raises(ShapeError, match="else branch cannot run at these shapes"):
        vm["main"](np.zeros((2, 4, 3), "float32"))


def _scan_model(in_dir: int, out_dir: int, out_axis: int, in_axis: int):
    """A Scan over a symbolic number of steps: state s' = s + x (carried), y = 2 s' (a scan
    output), each direction and axis as given."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "x"], ["s2"]),
         helper.make_node("Mul", ["s2", "two"], ["y"])], "body",
        [helper.make_tensor_value_info("s", f, [2]), helper.make_tensor_value_info("x", f, [2])],
        [helper.make_tensor_value_info("s2", f, [2]), helper.make_tensor_value_info("y", f, [2])],
        [helper.make_tensor("two", f, [], [2.0])])
    node = helper.make_node("Scan", ["s0", "xs"], ["sN", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[in_dir], scan_output_directions=[out_dir],
                            scan_output_axes=[out_axis], scan_input_axes=[in_axis])
    xs = ["n", 2] if in_axis == 0 else [2, "n"]
    graph = helper.make_graph([node], "scan", [helper.make_tensor_value_info("s0", f, [2]),
                                               helper.make_tensor_value_info("xs", f, xs)],
                              [helper.make_tensor_value_info("sN", f, [2]),
                               helper.make_tensor_value_info("ys", f, None)])
    # IR 8: the onnxruntime of the test extra reads IR <= 13 (it is the reference here: the
    # ONNX reference evaluator has no reversed scan outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)


@pytest.mark.parametrize("config", [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 1, 0), (1, 1, 1, 1)])
def test_scan_over_a_symbolic_length_is_a_run_time_loop(config, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model = _scan_model(*config)
    vm = compile_vm(model, tmp_path / "scan.so", "c", instruction=" goto ")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 4, 9):
        s0 = np.array([1, -1], np.float32)
        xs = np.random.default_rng(n).standard_normal((n, 2) if config[3] == 0 else (2, n))
        feed = {"s0": s0, "xs": xs.astype(np.float32)}
        for got, want in zip(vm["main"](*feed.values()), sess.run(None, feed)):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_a_loop_replays_at_the_trip_count_it_traced(tmp_path):
    """A Scan over a symbolic length is a loop of Ifs and Gotos: traced at one trip count, it
    replays at that count (each iteration's condition guarded, the carried state's copies C
    calls in the batch), and another count fails a guard and is interpreted, right."""
    ort = pytest.importorskip("onnxruntime")
    model = _scan_model(0, 0, 0, 0)
    vm = compile_vm(model, tmp_path / "scan.so", "c", instruction=" goto ")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    s0 = np.array([1, -1], np.float32)
    for n in (4, 4, 4, 6, 6):
        feed = {"s0": s0, "xs": np.random.default_rng(n).standard_normal((n, 2))
                .astype(np.float32)}
        for got, want in zip(vm["main"](*feed.values()), sess.run(None, feed)):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    stats = vm.replay_stats()
    assert stats["replays"] == 3 and stats["guard_failures"] == 1
    (trace,) = vm.module._traces.values()
    names = [getattr(s[1], "builtin_name", "") for s in trace.steps if s[0] == "py"]
    # only the copy of the parameter s0 into the state stays a Python step (its dim is the
    # input's, the state's a constant); the counter's and the state's are C calls
    assert names.count("vm.builtin.copy") == 1 and names.count("") >= 6  # (the guards)


def test_a_long_loop_is_interpreted_not_traced(tmp_path):
    """A loop of more iterations than a trace may hold Ifs (MAX_BRANCHES) is left to the
    interpreter: no trace as long as the loop, and the values are right."""
    from kiln.runtime.vm.trace import MAX_BRANCHES

    ort = pytest.importorskip("onnxruntime")
    model = _scan_model(0, 0, 0, 0)
    vm = compile_vm(model, tmp_path / "scan.so", "c", instruction=" goto ")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"s0": np.array([1, -1], np.float32),
            "xs": np.ones((MAX_BRANCHES + 1, 2), np.float32)}
    for _ in range(2):
        for got, want in zip(vm["main"](*feed.values()), sess.run(None, feed)):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert vm.replay_stats()["replays"] == 0 and not vm.module._traces


def test_cli_picks_the_vm_for_a_data_if_at_fixed_shapes(tmp_path, capsys):
    """``kiln compile`` with every input shape fixed but an If decided by data: the default
    executor is the VM (the same choice as ``kiln.build``'s), not a refused graph executor."""
    import onnx

    from kiln.cli.main import main
    from kiln.vm import VirtualMachine

    model = _if_model()
    path = tmp_path / "if.onnx"
    onnx.save(model, path)
    so = tmp_path / "if.so"
    assert main(["compile", str(path), "-o", str(so), "--target", "c", "-q",
                 "--input-shape", "x:3x4"]) == 0, capsys.readouterr().err
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    ref = ReferenceEvaluator(model)
    for sign in (1, -1):
        x = sign * np.abs(np.random.default_rng(1).standard_normal((3, 4))).astype("float32")
        for got, want in zip(vm["main"](x), ref.run(None, {"x": x})):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
