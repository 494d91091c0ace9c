"""The kiln_json backend without a toolchain: partition with ``kiln_json``, serialize each
external function, run the JSONRuntimeModule's interpreter directly (constants handed over as
the const loader would) and compare with the graph interpreter; the module's byte format and
its refusal of corrupt or inconsistent input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.byoc import constant_names, external_functions, partition_for
from kiln.byoc.kiln_json import serialize
from kiln.errors import KilnError, ModuleLoadError
from kiln.relay.graph import (
    Call,
    Constant,
    Function,
    FunctionCall,
    TensorType,
    TupleGetItem,
    Var,
    post_order,
)
from kiln.relay.interpreter import evaluate
from kiln.runtime.contrib.json.json_runtime import JSONRuntimeModule

RNG = np.random.default_rng(3)


def _const(*shape):
    return Constant(RNG.standard_normal(shape).astype("float32"))


def _conv(x, cout, k=3, stride=1, pad=1, dilation=1, groups=1):
    cin = x.checked_type.shape[1]
    return Call("nn.conv2d", [x, _const(cout, cin // groups, k, k)],
                {"strides": (stride, stride), "padding": (pad, pad, pad, pad),
                 "dilation": (dilation, dilation), "groups": groups})


def run_external(func: Function, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate a partitioned ``func`` with every kiln_json call run by a JSONRuntimeModule
    (loaded back from its bytes) instead of graph_eval."""
    modules = {}
    for f in external_functions(func):
        graph, consts = serialize(f)
        m = JSONRuntimeModule.load_from_binary(
            JSONRuntimeModule(f.attrs["global_symbol"], graph, consts).save_to_binary())
        values = constant_names(f)
        m[f"__init_{m.symbol}"](*[rt.array(values[c].data) for c in consts])
        modules[m.symbol] = (m, f)
    env: dict[int, object] = {p.uid: inputs[p.name] for p in func.params}
    for n in post_order(func.outputs):
        if n.uid in env:
            continue
        if isinstance(n, Constant):
            env[n.uid] = n.data
        elif isinstance(n, FunctionCall):
            m, f = modules[n.body.attrs["global_symbol"]]
            outs = [rt.empty(t.shape, t.dtype) for t in n.output_types]
            m[m.symbol](*[rt.array(env[a.uid]) for a in n.args], *outs)
            env[n.uid] = [o.numpy() for o in outs]
        elif isinstance(n, TupleGetItem):
            env[n.uid] = env[n.value.uid][n.index]
        else:
            args = [env[a.uid][0] if isinstance(env[a.uid], list) else env[a.uid]
                    for a in n.args]
            env[n.uid] = evaluate(Function([], [Call(n.op.name, [Constant(a) for a in args],
                                                     n.attrs)]), {})[0]
    return [env[o.uid][0] if isinstance(env[o.uid], list) else env[o.uid]
            for o in func.outputs]


def check(f: Function, **inputs):
    part = partition_for(f, ["kiln_json"])
    assert external_functions(part), "nothing was offloaded"
    want = evaluate(f, inputs)
    got = run_external(part, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return part


@pytest.mark.parametrize("conv", [
    {"k": 3, "stride": 1, "pad": 1}, {"k": 1, "stride": 1, "pad": 0},
    {"k": 3, "stride": 2, "pad": 0},
    {"k": 3, "stride": 1, "pad": 2, "dilation": 2}, {"k": 3, "stride": 1, "pad": 1, "groups": 2},
    {"k": 3, "stride": 2, "pad": 1, "groups": 8},  # depthwise
])
def test_convolutions_and_composites(conv):
    x = Var("x", TensorType((2, 8, 9, 9), "float32"))
    c = _conv(x, 8, **conv)
    y = Call("nn.relu", [Call("nn.bias_add", [c, _const(8)], {"axis": 1})])
    part = check(Function([x], [Call("sigmoid", [y])]),
                 x=RNG.standard_normal((2, 8, 9, 9)).astype("float32"))
    (f,) = external_functions(part)
    graph = json.loads(serialize(f)[0])
    assert [n["name"] for n in graph["nodes"] if n["op"] == "kernel"] == [
        "kiln_json.conv2d_bias_relu"]
    assert [n["op"] for n in graph["nodes"]].count("const") == 2


def test_pooling_dense_concat_reshape_and_multi_output():
    x = Var("x", TensorType((1, 4, 7, 7), "float32"))
    a = Call("nn.relu", [x])
    pool = Call("nn.max_pool2d", [a], {"pool_size": (3, 3), "strides": (2, 2),
                                       "padding": (0, 0, 1, 1), "dilation": (1, 1),
                                       "ceil_mode": True})
    cat = Call("concatenate", [pool, pool], {"axis": 1})
    gap = Call("nn.global_avg_pool2d", [cat])
    flat = Call("reshape", [gap], {"newshape": (1, 8)})
    dense = Call("nn.bias_add", [Call("nn.dense", [flat, _const(5, 8)]), _const(5)],
                 {"axis": 1})
    clip = Call("clip", [Call("multiply", [dense, _const(1, 5)])], {"a_min": -1.0,
                                                                    "a_max": 1.0})
    f = Function([x], [clip, Call("sigmoid", [pool])])  # pool leaves the region twice
    part = check(f, x=RNG.standard_normal((1, 4, 7, 7)).astype("float32"))
    assert len(external_functions(part)) == 1
    assert external_functions(part)[0].attrs["global_symbol"] == "kiln_default_kiln_json_main_0"


def test_other_dtypes_stay_on_kiln():
    x = Var("x", TensorType((2, 3), "float64"))
    f = Function([x], [Call("nn.relu", [x])])
    assert external_functions(partition_for(f, ["kiln_json"])) == []


def _module():
    x = Var("x", TensorType((1, 4, 5, 5), "float32"))
    f = Function([x], [Call("nn.relu", [_conv(x, 4)])])
    (ext,) = external_functions(partition_for(f, ["kiln_json"]))
    graph, consts = serialize(ext)
    return JSONRuntimeModule(ext.attrs["global_symbol"], graph, consts), ext


def test_byte_format_and_functions():
    m, ext = _module()
    data = m.save_to_binary()
    r = rt.stream.StreamReader(data, "test")
    assert r.string("symbol") == m.symbol == "kiln_default_kiln_json_main_0"
    assert json.loads(r.string("graph"))["heads"]
    assert r.vec_str("consts") == [f"{m.symbol}_const_0"] and not r.remaining
    assert m["get_symbol"]() == m.symbol and m["get_const_vars"]() == m.const_names
    assert set(m.list_function_names()) == {"get_symbol", "get_const_vars",
                                            f"__init_{m.symbol}", m.symbol}
    x, out = rt.array(np.ones((1, 4, 5, 5), "float32")), rt.empty((1, 4, 5, 5), "float32")
    with pytest.raises(KilnError, match="before __init_"):
        m[m.symbol](x, out)
    with pytest.raises(KilnError, match="constant .* is \\(2,\\)"):
        m[f"__init_{m.symbol}"](rt.array(np.ones(2, "float32")))
    m[f"__init_{m.symbol}"](rt.array(constant_names(ext)[m.const_names[0]].data))
    with pytest.raises(KilnError, match="expects 1 inputs and 1 outputs"):
        m[m.symbol](x)
    with pytest.raises(KilnError, match="input 0 is \\(1, 4, 5, 5\\) float64"):
        m[m.symbol](rt.array(np.ones((1, 4, 5, 5))), out)


@pytest.mark.parametrize("mutate,match", [
    (lambda g: g.update(nodes="x"), "no 'nodes' list"),
    (lambda g: g["nodes"][1].update(name="nn.unknown_op"), "no kiln_json kernel"),
    (lambda g: g["nodes"][1].update(inputs=[[1, 0, 0]]), "not an earlier node"),
    (lambda g: g["nodes"][0]["attrs"].update(dtype=["complex64"]), "supported dtype"),
    (lambda g: g.update(heads=[]), "no outputs"),
    (lambda g: g.update(arg_nodes=[1]), "must list input nodes"),
])
def test_corrupt_graphs_are_load_errors(mutate, match):
    t = {"shape": [[2]], "dtype": ["float32"]}
    g = {"nodes": [{"op": "input", "name": "x", "attrs": dict(t)},
                   {"op": "kernel", "name": "nn.relu", "inputs": [[0, 0, 0]], "attrs": dict(t)}],
         "arg_nodes": [0], "heads": [[1, 0, 0]]}
    m = JSONRuntimeModule("f", json.dumps(g), [])
    out = rt.empty((2,), "float32")
    m["f"](rt.array(np.array([-1, 2], "float32")), out)
    np.testing.assert_array_equal(out.numpy(), [0, 2])
    mutate(g)
    with pytest.raises(ModuleLoadError, match=match):
        JSONRuntimeModule("f", json.dumps(g), [])


def test_truncated_bytes_and_unknown_constants_are_load_errors():
    m, _ = _module()
    data = m.save_to_binary()
    for cut in (0, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(ModuleLoadError):
            JSONRuntimeModule.load_from_binary(data[:cut])
    with pytest.raises(ModuleLoadError, match="not among its constants"):
        JSONRuntimeModule(m.symbol, m.graph_json, [])
    with pytest.raises(ModuleLoadError, match="trailing"):
        JSONRuntimeModule.load_from_binary(data + b"x")
    assert "kiln_json" in rt.list_module_loaders()


def test_a_head_listed_twice_fills_both_outputs():
    t = {"shape": [[2, 3]], "dtype": ["float32"]}
    g = {"nodes": [{"op": "input", "name": "x", "attrs": t},
                   {"op": "kernel", "name": "nn.relu", "inputs": [[0, 0, 0]], "attrs": t}],
         "arg_nodes": [0], "heads": [[1, 0, 0], [1, 0, 0], [0, 0, 0]]}
    m = JSONRuntimeModule("f", json.dumps(g), [])
    x = RNG.standard_normal((2, 3)).astype("float32")
    outs = [np.full((2, 3), np.nan, "float32") for _ in range(3)]
    m.run(x, *outs)
    for got, want in zip(outs, [np.maximum(x, 0), np.maximum(x, 0), x]):
        np.testing.assert_array_equal(got, want)
