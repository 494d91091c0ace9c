"""Key/value caches in the VM (docs/decisions/019-kv-cache.md): a small decoder-like ONNX model
whose ``present = Concat(past, new, axis=0)`` becomes ``vm.builtin.kv_append``, run over
several steps against onnxruntime: the cache is appended in place when the returned
``present`` is fed back (same buffer address, no copy), a stale or foreign past takes the copy
path, and every output equals the concatenation."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper

import kiln
import kiln.runtime as rt
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine

ROW = (2, 3)


def _kv_model():
    """Per step: ``new_k = x * 2``, ``new_v = x + 1``, ``present_* = Concat(past_*, new_*)``,
    ``y = ReduceSum(Sigmoid(present_k) * present_v, axis 0)`` (kernels reading the caches)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Mul", ["x", "two"], ["nk"]),
             helper.make_node("Add", ["x", "one"], ["nv"]),
             helper.make_node("Concat", ["past_k", "nk"], ["present_k"], axis=0),
             helper.make_node("Concat", ["past_v", "nv"], ["present_v"], axis=0),
             helper.make_node("Sigmoid", ["present_k"], ["sk"]),
             helper.make_node("Mul", ["sk", "present_v"], ["prod"]),
             helper.make_node("ReduceSum", ["prod", "axes"], ["y"], keepdims=0)]
    inits = [helper.make_tensor("two", f, [], [2.0]), helper.make_tensor("one", f, [], [1.0]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [0])]
    graph = helper.make_graph(
        nodes, "kv",
        [helper.make_tensor_value_info("x", f, ["seq", *ROW]),
         helper.make_tensor_value_info("past_k", f, ["past", *ROW]),
         helper.make_tensor_value_info("past_v", f, ["past", *ROW])],
        [helper.make_tensor_value_info("y", f, list(ROW)),
         helper.make_tensor_value_info("present_k", f, ["past+seq", *ROW]),
         helper.make_tensor_value_info("present_v", f, ["past+seq", *ROW])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module", params=["c", "llvm"])
def kv_vm(request, tmp_path_factory):
    model = _kv_model()
    mod, params = from_onnx(model, dim_bounds={"past": (0, 4096)})
    exe = kiln.build(mod, target=request.param, params=params)
    text = exe.as_text()
    assert text.count("vm.builtin.kv_append") >= 2
    path = tmp_path_factory.mktemp("kv") / "kv.so"
    exe.export_library(str(path))
    return model, VirtualMachine(rt.load_module(str(path)), kiln.cpu())


def _feeds(x, pk, pv):
    return {"x": x, "past_k": np.asarray(pk), "past_v": np.asarray(pv)}


def test_appends_in_place_and_matches_onnxruntime(kv_vm):
    model, vm = kv_vm
    rng = np.random.default_rng(0)
    pk = pv = np.zeros((0, *ROW), np.float32)
    want_k = want_v = pk
    addresses = set()
    for step, seq in enumerate([5, 1, 1, 3, 1, 1]):
        x = rng.standard_normal((seq, *ROW)).astype(np.float32)
        want = run_onnxruntime(model, _feeds(x, want_k, want_v))
        y, pk, pv = vm["main"](x, pk, pv)
        for got, ref in zip((y, pk, pv), want):
            np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
        want_k, want_v = want[1], want[2]
        # (the address a present view caches, from its buffer, is its data's)
        assert (pk.data_ptr, pv.data_ptr) == (pk._arr.ctypes.data, pv._arr.ctypes.data)
        if step:
            addresses.add((pk.data_ptr, pv.data_ptr))
    assert len(addresses) == 1  # every step after the first appended into the same buffers
    assert vm.module.replay_stats()["replays"] >= 5  # kv_append runs inside replays
    assert not pk._arr.flags.writeable  # read-only views: older steps share these rows
    # replays reserve both appends ahead and write their rows in the kernels' batch: no
    # Python step for them between the kernels
    (trace,) = vm.module._traces.values()
    assert len(trace._hoisted) == 2
    assert not any(step[0] == "py" and step[1].builtin_name == "vm.builtin.kv_append"
                   for step in trace.steps)


def test_stale_and_foreign_pasts_take_the_copy_path(kv_vm):
    model, vm = kv_vm
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((2, *ROW)).astype(np.float32)
    _, k1, v1 = vm["main"](x0, np.zeros((0, *ROW), np.float32), np.zeros((0, *ROW), np.float32))
    keep_k = np.asarray(k1).copy()
    xa = rng.standard_normal((1, *ROW)).astype(np.float32)
    _, k2, v2 = vm["main"](xa, k1, v1)  # in place behind k1
    assert k2.data_ptr == k1.data_ptr
    xb = rng.standard_normal((1, *ROW)).astype(np.float32)
    y3, k3, v3 = vm["main"](xb, k1, v1)  # k1 is stale now (the buffer holds 3 rows)
    assert k3.data_ptr != k1.data_ptr
    want = run_onnxruntime(model, _feeds(xb, keep_k, np.asarray(v1)))
    for got, ref in zip((y3, k3, v3), want):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(k1), keep_k)  # earlier views never change
    np.testing.assert_array_equal(np.asarray(k2)[:2], keep_k)
    np.testing.assert_array_equal(np.asarray(k2)[2:], xa * 2)
    foreign = np.asarray(k2).copy()  # the same rows, another array: copied, still equal
    _, k4, _ = vm["main"](xb, foreign, v2)
    np.testing.assert_array_equal(np.asarray(k4), np.concatenate([foreign, xb * 2]))


def test_growing_past_the_capacity_copies_once(kv_vm):
    _, vm = kv_vm
    kv = vm.module.kv
    pk = pv = np.zeros((0, *ROW), np.float32)
    x = np.ones((1, *ROW), np.float32)
    copies = kv.copies
    rows = []
    for _ in range(70):  # the first buffer holds 64 rows
        _, pk, pv = vm["main"](x, pk, pv)
        rows.append(pk.shape[0])
    assert rows == list(range(1, 71))
    assert kv.copies - copies == 4  # k and v: created, then grown once
    np.testing.assert_array_equal(np.asarray(pk), np.full((70, *ROW), 2, np.float32))
