"""ONNX frontend: what it rejects, and how it names the culprit; graph inputs and params."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_frontend_ops import make_model, rand

from kiln.arith import SymVar
from kiln.errors import KilnError, ShapeError, UnsupportedOpError
from kiln.frontend import from_onnx, list_converters, load_onnx


def _named(op: str, inputs: list[str], outputs: list[str], name: str, **attrs):
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


def test_unsupported_op_names_op_node_and_opset():
    model = make_model([_named("RoiAlign", ["x", "r", "i"], ["y"], "my_roi")],
                       {"x": rand(1, 1, 4, 4), "r": rand(1, 4),
                        "i": np.zeros(1, np.int64)}, ["y"], 13)
    with pytest.raises(UnsupportedOpError, match=r"RoiAlign.*my_roi.*opset 13"):
        from_onnx(model)


def test_op_newer_than_model_opset():
    # HardSwish exists from opset 14; an opset-13 model has no converter for it.
    model = make_model([_named("HardSwish", ["x"], ["y"], "hs")], {"x": rand(2)}, ["y"], 13)
    with pytest.raises(UnsupportedOpError, match=r"HardSwish.*hs.*opset 13"):
        from_onnx(model)


def test_unsupported_attribute():
    node = _named("DepthToSpace", ["x"], ["y"], "d2s", blocksize=2, mode="XYZ")
    model = make_model([node], {"x": rand(1, 4, 2, 2)}, ["y"], 13)
    with pytest.raises(UnsupportedOpError, match=r"DepthToSpace.*d2s.*opset 13.*mode"):
        from_onnx(model)


def test_unsupported_second_output_when_used():
    # BatchNormalization-9 at inference computes Y only; its running mean is not produced.
    nodes = [_named("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "mean"], "bn"),
             helper.make_node("Cast", ["mean"], ["z"], to=TensorProto.FLOAT)]
    stats = {k: rand(2, seed=i) for i, k in enumerate("sbmv")}
    stats["v"] = np.abs(stats["v"]) + 0.1
    model = make_model(nodes, {"x": rand(1, 2, 3, 3)}, ["z"], 9, inits=stats)
    with pytest.raises(UnsupportedOpError, match=r"BatchNormalization.*bn.*output 1"):
        from_onnx(model)


def test_non_default_domain():
    node = helper.make_node("FusedConv", ["x"], ["y"], name="fc", domain="com.microsoft")
    model = make_model([node], {"x": rand(1, 1, 2, 2)}, ["y"], 13)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedOpError, match=r"FusedConv.*fc.*com.microsoft"):
        from_onnx(model)


@pytest.mark.parametrize("opset", [0, 29])
def test_unsupported_opset(opset):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(2)}, ["y"], 13)
    model.opset_import[0].version = opset  # 29: newer than the installed onnx knows
    with pytest.raises(UnsupportedOpError, match=f"opset {opset}"):
        from_onnx(model)


def test_non_constant_split_input():
    node = _named("Split", ["x", "s"], ["y", "z"], "sp")
    model = make_model([node], {"x": rand(5, 3), "s": np.array([3, 2], np.int64)}, ["y", "z"],
                       13)
    with pytest.raises(UnsupportedOpError, match=r"Split.*sp.*compile-time constant.*'s'"):
        from_onnx(model)


def test_reshape_to_a_data_shape_is_data_dependent():
    """A shape computed from data is no longer an error: the output dims are late symbols
    (decision 016), bounded by the input's size."""
    node = _named("Reshape", ["x", "s"], ["y"], "rs")
    model = make_model([node], {"x": rand(2, 3), "s": np.array([3, 2], np.int64)}, ["y"], 13)
    mod, _ = from_onnx(model)
    (out,) = mod["main"].outputs
    assert out.op.name == "dyn.reshape"
    assert [(d.name, d.lo, d.hi) for d in out.checked_type.shape] == [
        ("reshape_dim0_y", 0, 6), ("reshape_dim1_y", 0, 6)]


def test_shape_error_names_node():
    node = _named("Add", ["a", "b"], ["y"], "bad_add")
    model = make_model([node], {"a": rand(2, 3), "b": rand(4)}, ["y"], 13)
    with pytest.raises(ShapeError, match=r"Add.*bad_add.*broadcast"):
        from_onnx(model)


def _symbolic_model(dims) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    opsets = [helper.make_opsetid("", 13)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets))


def test_wrong_fixed_dim_shape():
    with pytest.raises(ShapeError, match=r"'x'.*\(1, 4\)"):
        from_onnx(_symbolic_model([1, 3]), shape={"x": (1, 4)})
    with pytest.raises(ShapeError, match="rank"):
        from_onnx(_symbolic_model([1, 3]), shape={"x": (1, 3, 1)})


def test_shape_for_unknown_input():
    with pytest.raises(ShapeError, match="unknown input"):
        from_onnx(_symbolic_model([1, 3]), shape={"nope": (1,)})


def test_symbolic_dims_from_shape():
    mod, _ = from_onnx(_symbolic_model(["batch", 3]), shape={"x": (5, 3)})
    assert mod["main"].params[0].checked_type.shape == (5, 3)


def test_symbolic_dims_stay_symbolic():
    mod, _ = from_onnx(_symbolic_model(["batch", 3]), dim_bounds={"batch": (1, 64)})
    (batch, three) = mod["main"].params[0].checked_type.shape
    assert isinstance(batch, SymVar) and (batch.name, batch.lo, batch.hi) == ("batch", 1, 64)
    assert three == 3


def test_bounds_for_an_unknown_symbol_are_an_error():
    with pytest.raises(ShapeError, match="unknown symbolic dim"):
        from_onnx(_symbolic_model(["batch", 3]), dim_bounds={"seq": (1, 8)})


def test_params_order_and_output_names():
    nodes = [helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "v"], ["y"]),
             helper.make_node("Relu", ["y"], ["z"])]
    inits = {"w": rand(3, seed=1), "v": rand(3, seed=2), "unused": rand(2)}
    model = make_model(nodes, {"x": rand(2, 3)}, ["z", "y"], 13, inits)
    # An initializer that is also listed as a graph input is a weight, not a model input.
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]))
    mod, params = from_onnx(model)
    func = mod["main"]
    assert [p.name for p in func.params] == ["x", "w", "v"]
    assert func.output_names == ["z", "y"]
    assert sorted(params) == ["v", "w"]


def test_missing_file(tmp_path):
    path = tmp_path / "absent.onnx"
    with pytest.raises(KilnError, match="absent.onnx"):
        load_onnx(path)


@pytest.mark.parametrize("content", [b"\xff\xfe this is not a protobuf \x00\x01" * 10, b""])
def test_garbage_file(tmp_path, content):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(content)
    with pytest.raises(KilnError, match="garbage.onnx"):
        load_onnx(path)


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.9])
def test_truncated_file(tmp_path, fraction):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"])]
    model = make_model(nodes, {"x": rand(1, 3, 8, 8)}, ["y"], 13,
                       {"w": rand(4, 3, 3, 3), "b": rand(4)})
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(KilnError, match="cut.onnx"):
        load_onnx(path)


def test_load_valid_file(tmp_path):
    model = _symbolic_model([2, 3])
    path = tmp_path / "ok.onnx"
    onnx.save(model, path)
    mod, params = from_onnx(load_onnx(path))
    assert mod["main"].output_names == ["y"] and params == {}


def test_converter_registry_lists_versions():
    table = list_converters()
    assert table["Clip"] == [1, 11]
    assert table["Softmax"] == [1, 13]
    assert table["Unsqueeze"] == [1, 13]
    assert table["ReduceMean"] == [1, 18]


def test_one_error_lists_every_unsupported_op_before_any_work():
    """Two unknown ops (one used twice, one inside an If branch) and a foreign-domain op:
    one UnsupportedOpError names all three with their nodes, not just the first."""
    f = TensorProto.FLOAT
    branch = helper.make_graph([helper.make_node("Bar", ["x"], ["o"], name="in_branch")], "b",
                               [], [helper.make_tensor_value_info("o", f, [2])])
    nodes = [helper.make_node("Foo", ["x"], ["a"], name="f1"),
             helper.make_node("Foo", ["a"], ["b"], name="f2"),
             helper.make_node("NoSuchContribOp", ["b"], ["c"], domain="com.microsoft",
                              name="lstm"),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL,
                                                                         [])],
                              [helper.make_tensor_value_info("y", f, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOpError) as exc:
        from_onnx(model)
    message = str(exc.value)
    assert message.startswith("the ONNX model uses 3 ops Kiln cannot convert")
    for part in ("Foo (nodes 'f1', 'f2', opset 17)", "NoSuchContribOp (node 'lstm', "
                 "domain 'com.microsoft')", "Bar (node 'in_branch', opset 17)"):
        assert part in message


def _conv3d_model(x_dims, w_shape, **attrs) -> onnx.ModelProto:
    node = _named("Conv", ["x", "w"], ["y"], "conv3", **attrs)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                              [helper.make_empty_tensor_value_info("y")],
                              [onnx.numpy_helper.from_array(rand(*w_shape), "w")])
    opsets = [helper.make_opsetid("", 13)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets))


def test_conv3d_symbolic_depth_is_unsupported():
    model = _conv3d_model([1, 2, "depth", 4, 4], (3, 2, 3, 3, 3), pads=[1] * 6)
    with pytest.raises(UnsupportedOpError, match=r"Conv.*conv3.*symbolic depth"):
        from_onnx(model)


def test_conv3d_kernel_deeper_than_the_input():
    model = _conv3d_model([1, 2, 2, 4, 4], (3, 2, 3, 3, 3), pads=[0, 1, 1, 0, 1, 1])
    with pytest.raises(ShapeError, match=r"conv3.*depth of 2"):
        from_onnx(model)


def test_conv4d_is_unsupported():
    model = _conv3d_model([1, 2, 3, 3, 3, 3], (3, 2, 1, 1, 1, 1))
    with pytest.raises(UnsupportedOpError, match=r"Conv.*conv3.*3-D spatial inputs"):
        from_onnx(model)


def test_conv_transpose3d_symbolic_depth_is_unsupported():
    node = _named("ConvTranspose", ["x", "w"], ["y"], "up3", strides=[2, 2, 2])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, 2, "depth", 4, 4])],
                              [helper.make_empty_tensor_value_info("y")],
                              [onnx.numpy_helper.from_array(rand(2, 3, 2, 2, 2), "w")])
    opsets = [helper.make_opsetid("", 13)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    with pytest.raises(UnsupportedOpError, match=r"ConvTranspose.*up3.*symbolic depth"):
        from_onnx(model)


def test_outputs_declared_without_a_shape_load_as_onnxruntime_takes_them(tmp_path):
    """A graph output typed with no shape field (``make_tensor_value_info(name, FLOAT, None)``;
    onnxruntime runs such models) loads and imports; onnx.checker alone refused it ("Field
    'shape' of 'type' is required"). The declaration itself stays without a shape."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "no_shape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    model = load_onnx(path)
    assert not model.graph.output[0].type.tensor_type.HasField("shape")
    mod, _ = from_onnx(model)
    assert mod["main"].outputs[0].checked_type.shape == (2, 3)
