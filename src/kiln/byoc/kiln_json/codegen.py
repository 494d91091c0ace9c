"""The kiln_json codegen: one partitioned function → a JSON graph + constant names, in a
:class:`kiln.runtime.JSONRuntimeModule` (TVM's JSON serializer for BYOC backends:
src/relay/backend/contrib/codegen_json/codegen_json.h).

Nodes are written in execution order: the function's parameters as ``input`` nodes, its bound
constants as ``const`` nodes named ``<global_symbol>_const_<i>`` (``kiln.byoc.constant_names``,
the names the const loader uses), each op call as a ``kernel`` node named after the op, and each
composite call as one ``kernel`` node named after the composite, with the anchor op's attrs plus
``bias`` (0/1) and ``activation`` (``"relu"`` or ``""``). Every node records its output
``shape`` and ``dtype``; attrs are the graph op's (tuples become lists).
"""

from __future__ import annotations

import json
from typing import Any

from kiln.byoc.codegen import constant_names
from kiln.byoc.gemm_composites import parse
from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Function, FunctionCall, Var, post_order
from kiln.runtime import JSONRuntimeModule


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    raise CompileError(f"kiln_json: attr value {v!r} cannot be written as JSON")


def serialize(func: Function) -> tuple[str, list[str]]:
    """The JSON graph of external function ``func`` and its constants' names, in order.

    Raises
    ------
    CompileError
        A node the JSON format cannot express (a composite that is not a conv2d composite).
    """
    symbol = str(func.attrs["global_symbol"])
    const_of = {c.uid: name for name, c in constant_names(func).items()}
    nodes: list[dict] = []
    entry: dict[int, int] = {}

    def typed(node: dict, t) -> dict:
        node.setdefault("attrs", {}).update({"shape": [list(t.shape)], "dtype": [t.dtype]})
        return node

    for p in func.params:
        entry[p.uid] = len(nodes)
        nodes.append(typed({"op": "input", "name": p.name}, p.checked_type))
    for n in post_order(func.outputs):
        if n.uid in entry:
            continue
        if isinstance(n, Constant):
            entry[n.uid] = len(nodes)
            nodes.append(typed({"op": "const", "name": const_of[n.uid]}, n.checked_type))
            continue
        if isinstance(n, Var):
            raise CompileError(f"kiln_json: {symbol} reads {n.name}, not one of its parameters")
        inputs = [[entry[a.uid], 0, 0] for a in n.args]
        if isinstance(n, FunctionCall):
            comp_name = str(n.body.attrs.get("Composite"))
            comp = parse(n.body.outputs[0])
            if comp is None or comp.kind != "conv2d" or comp.residual_arg is not None:
                raise CompileError(f"kiln_json: cannot serialize composite {comp_name}")
            attrs = {k: _jsonable(v) for k, v in comp.anchor.attrs.items()}
            attrs["bias"] = int(comp.bias_arg is not None)
            attrs["activation"] = "relu" if comp.activation is not None else ""
            # inputs in the kernel's order: data, weight[, bias]
            order = [comp.data_arg, comp.weight_arg] + ([comp.bias_arg] if comp.bias_arg else [])
            pos = {p.uid: k for k, p in enumerate(n.body.params)}
            inputs = [inputs[pos[a.uid]] for a in order]
            node = {"op": "kernel", "name": comp_name, "inputs": inputs, "attrs": attrs}
        else:
            assert isinstance(n, Call), f"unexpected node {n!r} in an external function"
            attrs = {k: _jsonable(v) for k, v in n.attrs.items()}
            node = {"op": "kernel", "name": n.op.name, "inputs": inputs, "attrs": attrs}
        entry[n.uid] = len(nodes)
        nodes.append(typed(node, n.checked_type))
    graph = {
        "nodes": nodes,
        "arg_nodes": [entry[p.uid] for p in func.params],
        "heads": [[entry[o.uid], 0, 0] for o in func.outputs],
        "node_row_ptr": list(range(len(nodes) + 1)),
    }
    return json.dumps(graph), list(const_of.values())


def kiln_json_codegen(funcs: list[Function]) -> list[JSONRuntimeModule]:
    """One :class:`JSONRuntimeModule` per external function (each its own symbol, as the const
    loader initializes them one by one)."""
    mods = []
    for f in funcs:
        graph, consts = serialize(f)
        mods.append(JSONRuntimeModule(str(f.attrs["global_symbol"]), graph, consts))
    return mods
