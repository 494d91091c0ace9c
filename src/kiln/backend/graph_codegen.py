"""Write the graph executor's JSON for a fused function (TVM's GraphExecutorCodegen).

Format: docs/formats.md §4 (src/relay/backend/graph_executor_codegen.cc). Graph inputs
become ``null`` nodes named after the model's inputs; constants feeding kernels become ``null``
nodes named ``p0, p1, ...`` whose values go to the params dict; each primitive call becomes a
``tvm_op`` node. An external (BYOC) function call becomes a ``tvm_op`` node too, named and
called by its ``global_symbol``, with the extra attrs ``Compiler`` and ``global_symbol`` (as
TVM's graph executor codegen writes them) and one entry per output (``num_outputs``; its
``TupleGetItem`` readers use entry ``[node, k, 0]``); its dtypes may differ per entry.
**Kiln:** ``attrs.output_names`` (list_str) keeps the model's output names; a kernel node of a
model imported from ONNX has ``onnx_nodes``, ``onnx_op_types`` and, when its output is an ONNX
tensor, ``onnx_output`` (:func:`kiln.relay.provenance.kernel_attrs`, docs/formats.md §4.1).
"""

from __future__ import annotations

import json

import numpy as np

from kiln.backend.memory_plan import StoragePlan, plan_memory
from kiln.errors import CompileError
from kiln.relay.graph import (
    Call,
    Constant,
    Expr,
    Function,
    FunctionCall,
    PrimitiveCall,
    TupleGetItem,
    Var,
    post_order,
)
from kiln.relay.provenance import kernel_attrs


def graph_json(func: Function, kernel_names: dict[int, str]) -> tuple[str, dict, StoragePlan]:
    """Return (graph JSON text, params {name: ndarray}, the storage plan).

    ``kernel_names`` maps each PrimitiveCall's uid to the kernel (function) name it calls.
    """
    nodes: list[dict] = []
    entry_of: dict[int, tuple[int, int]] = {}  # uid → (node id, output index)
    row_ptr = [0]
    types: list = []  # per entry
    params: dict[str, np.ndarray] = {}
    ops: list[tuple[list[int], list[int]]] = []
    external: set[int] = set()
    onnx = kernel_attrs(func)

    def eid(entry: tuple[int, int]) -> int:
        return row_ptr[entry[0]] + entry[1]

    def add_node(node: dict, expr: Expr, out_types: list) -> None:
        entry_of[expr.uid] = (len(nodes), 0)
        nodes.append(node)
        types.extend(out_types)
        row_ptr.append(row_ptr[-1] + len(out_types))

    def add_null(name: str, expr: Expr) -> None:
        external.add(row_ptr[-1])
        add_node({"op": "null", "name": name, "inputs": []}, expr, [expr.checked_type])

    for v in func.params:
        add_null(v.name, v)
    for node in post_order(func.outputs):
        if node.uid in entry_of:
            continue
        if isinstance(node, Var):
            raise CompileError(f"graph input {node.name} is not a parameter of the function")
        if isinstance(node, Constant):
            pname = f"p{len(params)}"
            params[pname] = node.data
            add_null(pname, node)
            continue
        if isinstance(node, TupleGetItem):
            nid, _ = entry_of[node.value.uid]
            entry_of[node.uid] = (nid, node.index)
            continue
        inputs = [entry_of[a.uid] for a in node.args]
        attrs: dict[str, str]
        if isinstance(node, FunctionCall) and "Compiler" in node.body.attrs:
            symbol = str(node.body.attrs["global_symbol"])
            out_types = list(node.output_types)
            attrs = {"func_name": symbol, "num_inputs": str(len(inputs)),
                     "num_outputs": str(len(out_types)), "flatten_data": "0",
                     "Compiler": str(node.body.attrs["Compiler"]), "global_symbol": symbol}
            name = symbol
        elif isinstance(node, Call) and node.op.runtime:
            raise CompileError(f"the graph executor cannot run {node.op.name} (node "
                               f"{node.span or '?'}): its output shape is known only at run "
                               "time; build with executor='vm'")
        else:
            assert isinstance(node, PrimitiveCall), f"unfused node {node!r} reached graph codegen"
            out_types = [node.checked_type]
            attrs = {"func_name": kernel_names[node.uid], "num_inputs": str(len(inputs)),
                     "num_outputs": "1", "flatten_data": "0"}
            name = node.name
        attrs.update(onnx.get(node.uid, {}))
        first = row_ptr[-1]
        ops.append(([eid(e) for e in inputs], list(range(first, first + len(out_types)))))
        add_node({"op": "tvm_op", "name": name, "inputs": [[n, k, 0] for n, k in inputs],
                  "attrs": attrs}, node, out_types)
    heads = [entry_of[o.uid] for o in func.outputs]
    plan = plan_memory([t.nbytes for t in types], external, ops, {eid(h) for h in heads})
    graph = {
        "nodes": nodes,
        "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"],
        "heads": [[n, k, 0] for n, k in heads],
        "node_row_ptr": row_ptr,
        "attrs": {
            "dltype": ["list_str", [t.dtype for t in types]],
            "storage_id": ["list_int", plan.storage_id],
            "shape": ["list_shape", [list(t.shape) for t in types]],
            "device_index": ["list_int", [1] * len(types)],
            "output_names": ["list_str", list(func.output_names)],
        },
    }
    return json.dumps(graph, indent=1), params, plan
