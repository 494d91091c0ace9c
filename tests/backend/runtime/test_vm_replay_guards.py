"""Replay of VM functions with data-dependent shapes (issue 31): the data-dependent builtin runs
on every replay and the late symbols it binds are guarded. Calls whose data keep the traced
shape are replayed; one that changes it fails the guard, is interpreted (and traced again),
and every result equals onnxruntime's."""

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


@pytest.mark.parametrize("target", ["llvm"])
def test_guarded_replay_with_llvm_kernels(tmp_path, target):
    model = _nonzero_model()
    vm = compile_vm(model, tmp_path / "nz.so", target, instruction="nonzero")
    rng = np.random.default_rng(3)
    for count in (4, 4, 7, 4):
        _run(vm, model, _with_nonzeros(rng, count))
    assert vm.replay_stats()["replays"] == 1
