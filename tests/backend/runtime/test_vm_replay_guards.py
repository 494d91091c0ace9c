"""Replay of VM functions with data-dependent shapes (issue 31): the data-dependent builtin runs
on every replay and the late symbols it binds are guarded. Calls whose data keep the traced
shape are replayed; one that changes it fails the guard, is interpreted (and traced again),
and every result equals onnxruntime's. Shape arithmetic that only looks like data (a Range to
a Shape's dim, a Reshape to a Concat of it) stays on the shape heap: no guard, every call after
the first replayed."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper
from onnx_helpers import compile_vm

from kiln.runtime.vm.virtual_machine import MAX_GUARD_FAILURES

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, output, inits=()):
    graph = helper.make_graph(nodes, "guards", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(output, F, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _nonzero_model():
    """y = 2 * x[nonzero(x)] + 1: kernels over the late length of NonZero's result."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "zero"], ["idx"]),
             helper.make_node("Gather", ["x", "idx"], ["g"]),
             helper.make_node("Mul", ["g", "two"], ["m"]),
             helper.make_node("Add", ["m", "one"], ["y"])]
    inits = [helper.make_tensor("zero", I64, [1], [0]), helper.make_tensor("two", F, [], [2.0]),
             helper.make_tensor("one", F, [], [1.0])]
    return _model(nodes, [("x", F, [16])], "y", inits)


def _reshape_model():
    """y = reshape(x, shape) * x-sum: a Reshape to a shape that is data (an input)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Mul", ["r", "s"], ["y"])]
    return _model(nodes, [("x", F, [12]), ("shape", I64, [2])], "y")


def _with_nonzeros(rng, count: int) -> dict[str, np.ndarray]:
    x = np.zeros(16, np.float32)
    x[rng.choice(16, count, replace=False)] = rng.standard_normal(count) + 3
    return {"x": x}


def _run(vm, model, inputs):
    names = [i.name for i in model.graph.input]
    got = vm["main"](*(inputs[n] for n in names)).numpy()
    want = run_onnxruntime(model, inputs)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # (sums: another order)


def test_nonzero_replays_while_its_count_repeats_and_guards_a_change(tmp_path):
    model = _nonzero_model()
    vm = compile_vm(model, tmp_path / "nz.so", "c", instruction="nonzero")
    rng = np.random.default_rng(0)
    for count in (3, 3, 3):  # other positions and values, the same count
        _run(vm, model, _with_nonzeros(rng, count))
    stats = vm.replay_stats()
    assert (stats["recordings"], stats["replays"], stats["guard_failures"]) == (1, 2, 0), stats
    _run(vm, model, _with_nonzeros(rng, 5))  # guard fails: interpreted, traced at 5
    _run(vm, model, _with_nonzeros(rng, 5))
    _run(vm, model, {"x": np.zeros(16, np.float32)})  # empty: guard fails again
    stats = vm.replay_stats()
    assert stats["guard_failures"] == 2 and stats["replays"] == 3, stats
    assert stats["interpreted"] == stats["recordings"] == 3, stats


def test_reshape_to_a_data_shape_replays_per_shape(tmp_path):
    model = _reshape_model()
    vm = compile_vm(model, tmp_path / "rs.so", "c", instruction="reshape_to")
    rng = np.random.default_rng(1)
    shapes = [(3, 4), (3, 4), (3, 4), (4, 3), (4, 3), (3, 4)]
    for shape in shapes:
        x = rng.standard_normal(12).astype(np.float32)
        _run(vm, model, {"x": x, "shape": np.array(shape, np.int64)})
    stats = vm.replay_stats()
    assert stats["replays"] == 3 and stats["guard_failures"] == 2, stats


def test_a_shape_that_changes_on_every_call_stops_being_traced(tmp_path):
    model = _nonzero_model()
    vm = compile_vm(model, tmp_path / "nz.so", "c", instruction="nonzero")
    rng = np.random.default_rng(2)
    calls = MAX_GUARD_FAILURES + 4
    for k in range(calls):
        _run(vm, model, _with_nonzeros(rng, 1 + k % 15))
    stats = vm.replay_stats()
    assert stats["guard_failures"] == MAX_GUARD_FAILURES and stats["replays"] == 0, stats
    assert stats["recordings"] == MAX_GUARD_FAILURES and stats["kept"] == 0, stats
    assert stats["interpreted"] == calls


def test_guard_failures_count_in_a_row(tmp_path):
    """Changes of the shape between runs of replays do not add up to the retracing bound."""
    model = _nonzero_model()
    vm = compile_vm(model, tmp_path / "nz.so", "c", instruction="nonzero")
    rng = np.random.default_rng(5)
    for k in range(MAX_GUARD_FAILURES + 2):
        for _ in range(2):  # a change, then a replay at the new count
            _run(vm, model, _with_nonzeros(rng, 1 + k % 15))
    stats = vm.replay_stats()
    assert stats["guard_failures"] == MAX_GUARD_FAILURES + 1 and stats["kept"] == 1, stats
    assert stats["replays"] == MAX_GUARD_FAILURES + 2, stats


@pytest.mark.parametrize("target", ["llvm"])
def test_guarded_replay_with_llvm_kernels(tmp_path, target):
    model = _nonzero_model()
    vm = compile_vm(model, tmp_path / "nz.so", target, instruction="nonzero")
    rng = np.random.default_rng(3)
    for count in (4, 4, 7, 4):
        _run(vm, model, _with_nonzeros(rng, count))
    assert vm.replay_stats()["replays"] == 1


def test_range_and_reshape_over_shape_values_stay_on_the_heap(tmp_path):
    """``Range(0, Shape(x)[0])`` and ``Reshape(x, Concat(Shape(x)[0:1], [2, 2]))``: symbolic
    (kernels over the input's symbol), not data-dependent builtins."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"]),
             helper.make_node("Range", ["i0", "n", "i1"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
             helper.make_node("Concat", ["n1", "two2"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["xr"]),
             helper.make_node("Unsqueeze", ["rf", "ax12"], ["rfu"]),
             helper.make_node("Mul", ["xr", "rfu"], ["y"])]
    inits = [helper.make_tensor("i0", I64, [], [0]), helper.make_tensor("i1", I64, [], [1]),
             helper.make_tensor("ax0", I64, [1], [0]), helper.make_tensor("two2", I64, [2], [2, 2]),
             helper.make_tensor("ax12", I64, [2], [1, 2])]
    model = _model(nodes, [("x", F, ["n", 4])], "y", inits)
    vm = compile_vm(model, tmp_path / "sv.so", "c", instruction="shape_compute")
    text = vm.module.exe.as_text()
    assert not any(b in text for b in ("bind_shape", "tensor_to_heap", "vm.builtin.range",
                                       "reshape_to")), text
    rng = np.random.default_rng(4)
    for n in (3, 5, 1, 3):
        _run(vm, model, {"x": rng.standard_normal((n, 4)).astype(np.float32)})
    stats = vm.replay_stats()
    assert stats["replays"] == 3 and stats["interpreted"] == 1, stats
