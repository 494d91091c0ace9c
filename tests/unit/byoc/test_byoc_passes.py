"""BYOC graph passes without a toolchain: dataflow patterns, MergeComposite, AnnotateTarget,
MergeCompilerRegions (including the cycle rule), PartitionGraph (symbols, multi-output
functions, bound or lifted constants), the graph JSON of external nodes (mixed dtypes), and the
registries' errors. Semantics are checked with the graph interpreter (graph_eval runs
composite and external functions inline)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kiln import byoc
from kiln.backend.graph_codegen import graph_json
from kiln.errors import CompileError
from kiln.relay.graph import (
    Call,
    Constant,
    Function,
    FunctionCall,
    PrimitiveCall,
    TensorType,
    TupleGetItem,
    Var,
    astext,
    post_order,
)
from kiln.relay.interpreter import evaluate
from kiln.relay.pattern import is_constant, is_op, match, wildcard
from kiln.relay.transform.annotate_target import annotate_target
from kiln.relay.transform.annotated_regions import annotated_regions
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.relay.transform.merge_compiler_regions import merge_compiler_regions
from kiln.relay.transform.merge_composite import merge_composite
from kiln.relay.transform.partition_graph import partition_graph

RNG = np.random.default_rng(7)
CONV = {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}


def _const(*shape, dtype="float32"):
    return Constant(RNG.standard_normal(shape).astype(dtype))


def conv_block(x, cin=4, cout=4):
    """relu(bias_add(conv2d(x, w), b))"""
    c = Call("nn.conv2d", [x, _const(cout, cin, 3, 3)], CONV)
    return Call("nn.relu", [Call("nn.bias_add", [c, _const(cout)], {"axis": 1})])


def x4(name="x"):
    return Var(name, TensorType((1, 4, 6, 6), "float32"))


def calls(func, kind=Call):
    return [n for n in post_order(func.outputs) if isinstance(n, kind)]


def ops(func):
    return [n.op.name for n in calls(func)]


def same_results(before: Function, after: Function, **inputs) -> None:
    for want, got in zip(evaluate(before, inputs), evaluate(after, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------- patterns
def test_pattern_matches_in_order_and_binds_leaves():
    x = x4()
    w, b = _const(4, 4, 3, 3), _const(4)
    conv = Call("nn.conv2d", [x, w], CONV)
    root = Call("nn.bias_add", [conv, b], {"axis": 1})
    p = is_op("nn.bias_add")(is_op("nn.conv2d")(wildcard(), is_constant()), is_constant())
    m = match(p, root)
    assert m is not None and m.root is root
    assert [n.uid for n in m.nodes] == [root.uid, conv.uid]
    assert m.inputs == [x, w, b]
    assert match(is_op("nn.bias_add")(wildcard(), wildcard()).has_attr({"axis": 0}), root) is None
    assert match(is_op("nn.conv2d")(is_constant(), wildcard()), conv) is None  # order matters
    assert match(p.has_dtype("float16"), root) is None


def test_one_wildcard_must_bind_one_node_and_alternatives():
    x, y = x4("x"), x4("y")
    same = wildcard()
    p = is_op("add")(same, same)
    assert match(p, Call("add", [x, x])) is not None
    assert match(p, Call("add", [x, y])) is None
    alt = is_op("nn.relu")(wildcard()) | is_op("clip")(wildcard())
    assert match(alt, Call("clip", [x], {"a_min": 0.0, "a_max": 6.0})) is not None
    assert match(alt, Call("sigmoid", [x])) is None


# ------------------------------------------------------------------------- MergeComposite
def _cbr_table(check=None):
    c = is_op("nn.conv2d")(wildcard(), wildcard())
    cb = is_op("nn.bias_add")(c, wildcard())
    return [("t.conv2d_bias_relu", is_op("nn.relu")(cb), check),
            ("t.conv2d_bias", cb, None), ("t.conv2d", c, None)]


def test_merge_composite_wraps_matches_and_keeps_semantics():
    x = x4()
    f = Function([x], [conv_block(conv_block(x))])
    g = merge_composite(f, _cbr_table())
    comps = calls(g, FunctionCall)
    assert [c.body.attrs["Composite"] for c in comps] == ["t.conv2d_bias_relu"] * 2
    assert ops(g) == []  # everything is inside composites
    # the weights are composite arguments (parameters of the body), not inside it
    assert all(isinstance(c.args[1], Constant) for c in comps)
    same_results(f, g, x=RNG.standard_normal((1, 4, 6, 6)).astype("float32"))


def test_merge_composite_leaves_escaping_interiors_and_rejected_checks():
    x = x4()
    conv = Call("nn.conv2d", [x, _const(4, 4, 3, 3)], CONV)
    biased = Call("nn.bias_add", [conv, _const(4)], {"axis": 1})
    f = Function([x], [Call("nn.relu", [biased]), conv])  # conv is also an output
    g = merge_composite(f, _cbr_table())
    names = sorted(c.body.attrs["Composite"] for c in calls(g, FunctionCall))
    assert names == ["t.conv2d"]  # only what does not hide a used value
    h = merge_composite(Function([x], [conv_block(x)]), _cbr_table(check=lambda root: False))
    assert [c.body.attrs["Composite"] for c in calls(h, FunctionCall)] == ["t.conv2d_bias"]
    # the check sees the composite body: leaves are its parameters
    seen = []
    merge_composite(Function([x], [conv_block(x)]),
                    _cbr_table(check=lambda r: seen.append(r) or True))
    assert seen and all(isinstance(a, Var) for a in seen[0].args[0].args[0].args)


# -------------------------------------------------------------- annotate / merge regions
def _support(*names):
    return lambda call: call.op.name in names


def test_annotate_target_wraps_supported_calls():
    x = x4()
    f = Function([x], [Call("sigmoid", [Call("nn.relu", [x])])])
    g = annotate_target(f, {"a": _support("nn.relu")})
    assert ops(g) == ["annotation.compiler_begin", "nn.relu", "annotation.compiler_end",
                      "sigmoid"]
    # the first compiler that accepts an op wins
    h = annotate_target(f, {"a": _support("nn.relu"), "b": _support("nn.relu", "sigmoid")})
    regions = annotated_regions(h).regions
    assert sorted(r.compiler for r in regions) == ["a", "b"]


def test_merge_compiler_regions_merges_chains_but_never_makes_a_cycle():
    x = x4()
    a = Call("nn.relu", [x])
    b = Call("sigmoid", [a])  # Kiln's
    c = Call("add", [a, b])  # supported, reads a directly and through b
    d = Call("nn.relu", [c])
    f = Function([x], [d])
    ann = annotate_target(f, {"ext": _support("nn.relu", "add")})
    assert len(annotated_regions(ann).regions) == 3
    merged = merge_compiler_regions(ann)
    regions = annotated_regions(merged).regions
    # c and d merge; a cannot join them: a -> sigmoid -> c would leave the region and come back
    assert sorted(len(r.nodes) for r in regions) == [1, 2]
    part = partition_graph(merged)
    same_results(f, part, x=RNG.standard_normal((1, 4, 6, 6)).astype("float32"))


# ------------------------------------------------------------------------- PartitionGraph
def _partition(f, support, bind=True, compiler="ext"):
    ann = merge_compiler_regions(annotate_target(f, {compiler: support}))
    return partition_graph(ann, "m", lambda c: bind)


def test_partition_names_symbols_and_outlines_multi_output_regions():
    x = x4()
    a = Call("nn.relu", [x])
    b = Call("add", [a, _const(1, 4, 1, 1)])
    # a and b both leave the region: a to sigmoid, b as a graph output
    f = Function([x], [b, Call("sigmoid", [a])])
    g = _partition(f, _support("nn.relu", "add"))
    (ext,) = calls(g, FunctionCall)
    assert ext.body.attrs["Compiler"] == "ext"
    assert ext.body.attrs["global_symbol"] == "kiln_m_ext_main_0"
    assert ext.num_outputs == 2
    assert sorted(t.index for t in calls(g, TupleGetItem)) == [0, 1]
    assert not any(n.startswith("annotation.") for n in ops(g))
    # bound constant: inside the function, not an argument
    assert [type(a).__name__ for a in ext.args] == ["Var"]
    assert byoc.constant_names(ext.body).keys() == {"kiln_m_ext_main_0_const_0"}
    same_results(f, g, x=RNG.standard_normal((1, 4, 6, 6)).astype("float32"))


def test_partition_can_leave_constants_as_arguments_and_numbers_per_compiler():
    x = x4()
    f = Function([x], [Call("nn.relu", [Call("sigmoid", [Call("nn.relu", [x])])])])
    g = _partition(f, _support("nn.relu"), bind=False)
    exts = calls(g, FunctionCall)
    assert [e.body.attrs["global_symbol"] for e in exts] == ["kiln_m_ext_main_0",
                                                            "kiln_m_ext_main_1"]
    h = _partition(Function([x], [Call("add", [x, _const(1, 4, 1, 1)])]), _support("add"),
                   bind=False)
    (ext,) = calls(h, FunctionCall)
    assert isinstance(ext.args[1], Constant) and byoc.constant_names(ext.body) == {}


def test_unclaimed_composites_are_inlined_back():
    x = x4()
    f = Function([x], [conv_block(x)])
    comp = merge_composite(f, _cbr_table())
    g = partition_graph(annotate_target(comp, {"other": lambda c: False}))
    assert calls(g, FunctionCall) == []
    assert ops(g) == ["nn.conv2d", "nn.bias_add", "nn.relu"]


def test_graph_json_of_external_nodes_with_mixed_dtypes():
    a = Var("a", TensorType((2, 3), "int32"))
    b = Var("b", TensorType((2, 3), "float32"))
    cast = Call("cast", [a], {"dtype": "float32"})
    s = Call("add", [cast, b])
    back = Call("cast", [s], {"dtype": "int32"})
    # one region, cast → add → cast, whose float32 and int32 results both leave it
    f = Function([a, b], [Call("sigmoid", [s]), Call("multiply", [back, back])])
    g = fuse_ops(_partition(f, _support("cast", "add")))
    text, _, _ = graph_json(g, {p.uid: p.name for p in calls(g, PrimitiveCall)})
    graph = json.loads(text)
    (node,) = [n for n in graph["nodes"] if n.get("attrs", {}).get("Compiler") == "ext"]
    nid = graph["nodes"].index(node)
    assert node["name"] == node["attrs"]["func_name"] == node["attrs"]["global_symbol"]
    assert node["attrs"]["num_outputs"] == "2" and node["attrs"]["num_inputs"] == "2"
    first = graph["node_row_ptr"][nid]
    dltypes = graph["attrs"]["dltype"][1][first:first + 2]
    assert sorted(dltypes) == ["float32", "int32"]
    readers = [i for n in graph["nodes"] for i in n.get("inputs", []) if i[0] == nid]
    assert sorted(i[1] for i in readers) == [0, 1]
    sids = graph["attrs"]["storage_id"][1]
    assert sids[first] != sids[first + 1]  # two live outputs, two storages
    assert len(graph["attrs"]["dltype"][1]) == graph["node_row_ptr"][-1] == len(sids)
    a_val = np.arange(6, dtype="int32").reshape(2, 3)
    same_results(f, g, a=a_val, b=np.ones((2, 3), "float32"))


# ------------------------------------------------------------------------------- registry
@pytest.fixture
def compiler():
    names = []

    def make(name):
        names.append(name)
        return name

    yield make
    for n in names:
        byoc.unregister(n)


def test_registry_errors(compiler):
    name = compiler("unit_toy")
    with pytest.raises(CompileError, match="no external codegen registered.*'unit_toy'"):
        byoc.get_compiler(name)
    byoc.register_external_codegen(name, lambda funcs: [])
    with pytest.raises(CompileError, match="already registered"):
        byoc.register_external_codegen(name, lambda funcs: [])
    with pytest.raises(CompileError, match="unknown graph ops"):
        byoc.register_op_support(name, "nn.not_an_op")
    with pytest.raises(CompileError, match="identifier"):
        byoc.register_external_codegen("bad-name", lambda funcs: [])
    byoc.register_pattern_table(name, lambda: [("other.relu", is_op("nn.relu")(wildcard()))])
    x = x4()
    with pytest.raises(CompileError, match="must be named 'unit_toy.<name>'"):
        byoc.partition_for(Function([x], [Call("nn.relu", [x])]), [name])
    with pytest.raises(CompileError, match="listed twice"):
        byoc.partition_for(Function([x], [Call("nn.relu", [x])]), ["cblas", "cblas"])
    assert {"cblas", "kiln_json"} <= set(byoc.list_compilers())


def test_builtin_pattern_tables_on_a_resnet_block():
    """cblas takes conv + bias + residual + relu as one composite; kiln_json has no residual
    composite and takes the add as an op."""
    x = x4()
    c1 = Call("nn.conv2d", [x, _const(4, 4, 3, 3)], CONV)
    b1 = Call("add", [c1, _const(4, 1, 1)])
    res = Call("nn.relu", [Call("add", [b1, x])])
    dw = Call("nn.conv2d", [res, _const(4, 1, 3, 3)], dict(CONV, groups=4))  # depthwise
    f = Function([x], [dw])
    g = byoc.partition_for(f, ["cblas"])
    (ext,) = calls(g, FunctionCall)
    inner = [n.body.attrs["Composite"] for n in post_order(ext.body.outputs)
             if isinstance(n, FunctionCall)]
    assert inner == ["cblas.conv2d_bias_add_relu"]
    assert "nn.conv2d" in ops(g)  # the depthwise conv stays on Kiln
    h = byoc.partition_for(f, ["kiln_json"])
    (ext,) = calls(h, FunctionCall)
    body = astext(ext.body)
    assert "kiln_json.conv2d_bias" in body and "add(" in body and "nn.relu(" in body
    same_results(f, g, x=RNG.standard_normal((1, 4, 6, 6)).astype("float32"))
    same_results(f, h, x=RNG.standard_normal((1, 4, 6, 6)).astype("float32"))
