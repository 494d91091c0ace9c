"""Ops whose output shape depends on data, through the VM (decision 016): single-op ONNX models
(NonZero, Unique, NonMaxSuppression, and Compress/TopK/Range/Reshape/Expand/ConstantOfShape/
Tile/Slice with data arguments) and chains where kernels run over the late symbols, against
ONNX's reference evaluator (and onnxruntime), including empty results; a late symbol outside
its bounds; the graph executor's refusal."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import run_onnxruntime
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import compile_vm

import kiln
from kiln.errors import CompileError, ShapeError
from kiln.frontend import from_onnx
from kiln.relay.graph import Call, Constant, Function, TensorType, Var
from kiln.vm import VirtualMachine

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, opset=17, inits=()):
    """``outputs``: (name, element type) pairs, or names of float outputs."""
    outputs = [(o, F) if isinstance(o, str) else o for o in outputs]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(o, t, None) for o, t in outputs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _check(model, cases, tmp_path, target="c", ort=True, ref=True):
    """Run every input dict of ``cases`` through one VM; each output equals the reference
    evaluator's and onnxruntime's in shape, dtype and value."""
    vm = compile_vm(model, tmp_path / "m.so", target, instruction="bind_shape")
    evaluator = ReferenceEvaluator(model)
    names = [i.name for i in model.graph.input]
    for inputs in cases:
        got = vm["main"](*(inputs[n] for n in names))
        got = [g.numpy() for g in (got if isinstance(got, tuple) else (got,))]
        wants = [evaluator.run(None, inputs)] if ref else []
        if ort:
            wants.append(run_onnxruntime(model, inputs))
        for want in wants:
            assert len(got) == len(want)
            for g, w in zip(got, want):
                w = np.asarray(w)
                assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype)
                np.testing.assert_allclose(g, w, rtol=1e-6)


RNG = np.random.default_rng(0)


def _sparse(shape, p=0.5, dtype="float32"):
    return (RNG.standard_normal(shape) * (RNG.random(shape) < p)).astype(dtype)


def test_nonzero_including_empty_and_full(tmp_path):
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [("x", F, [3, 5])],
                   [("y", I64)])
    cases = [{"x": _sparse((3, 5))}, {"x": np.zeros((3, 5), "float32")},
             {"x": np.ones((3, 5), "float32")}, {"x": _sparse((3, 5), 0.1)}]
    _check(model, cases, tmp_path)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("sort", [1, 0])
def test_unique_all_outputs(tmp_path, axis, sort):
    attrs = {"sorted": sort} | ({} if axis is None else {"axis": axis})
    node = helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"], **attrs)
    model = _model([node], [("x", F, [4, 3])],
                   ["y", ("indices", I64), ("inverse", I64), ("counts", I64)])
    cases = [{"x": RNG.integers(0, 3, (4, 3)).astype("float32")},
             {"x": np.full((4, 3), 2.0, "float32")},
             {"x": np.array([[1, 2, 3], [3, 2, 1], [1, 2, 3], [0, 0, 0]], "float32")}]
    # (the reference evaluator fails on sorted=0 for a 2-D input: onnxruntime alone there)
    _check(model, cases, tmp_path, ref=sort == 1)


def _nms_model(center=0, optional=3):
    names = ["boxes", "scores", "max_out", "iou", "score"][:2 + optional]
    inputs = [("boxes", F, [2, 6, 4]), ("scores", F, [2, 2, 6]), ("max_out", I64, [1]),
              ("iou", F, [1]), ("score", F, [1])][:2 + optional]
    node = helper.make_node("NonMaxSuppression", names, ["selected"], center_point_box=center)
    return _model([node], inputs, [("selected", I64)])


def _nms_inputs(score_threshold, center=False, max_out=3):
    xy = RNG.random((2, 6, 2)).astype("float32") * 4
    wh = RNG.random((2, 6, 2)).astype("float32") * 2 + 0.5
    boxes = np.concatenate([xy, wh] if center else [xy, xy + wh], axis=2)
    return {"boxes": boxes.astype("float32"), "scores": RNG.random((2, 2, 6)).astype("float32"),
            "max_out": np.array([max_out], np.int64), "iou": np.array([0.3], "float32"),
            "score": np.array([score_threshold], "float32")}


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression_including_no_box_above_threshold(tmp_path, center):
    cases = [_nms_inputs(0.2, center), _nms_inputs(2.0, center), _nms_inputs(0.0, center, 6),
             _nms_inputs(0.5, center, 0)]
    _check(_nms_model(center), cases, tmp_path)


def test_non_max_suppression_without_optional_inputs_selects_nothing(tmp_path):
    case = _nms_inputs(0.2)
    # (the reference evaluator fails without max_output_boxes_per_class: onnxruntime alone)
    _check(_nms_model(optional=0), [{"boxes": case["boxes"], "scores": case["scores"]}],
           tmp_path, ref=False)


@pytest.mark.parametrize("axis", [None, 1])
def test_compress_with_a_data_condition(tmp_path, axis):
    attrs = {} if axis is None else {"axis": axis}
    n = 12 if axis is None else 4
    model = _model([helper.make_node("Compress", ["x", "c"], ["y"], **attrs)],
                   [("x", F, [3, 4]), ("c", B, [n])], ["y"])
    x = RNG.standard_normal((3, 4)).astype("float32")
    cases = [{"x": x, "c": RNG.random(n) < 0.5}, {"x": x, "c": np.zeros(n, bool)},
             {"x": x, "c": np.ones(n, bool)}]
    _check(model, cases, tmp_path)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_with_a_data_k(tmp_path, largest):
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=largest)
    model = _model([node], [("x", F, [3, 5]), ("k", I64, [1])], ["values", ("indices", I64)])
    x = RNG.integers(0, 4, (3, 5)).astype("float32")  # ties: the lower index first
    cases = [{"x": x, "k": np.array([k], np.int64)} for k in (2, 0, 5)]
    _check(model, cases, tmp_path)


@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_range_with_data_bounds(tmp_path, dtype):
    code = I64 if dtype == "int64" else F
    model = _model([helper.make_node("Range", ["s", "l", "d"], ["y"])],
                   [("s", code, []), ("l", code, []), ("d", code, [])], [("y", code)])

    def case(s, lim, d):
        return {k: np.array(v, dtype) for k, v in zip("sld", (s, lim, d))}

    _check(model, [case(0, 10, 3), case(5, 1, -1), case(4, 2, 1), case(1, 2, 0.25)
                   if dtype == "float32" else case(-3, 3, 2)], tmp_path)


def test_reshape_expand_tile_slice_constant_of_shape_from_data(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Expand", ["e", "eshape"], ["ex"]),
             helper.make_node("Tile", ["x", "reps"], ["t"]),
             helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("ConstantOfShape", ["cshape"], ["c"],
                              value=helper.make_tensor("v", F, [1], [1.5]))]
    inputs = [("x", F, [2, 6]), ("shape", I64, [3]), ("e", F, [3, 1]), ("eshape", I64, [3]),
              ("reps", I64, [2]), ("starts", I64, [1]), ("ends", I64, [1]), ("axes", I64, [1]),
              ("steps", I64, [1]), ("cshape", I64, [2])]
    model = _model(nodes, inputs, ["r", "ex", "t", "s", "c"])
    x = RNG.standard_normal((2, 6)).astype("float32")
    e = RNG.standard_normal((3, 1)).astype("float32")

    def case(shape, eshape, reps, sl, cshape):
        v = {"x": x, "e": e, "shape": shape, "eshape": eshape, "reps": reps, "cshape": cshape}
        v |= dict(zip(("starts", "ends", "axes", "steps"), ([s] for s in sl)))
        return {k: np.asarray(a, np.int64) if k not in "xe" else a for k, a in v.items()}

    _check(model, [case([2, 0, -1], [2, 3, 4], [2, 1], (1, 5, 1, 2), [2, 3]),
                   case([-1, 4, 1], [1, 1, 1], [1, 3], (-1, -7, 1, -1), [0, 4]),
                   case([12, 1, 1], [3, 3, 1], [0, 2], (0, 1, 0, 1), [1, 1])], tmp_path)


def test_kernels_over_late_symbols(tmp_path, target):
    """NonZero → Transpose → Add and Unique → Mul → ReduceSum: kernels take the late symbols
    from their tensors, their outputs get storage of their own; an Add feeding NonZero puts
    the op's input in the arena."""
    nodes = [helper.make_node("Add", ["x", "x"], ["x2"]),
             helper.make_node("NonZero", ["x2"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("Add", ["t", "bias"], ["y"]),
             helper.make_node("Unique", ["v"], ["u"]),
             helper.make_node("Mul", ["u", "u"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["total"], keepdims=0)]
    model = _model(nodes, [("x", F, [4, 3]), ("bias", I64, [2]), ("v", F, [8])],
                   [("y", I64), "sq", "total"])
    bias = np.array([10, 100], np.int64)
    cases = [{"x": _sparse((4, 3)), "bias": bias, "v": RNG.integers(0, 4, 8).astype("float32")},
             {"x": np.zeros((4, 3), "float32"), "bias": bias, "v": np.ones(8, "float32")},
             {"x": np.ones((4, 3), "float32"), "bias": bias,
              "v": np.arange(8, dtype="float32")}]
    _check(model, cases, tmp_path, target)


def test_symbolic_input_and_late_symbol_together(tmp_path):
    """NonZero of an ``[n, 4]`` input: its count is bounded by nothing static; the result
    feeds a kernel; repeated calls at one input shape are not replayed blindly."""
    model = _model([helper.make_node("NonZero", ["x"], ["nz"]),
                    helper.make_node("Mul", ["nz", "two"], ["y"])],
                   [("x", F, ["n", 4])], [("y", I64)],
                   inits=[helper.make_tensor("two", I64, [], [2])])
    cases = [{"x": _sparse((n, 4))} for n in (1, 3, 3, 3, 7)]
    _check(model, cases, tmp_path)


def test_late_symbol_outside_its_bound_is_a_shape_error(tmp_path):
    """A dyn.range whose count is declared at most 3 gets 5 values: ShapeError naming the
    symbol and the node."""
    scalars = [Var(n, TensorType((), "int64")) for n in ("s", "l", "d")]
    call = Call("dyn.range", scalars, {"shape": (("range_count_r", 0, 3),)}, span="r")
    out = Call("add", [call, Constant(np.array(1, np.int64))])
    exe = kiln.build(Function(scalars, [out]), target="c")
    vm = VirtualMachine(exe, kiln.cpu())
    ok = vm["main"](*(np.array(v, np.int64) for v in (0, 3, 1))).numpy()
    np.testing.assert_array_equal(ok, [1, 2, 3])
    with pytest.raises(ShapeError, match=r"range_count_r = 5 is outside its bounds \[0, 3\]"):
        vm["main"](*(np.array(v, np.int64) for v in (0, 5, 1)))
    with pytest.raises(ShapeError, match=r"node 'r'"):
        vm["main"](*(np.array(v, np.int64) for v in (0, 5, 1)))


def test_graph_executor_refuses_data_dependent_ops():
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [("x", F, [3, 5])], ["y"])
    mod, params = from_onnx(model)
    with pytest.raises(CompileError, match="dyn.nonzero"):
        kiln.build(mod, target="c", params=params, executor="graph")


def test_constant_input_folds_at_import():
    model = _model([helper.make_node("NonZero", ["w"], ["y"])], [], ["y"],
                   inits=[helper.make_tensor("w", F, [2, 2], [1, 0, 0, 3])])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target="c", params=params)
    assert not isinstance(exe, kiln.runtime.VMExecutable)  # static again: the graph executor


def test_data_dependent_ops_inside_if_branches(tmp_path):
    """NonZero in one branch, Unique in the other: each binds its late symbols, computes the
    dims over them and allocates their storage inside its branch."""
    then = helper.make_graph([helper.make_node("NonZero", ["x"], ["nz"]),
                              helper.make_node("Mul", ["nz", "two"], ["m"]),
                              helper.make_node("ReduceSum", ["m"], ["o"], keepdims=0)],
                             "then", [], [helper.make_tensor_value_info("o", I64, [])])
    other = helper.make_graph([helper.make_node("Unique", ["x"], ["u"]),
                               helper.make_node("Cast", ["u"], ["ui"], to=I64),
                               helper.make_node("ReduceSum", ["ui"], ["o2"], keepdims=0)],
                              "else", [], [helper.make_tensor_value_info("o2", I64, [])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = _model(nodes, [("x", F, [3, 4])], [("y", I64)],
                   inits=[helper.make_tensor("zero", F, [], [0.0]),
                          helper.make_tensor("two", I64, [], [2])])
    cases = [{"x": (RNG.integers(-2, 3, (3, 4)) * (RNG.random((3, 4)) < 0.5)).astype("float32")}
             for _ in range(6)] + [{"x": np.zeros((3, 4), "float32")}]
    _check(model, cases, tmp_path)


def test_integer_div_of_a_symbolic_shape_folds_to_floor_division(tmp_path):
    """``Shape(x) / [1, 2]`` (integer Div) feeding ConstantOfShape, over ``x[1, n]``: folded
    at compile time to ``(1, n // 2)`` (it was an internal TypeError), equal to onnxruntime's at
    odd and even n."""
    model = _model([helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Div", ["s", "two"], ["d"]),
                    helper.make_node("ConstantOfShape", ["d"], ["y"])],
                   [("x", F, [1, "n"])], ["y"],
                   inits=[helper.make_tensor("two", TensorProto.INT64, [2], [1, 2])])
    vm = compile_vm(model, tmp_path / "div.so", "c")
    for n in (6, 7, 1):
        x = np.ones((1, n), np.float32)
        got = vm["main"](x).numpy()
        (want,) = run_onnxruntime(model, {"x": x})
        assert got.shape == want.shape == (1, n // 2) and (got == want).all()
