"""kiln.relay.provenance: the ONNX nodes a fused kernel covers and the ONNX tensor its output is,
on hand-built fused graphs (the end-to-end path is tests/backend/runtime/test_onnx_profile.py)."""

from __future__ import annotations

import json

from kiln.relay.graph import Call, Function, PrimitiveCall, TensorType, Var
from kiln.relay.provenance import (
    ONNX_NODES,
    NodeInfo,
    covered_nodes,
    kernel_attrs,
    lookup,
    stored_layout,
)

F32 = "float32"


def kernel(name: str, arg, build) -> PrimitiveCall:
    p = Var("p", arg.checked_type)
    return PrimitiveCall(Function([p], [build(p)]), [arg], name)


def test_stored_layout():
    assert stored_layout((1, 8, 4, 4), (1, 8, 4, 4)) == ""
    assert stored_layout((1, 2, 4, 4, 8), (1, 16, 4, 4)) == "NCHW8c"
    assert stored_layout((1, 13, 4, 4, 8), (1, 100, 4, 4)) == "NCHW8c"  # padded to 104
    assert stored_layout((1, 14, 4, 4, 8), (1, 100, 4, 4)) is None  # a whole block too many
    assert stored_layout((1, 2, 4, 5, 8), (1, 16, 4, 4)) is None
    assert stored_layout((2, 8), (16,)) is None
    assert stored_layout((1, 2, 4, 4, 8), (1, 16, "n", 4)) is None  # symbolic: not claimed


def test_lookup_finds_function_body_nodes():
    table = {"Gelu_3": NodeInfo("Gelu", ())}
    assert lookup(table, "Gelu_3/Mul_1") == ("Gelu_3", table["Gelu_3"])
    assert lookup(table, None) is None and lookup(table, "Other") is None


def test_node_split_over_two_kernels_names_its_output_once():
    """One ONNX node lowered to two kernels: both cover it, the last one holds its output."""
    x = Var("x", TensorType((2, 8), F32))
    first = kernel("k_relu", x, lambda p: Call("nn.relu", [p], span="Act_0"))
    second = kernel("k_exp", first, lambda p: Call("exp", [Call("add", [p, p], span="Act_0")],
                                                    span="Act_0"))
    table = {"Act_0": NodeInfo("Act", (("act", (2, 8), F32),))}
    attrs = kernel_attrs(Function([x], [second], ["act"], {ONNX_NODES: table}))
    assert json.loads(attrs[first.uid]["onnx_nodes"]) == ["Act_0"]
    assert "onnx_output" not in attrs[first.uid]
    assert attrs[second.uid]["onnx_output"] == "act"
    assert json.loads(attrs[second.uid]["onnx_op_types"]) == ["Act"]


def test_layout_kernel_and_blocked_output():
    """A conv-like kernel whose output is NCHW4c, then an unnamed layout change: the first
    holds the ONNX tensor in NCHW4c; the layout change covers no node."""
    x = Var("x", TensorType((1, 8, 3, 3), F32))
    blocked = kernel("k_to", x, lambda p: Call("layout_transform", [p], {
        "src_layout": "NCHW", "dst_layout": "NCHW4c"}))
    act = kernel("k_act", blocked, lambda p: Call("sigmoid", [Call("nn.relu", [p], span="R")],
                                                  span="S"))
    back = kernel("k_back", act, lambda p: Call("layout_transform", [p], {
        "src_layout": "NCHW4c", "dst_layout": "NCHW"}))
    table = {"R": NodeInfo("Relu", (("r", (1, 8, 3, 3), F32),)),
             "S": NodeInfo("Sigmoid", (("s", (1, 8, 3, 3), F32),))}
    attrs = kernel_attrs(Function([x], [back], ["s"], {ONNX_NODES: table}))
    assert blocked.uid not in attrs and back.uid not in attrs
    assert attrs[act.uid] == {"onnx_nodes": '["R", "S"]', "onnx_op_types": '["Relu", "Sigmoid"]',
                              "onnx_output": "s", "onnx_layout": "NCHW4c",
                              "onnx_shape": "[1, 8, 3, 3]"}
    assert covered_nodes(act.body, table) == ["R", "S"]


def test_no_table_no_attrs():
    """A graph not imported from ONNX (no table): no attrs, the JSON stays as before."""
    x = Var("x", TensorType((4,), F32))
    k = kernel("k", x, lambda p: Call("nn.relu", [p], span="R"))
    assert kernel_attrs(Function([x], [k])) == {}


def test_partial_result_of_a_node_is_not_its_output():
    """SplitConcat's conv of a concat as a sum of convs: the first kernel holds one term, of
    the conv's type; the conv's output is in no kernel's output (the second kernel goes on to
    the Relu), so neither kernel names it."""
    x = Var("x", TensorType((1, 8, 3, 3), F32))
    term = kernel("k_term", x, lambda p: Call("nn.relu", [p], span="Conv_0"))
    p, q = Var("p", x.checked_type), Var("q", x.checked_type)
    total = Call("add", [p, q], span="Conv_0")
    rest = PrimitiveCall(Function([p, q], [Call("nn.relu", [total], span="Relu_1")]),
                         [term, x], "k_rest")
    table = {"Conv_0": NodeInfo("Conv", (("c", (1, 8, 3, 3), F32),)),
             "Relu_1": NodeInfo("Relu", (("r", (1, 8, 3, 3), F32),))}
    attrs = kernel_attrs(Function([x], [rest], ["r"], {ONNX_NODES: table}))
    assert json.loads(attrs[term.uid]["onnx_nodes"]) == ["Conv_0"]
    assert "onnx_output" not in attrs[term.uid]
    assert json.loads(attrs[rest.uid]["onnx_nodes"]) == ["Conv_0", "Relu_1"]
    assert attrs[rest.uid]["onnx_output"] == "r"
