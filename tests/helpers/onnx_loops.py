"""ONNX Loop models with scan outputs (per-iteration values stacked along a new axis 0) whose
iteration count is known only at run time; shared by the unit tests (graph interpreter) and
the backend tests (VM on c / llvm). Opset 16, IR version 8 (the onnxruntime of the test
extra reads IR <= 13).

The references disagree on shapes: onnxruntime stacks each element along a new axis 0
(scalars give ``[M]``, ``[n, 2]`` elements ``[M, n, 2]``), as Kiln does, but gives ``[0, 0]``
for an empty ``[0, n]``; ONNX's reference evaluator ``np.vstack``s them (scalars give
``[M, 1]``, ``[n, 2]`` elements ``[M * n, 2]``; the same values in the same order) and fails
when no iteration ran. :func:`check_references` compares with both where they are defined."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "loop", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)


def _out(name: str, shape: list, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _accumulate_body():
    """y' = y + x; scan outputs: sum(y') (a scalar a step) and y' (a vector a step)."""
    return helper.make_graph(
        [helper.make_node("Add", ["y_in", "x"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Identity", ["y_out"], ["v"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_tensor_value_info("y_in", F, ["n"])],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("y_out", F, ["n"]),
         helper.make_tensor_value_info("s", F, []),
         helper.make_tensor_value_info("v", F, ["n"])])


def trip_count_model():
    """(a) A data trip count ``M`` and a constant-true condition: inputs x [n], M (int64
    scalar); outputs y [n] (carried), ss [M] and vs [M, n] (stacked)."""
    return _model([helper.make_node("Loop", ["M", "t", "x"], ["y", "ss", "vs"],
                                    body=_accumulate_body())],
                  [helper.make_tensor_value_info("x", F, ["n"]),
                   helper.make_tensor_value_info("M", I64, [])],
                  [_out("y", ["n"]), _out("ss", ["M"]), _out("vs", ["M", "n"])],
                  [helper.make_tensor("t", B, [], [True])])


def threshold_model(trip_count: int | None = None):
    """(b) No trip count (or the constant ``trip_count``, e.g. a huge sentinel): y' = 2 y + 1
    while sum(y') < limit (a data condition; the first condition is input c0); scan outputs
    sum(y'), y' and the iteration number."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "two"], ["t"]),
         helper.make_node("Add", ["t", "one"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["c_out"]),
         helper.make_node("Identity", ["y_out"], ["v"]),
         helper.make_node("Identity", ["i"], ["it"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_tensor_value_info("y_in", F, ["n", 2])],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("y_out", F, ["n", 2]),
         helper.make_tensor_value_info("s", F, []),
         helper.make_tensor_value_info("v", F, ["n", 2]),
         helper.make_tensor_value_info("it", I64, [])],
        [helper.make_tensor("two", F, [], [2.0]), helper.make_tensor("one", F, [], [1.0])])
    trip = [] if trip_count is None else [helper.make_tensor("M", I64, [], [trip_count])]
    return _model([helper.make_node("Loop", ["M" if trip else "", "c0", "x"],
                                    ["y", "ss", "vs", "its"], body=body)],
                  [helper.make_tensor_value_info("x", F, ["n", 2]),
                   helper.make_tensor_value_info("c0", B, []),
                   helper.make_tensor_value_info("limit", F, [])],
                  [_out("y", ["n", 2]), _out("ss", ["k"]), _out("vs", ["k", "n", 2]),
                   _out("its", ["k"], I64)], trip)


def downstream_model():
    """(d) The stacked outputs of (a) feed kernels: total = ReduceSum(vs, axis 0) [n] and
    sq = ss * ss + 1 [M] (a kernel whose size is the late count)."""
    return _model([helper.make_node("Loop", ["M", "t", "x"], ["y", "ss", "vs"],
                                    body=_accumulate_body()),
                   helper.make_node("ReduceSum", ["vs", "axes0"], ["total"], keepdims=0),
                   helper.make_node("Mul", ["ss", "ss"], ["sq0"]),
                   helper.make_node("Add", ["sq0", "one"], ["sq"])],
                  [helper.make_tensor_value_info("x", F, ["n"]),
                   helper.make_tensor_value_info("M", I64, [])],
                  [_out("total", ["n"]), _out("sq", ["M"])],
                  [helper.make_tensor("t", B, [], [True]),
                   helper.make_tensor("axes0", I64, [1], [0]),
                   helper.make_tensor("one", F, [], [1.0])])


def constant_empty_model():
    """A constant trip count of 0: the scan outputs are empty constants [0, n] (static n)."""
    return _model([helper.make_node("Loop", ["zero", "t", "x"], ["y", "ss", "vs"],
                                    body=_accumulate_body())],
                  [helper.make_tensor_value_info("x", F, [3])],
                  [_out("y", [3]), _out("ss", [0]), _out("vs", [0, 3])],
                  [helper.make_tensor("t", B, [], [True]),
                   helper.make_tensor("zero", I64, [], [0])])


def ragged_model():
    """A scan element whose shape is data computed in the body (NonZero of the carried
    value): it may change between iterations, so Kiln refuses it."""
    body = helper.make_graph(
        [helper.make_node("Sub", ["y_in", "one"], ["y_out"]),
         helper.make_node("NonZero", ["y_out"], ["nz"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_tensor_value_info("y_in", F, ["n"])],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("y_out", F, ["n"]),
         helper.make_tensor_value_info("nz", I64, None)],
        [helper.make_tensor("one", F, [], [1.0])])
    return _model([helper.make_node("Loop", ["M", "t", "x"], ["y", "nzs"], body=body)],
                  [helper.make_tensor_value_info("x", F, ["n"]),
                   helper.make_tensor_value_info("M", I64, [])],
                  [_out("y", ["n"]), _out("nzs", ["M", 1, "k"], I64)],
                  [helper.make_tensor("t", B, [], [True])])


def trip_count_feeds(empty: bool = True):
    """Feeds of (a) and (d): several lengths and trip counts, with ``empty`` 0 as well (no
    iteration: empty scan outputs; onnxruntime's ``[0, 0]`` for them makes its ReduceSum of
    (d) ``[0]`` where the sum over no row is ``[n]`` zeros, so (d) leaves it out)."""
    rng = np.random.default_rng(3)
    for n, m in ((3, 4), (1, 1), (5, 0), (2, 9)):
        if m or empty:
            yield {"x": rng.standard_normal(n).astype(np.float32), "M": np.array(m, np.int64)}


def downstream_feeds():
    return trip_count_feeds(empty=False)


def threshold_feeds():
    """Feeds of (b): stops after some iterations, after one, or never starts (c0 false)."""
    for n, c0, limit in ((2, True, 100.0), (3, True, 1e4), (1, True, -1.0), (2, False, 100.0)):
        yield {"x": np.full((n, 2), 0.25, np.float32), "c0": np.array(c0),
               "limit": np.array(limit, np.float32)}


def check_references(model, feed: dict, got: list[np.ndarray]) -> None:
    """``got`` (Kiln's outputs for ``feed``) against onnxruntime (shapes, dtypes, values; an
    empty output: only that it is empty) and ONNX's reference evaluator (values, in
    onnxruntime's shape; skipped when it cannot run a loop without iterations)."""
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feed)
    try:
        ref = ReferenceEvaluator(model).run(None, feed)
    except ValueError:  # np.vstack of no iteration's elements
        ref = None
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        if w.size == 0:
            assert g.size == 0, (k, g.shape, w.shape)
            continue
        assert g.shape == w.shape, (k, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        if ref is not None:
            np.testing.assert_allclose(g, ref[k].reshape(g.shape), rtol=1e-5, atol=1e-6)
