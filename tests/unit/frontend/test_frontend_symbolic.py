"""The importer keeps symbolic dims: shape arithmetic on Shape's result folds to symbolic dims
that Reshape, Expand, Slice and ConstantOfShape take; the graph evaluates at any shape, checked
against ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from kiln.arith import SymVar
from kiln.errors import KilnError, ShapeError, UnsupportedOpError
from kiln.frontend import from_onnx
from kiln.relay.graph import Call, post_order
from kiln.relay.interpreter import evaluate


def _const(name: str, values) -> helper.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, TensorProto.INT64, [len(values)], values))


def _model():
    """x [batch, seq, 6]: reshape to [batch, seq, 2, 3] through Shape/Gather/Concat, slice the
    sequence to seq-1 with a symbolic end, add a ConstantOfShape of x's shape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("i0", [0]), _const("i1", [1]), _const("tail", [2, 3]), _const("one", [1]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Concat", ["b", "s", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Sub", ["s", "one"], ["end"]),
        helper.make_node("Slice", ["r", "i0", "end", "i1"], ["sl"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
        helper.make_node("Add", ["x", "ones"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 6])],
        [helper.make_tensor_value_info("sl", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_types_stay_symbolic():
    mod, _ = from_onnx(_model(), dim_bounds={"seq": (2, 64)})
    batch, seq = mod["main"].params[0].checked_type.shape[:2]
    assert (batch, seq) == (SymVar("batch"), SymVar("seq", 2, 64))
    sliced, added = (o.checked_type.shape for o in mod["main"].outputs)
    assert sliced == (batch, seq - 1, 2, 3)
    assert added == (batch, seq, 6)


@pytest.mark.parametrize("shape", [(1, 2, 6), (3, 5, 6)])
def test_symbolic_graph_evaluates_like_onnx_reference(shape):
    model = _model()
    mod, _ = from_onnx(model, dim_bounds={"seq": (2, 64)})
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got = evaluate(mod["main"], {"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)


def test_shape_given_fixes_the_dims():
    mod, _ = from_onnx(_model(), shape={"x": (2, 4, 6)})
    assert [o.checked_type.shape for o in mod["main"].outputs] == [(2, 3, 2, 3), (2, 4, 6)]


def _add_model(a_dims, b_dims):
    nodes = [helper.make_node("Add", ["a", "b"], ["c"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_dims),
                     helper.make_tensor_value_info("b", TensorProto.FLOAT, b_dims)],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_different_symbols_a_broadcast_needs_equal_are_assumed_one():
    """Add needs n == m (or one of them 1, which only a run-time broadcast could serve): the
    importer assumes n == m, so both inputs have n, which the VM checks input by input."""
    mod, _ = from_onnx(_add_model(["n", 4], ["m", 4]))
    a, b = (p.checked_type.shape for p in mod["main"].params)
    assert a == b == (SymVar("n"), 4)
    (made,) = mod["main"].attrs["assumptions"]
    assert made.relation() == "n == m" and "ONNX Add" in made.where


def test_a_named_symbol_is_kept_over_an_unnamed_one():
    mod, _ = from_onnx(_add_model([None, 4], ["batch", 4]))
    assert [p.checked_type.shape for p in mod["main"].params] == [(SymVar("batch"), 4)] * 2


def test_without_assume_different_symbols_do_not_broadcast():
    with pytest.raises(ShapeError, match=r"\(n, 4\) vs \(m, 4\).*--dim"):
        from_onnx(_add_model(["n", 4], ["m", 4]), assume=False)


def test_unified_symbols_merge_their_declared_bounds():
    mod, _ = from_onnx(_add_model(["n", 4], ["m", 4]), dim_bounds={"n": (2, 64), "m": (1, 32)})
    assert mod["main"].params[1].checked_type.shape == (SymVar("n", 2, 32), 4)


def _position_table_model():
    """MiniLM's position ids: rows ``[0, seq)`` of a ``[1, 512]`` table sliced by the input's
    length and expanded to the input's shape, added to the ids."""
    table = helper.make_tensor("table", TensorProto.INT64, [1, 512], list(range(512)))
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        _const("i1", [1]), _const("zero", [0]),
        helper.make_node("Gather", ["shape", "i1"], ["seq"], axis=0),
        helper.make_node("Slice", ["table", "zero", "seq", "i1"], ["rows"]),
        helper.make_node("Expand", ["rows", "shape"], ["positions"]),
        helper.make_node("Add", ["ids", "positions"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)], initializer=[table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_slice_of_a_table_bounds_the_length():
    model = _position_table_model()
    mod, params = from_onnx(model)
    assert mod["main"].params[0].checked_type.shape == (SymVar("batch"), SymVar("seq", 1, 512))
    (made,) = mod["main"].attrs["assumptions"]
    assert made.relation() == "seq <= 512" and "Expand" in made.where
    ids = np.arange(14, dtype="int64").reshape(2, 7)
    got = evaluate(mod["main"], {"ids": ids, **params})
    np.testing.assert_array_equal(got[0], ReferenceEvaluator(model).run(None, {"ids": ids})[0])


def test_a_declaration_that_decides_it_needs_no_assumption():
    mod, _ = from_onnx(_position_table_model(), dim_bounds={"seq": (1, 256)})
    assert mod["main"].attrs["assumptions"] == ()
    with pytest.raises(ShapeError, match="do not broadcast"):
        from_onnx(_position_table_model(), assume=False)


def test_bounds_of_one_value_fix_the_dim():
    mod, _ = from_onnx(_model(), dim_bounds={"seq": (4, 4)})
    batch, seq = mod["main"].params[0].checked_type.shape[:2]
    assert isinstance(batch, SymVar) and seq == 4


def _anonymous_dims_model():
    """``x[?, 3, '?', '?']`` as Paddle2ONNX writes it: an empty dim and two ``?`` params."""
    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, [None, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", f, [None, 3, "?", "?"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_anonymous_dims_are_each_a_fresh_symbol():
    mod, _ = from_onnx(_anonymous_dims_model())
    shape = mod["main"].params[0].checked_type.shape
    assert [str(d) for d in shape] == ["x_dim0", "3", "x_dim2", "x_dim3"]
    mod, _ = from_onnx(_anonymous_dims_model(), shape={"x": (1, 3, 48, 192)})
    assert mod["main"].params[0].checked_type.shape == (1, 3, 48, 192)



def _resize_to_sizes_model(op: str, factors: list[int], **attrs):
    """Resize(x, sizes=op(Shape(x), factors)) over x [N, 3, H, W] (op Mul or Div); nearest
    unless ``attrs`` say otherwise."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _const("factors", factors),
             helper.make_node(op, ["shape", "factors"], ["sizes"]),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"],
                              **{"mode": "nearest", **attrs})]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_resize_to_sizes_from_shape_is_symbolic():
    model = _resize_to_sizes_model("Mul", [1, 1, 2, 3])
    mod, _ = from_onnx(model)
    n, _, h, w = mod["main"].params[0].checked_type.shape
    assert mod["main"].outputs[0].checked_type.shape == (n, 3, 2 * h, 3 * w)
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype("float32")
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(evaluate(mod["main"], {"x": x})[0], want)


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 3, 8, 3), (1, 3, 11, 2)])
def test_resize_to_a_size_whose_ratio_varies_scales_at_run_time(shape):
    """H // 2 over H: onnxruntime's scale float32(H // 2) / float32(H) changes with H, so the
    op keeps no constant scale (None: computed from the sizes) and evaluates at every shape."""
    model = _resize_to_sizes_model("Div", [1, 1, 2, 2])
    mod, _ = from_onnx(model)
    (resize,) = [n for n in post_order(mod["main"].outputs) if isinstance(n, Call)]
    assert resize.attrs["scale"] == (None, None)
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(evaluate(mod["main"], {"x": x})[0], want)


def test_antialias_to_a_size_whose_ratio_varies_is_refused_clearly():
    """An antialiased filter's number of taps is 2 / scale: it needs a constant scale."""
    model = _resize_to_sizes_model("Div", [1, 1, 2, 2], mode="linear", antialias=1)
    with pytest.raises(UnsupportedOpError, match=r"Resize.*antialias.*H.*changes with the dims"):
        from_onnx(model)


def test_a_reshape_element_count_is_assumed():
    """``[b, h, 4]`` reshaped to ``[b, 4]`` (from the input's own Shape) holds for h == 1
    only: the importer fixes h, and the graph evaluates like ONNX's reference."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _const("i0", [0]), _const("four", [4]),
             helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
             helper.make_node("Concat", ["b", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    graph = helper.make_graph(
        nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "h", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = from_onnx(model)
    assert mod["main"].params[0].checked_type.shape == (SymVar("b"), 1, 4)
    (made,) = mod["main"].attrs["assumptions"]
    assert made.relation() == "h == 1" and "Reshape" in made.where
    x = np.arange(12, dtype="float32").reshape(3, 1, 4)
    np.testing.assert_array_equal(evaluate(mod["main"], {"x": x})[0],
                                  ReferenceEvaluator(model).run(None, {"x": x})[0])
    with pytest.raises(KilnError, match="cannot reshape"):
        from_onnx(model, assume=False)


def test_a_divisibility_is_assumed_of_the_inner_dim():
    """``[b, h]`` reshaped to ``[-1, 4]``: ``b * h`` must be a multiple of 4, and of the two
    single declarations the importer takes the inner dim's (a batch of 1 stays valid)."""
    shape = helper.make_tensor("target", TensorProto.INT64, [2], [-1, 4])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])], "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "h"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(model)
    (made,) = mod["main"].attrs["assumptions"]
    assert made.relation() == "h % 4 == 0" and "cannot infer -1" in made.where
    x = np.arange(8, dtype="float32").reshape(1, 8)
    np.testing.assert_array_equal(evaluate(mod["main"], {"x": x, **params})[0],
                                  ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_an_int32_range_over_a_symbolic_length_stays_int32():
    """Range(0, int32(Shape(x)[1]), 1) keeps the inputs' int32 (ONNX: the output has the
    inputs' type), as onnxruntime computes it."""
    i32 = TensorProto.INT32
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape"], ["n64"]),
             helper.make_node("Cast", ["n64"], ["n"], to=i32),
             helper.make_node("Range", ["zero", "n", "one"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "L"])],
        [helper.make_tensor_value_info("y", i32, None)],
        [helper.make_tensor("zero", i32, [], [0]), helper.make_tensor("one", i32, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = from_onnx(model)
    assert mod["main"].outputs[0].checked_type.dtype == "int32"


def test_shape_arithmetic_with_the_constant_first_stays_symbolic():
    """``Mod(-1, Shape(x)[1])`` (a constant first, the shape value second: the torch dynamo
    exporter's ``roll``) is the symbolic ``n - 1`` a Slice can end at; the elementwise
    reference cast the symbolic result to the constant's int64 ("a static value is needed")."""
    nodes = [helper.make_node("Shape", ["x"], ["n"], start=1, end=2),
             helper.make_node("Mod", ["minus_one", "n"], ["end"]),
             helper.make_node("Slice", ["x", "zero", "end", "one"], ["y"])]
    graph = helper.make_graph(
        nodes, "roll_slice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("minus_one", [-1]).attribute[0].t, _const("zero", [0]).attribute[0].t,
         _const("one", [1]).attribute[0].t])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = from_onnx(model)
    assert mod["main"].outputs[0].checked_type.shape == (2, SymVar("n") - 1)
    for n in (2, 7):
        x = np.arange(2 * n, dtype="float32").reshape(2, n)
        np.testing.assert_array_equal(evaluate(mod["main"], {"x": x})[0],
                                      ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("x_shape,times", [((1, 3), [None, 1]), ((2, 3), [None, 2])])
def test_tile_repeats_from_shape_arithmetic(x_shape, times):
    """Tile by ``[Shape(y)[0], k]`` (DeBERTa-v2 tiles its relative positions by the batch):
    the repeat count is a symbolic extent, not a refusal ("repeats must be static")."""
    nodes = [helper.make_node("Shape", ["y"], ["b"], start=0, end=1),
             helper.make_node("Concat", ["b", "k"], ["repeats"], axis=0),
             helper.make_node("Tile", ["x", "repeats"], ["z"])]
    graph = helper.make_graph(
        nodes, "tile_by_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [_const("k", times[1:]).attribute[0].t])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, _ = from_onnx(model)
    batch = SymVar("batch")
    assert mod["main"].outputs[0].checked_type.shape == (batch * x_shape[0], 3 * times[1])
    x = np.arange(np.prod(x_shape), dtype="float32").reshape(x_shape)
    for n in (1, 4):
        feeds = {"x": x, "y": np.zeros((n, 2), "float32")}
        np.testing.assert_array_equal(evaluate(mod["main"], feeds)[0],
                                      ReferenceEvaluator(model).run(None, feeds)[0])


def test_a_range_bounded_by_values_of_a_symbolic_range_runs_at_run_time():
    """``Range(0, ReduceMax(Range(0, n)))``: the bound is a value of a symbolic-length arange,
    known at run time only (Funnel's relative positions). It runs as a data-dependent range;
    it was an internal TypeError evaluating the inner arange at compile time."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["positions"]),
             helper.make_node("ReduceMax", ["positions"], ["last"], keepdims=0),
             helper.make_node("Range", ["zero", "last", "one"], ["y"])]
    graph = helper.make_graph(
        nodes, "range_of_range", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
         helper.make_tensor("one", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(model)
    for n in (1, 6):
        feeds = {"x": np.zeros((1, n), "float32")}
        np.testing.assert_array_equal(evaluate(mod["main"], {**feeds, **params})[0],
                                      ReferenceEvaluator(model).run(None, feeds)[0])


def test_range_bounds_read_from_the_positions_of_a_symbolic_range_are_shape_arithmetic():
    """Funnel Transformer's relative positions: ``pos = float(arange(n))``, then
    ``Range(concat([-1], pos[1:])[0] + len(pos) + 1, -pos[-1] - 1, -1)``. The bounds are
    elements of ``pos`` (``start + k * delta``), so the outer Range is a symbolic arange of
    ``2n`` values, not a data-dependent op whose count no relation can be proven about (the
    pooled attention's reshapes need it)."""
    big = np.iinfo(np.int64).max
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["ints"]),
             helper.make_node("Cast", ["ints"], ["pos"], to=TensorProto.FLOAT),
             helper.make_node("Slice", ["pos", "one_1d", "big"], ["tail"]),
             helper.make_node("Concat", ["minus_one", "tail"], ["shifted"], axis=0),
             helper.make_node("Gather", ["shifted", "zero"], ["first"]),
             helper.make_node("Gather", ["pos", "last_index"], ["last"]),
             helper.make_node("Shape", ["pos"], ["pos_shape"]),
             helper.make_node("Gather", ["pos_shape", "zero"], ["length_int"]),
             helper.make_node("Cast", ["length_int"], ["length"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["first", "length"], ["start_f0"]),
             helper.make_node("Add", ["start_f0", "one_f"], ["start_f"]),
             helper.make_node("Neg", ["last"], ["minus_last"]),
             helper.make_node("Sub", ["minus_last", "one_f"], ["limit_f"]),
             helper.make_node("Cast", ["start_f"], ["start"], to=TensorProto.INT64),
             helper.make_node("Cast", ["limit_f"], ["limit"], to=TensorProto.INT64),
             helper.make_node("Range", ["start", "limit", "minus_one_int"], ["y"])]
    graph = helper.make_graph(
        nodes, "positions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
         helper.make_tensor("one", TensorProto.INT64, [], [1]),
         helper.make_tensor("one_1d", TensorProto.INT64, [1], [1]),
         helper.make_tensor("big", TensorProto.INT64, [1], [big]),
         helper.make_tensor("last_index", TensorProto.INT64, [], [-1]),
         helper.make_tensor("minus_one", TensorProto.FLOAT, [1], [-1.0]),
         helper.make_tensor("one_f", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("minus_one_int", TensorProto.INT64, [], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(model)
    (y,) = mod["main"].outputs
    assert y.checked_type.shape == (2 * SymVar("n"),)
    assert not any(isinstance(n, Call) and n.op.name.startswith("dyn.") for n in post_order([y]))
    for n in (1, 6):
        feeds = {"x": np.zeros((1, n), "float32")}
        np.testing.assert_array_equal(evaluate(mod["main"], {**feeds, **params})[0],
                                      ReferenceEvaluator(model).run(None, feeds)[0])


def test_an_upsampled_map_concatenated_with_its_skip_is_assumed_even():
    """YOLO's FPN: a stride-2 conv, a ×2 Resize, Concat with the input. The two agree off the
    channel axis only when h and w are even; the importer assumes both (checked at run time),
    as it does for a broadcast. It was "shapes differ off axis 1" (NudeNet's 320n.onnx)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["down"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["down", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["up", "x"], ["y"], axis=1)]
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes, "fpn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 3, 3],
                            rng.standard_normal(36).astype("float32")),
         helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(model)
    relations = sorted(a.relation() for a in mod["main"].attrs["assumptions"])
    assert relations == ["h % 2 == 0", "w % 2 == 0"], relations
    for shape in [(1, 2, 4, 6), (1, 2, 8, 2)]:
        x = rng.standard_normal(shape).astype("float32")
        np.testing.assert_allclose(evaluate(mod["main"], {"x": x, **params})[0],
                                   ReferenceEvaluator(model).run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


def test_a_float_range_to_a_cast_shape_value_is_symbolic():
    """``Range(0.0, float(Shape(x)[1]), 1.0)`` (YOLOv8's anchor grid) is an arange over the
    symbolic n, not a data-dependent range whose late length nothing else can match."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape"], ["n"]),
             helper.make_node("Cast", ["n"], ["limit"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "limit", "one"], ["grid"]),
             helper.make_node("Add", ["grid", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "anchors", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
         helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(model)
    assert mod["main"].outputs[0].checked_type.shape == (2, SymVar("n"))
    assert not any(isinstance(c, Call) and c.op.name.startswith("dyn.")
                   for c in post_order(mod["main"].outputs))
    for n in (1, 5):
        x = np.ones((2, n), "float32")
        np.testing.assert_array_equal(evaluate(mod["main"], {"x": x, **params})[0],
                                      ReferenceEvaluator(model).run(None, {"x": x})[0])
