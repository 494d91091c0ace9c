"""Write the graph executor's JSON for a fused function (TVM's GraphExecutorCodegen).

Format: shared reference, section 4 (src/relay/backend/graph_executor_codegen.cc). Graph inputs
become ``null`` nodes named after the model's inputs; constants feeding kernels become ``null``
nodes named ``p0, p1, ...`` whose values go to the params dict; each primitive call becomes a
``tvm_op`` node. **Kiln:** ``attrs.output_names`` (list_str) keeps the model's output names.
"""

from __future__ import annotations

import json

import numpy as np

from kiln.backend.memory_plan import StoragePlan, plan_memory
from kiln.errors import CompileError
from kiln.ir.graph import Constant, Expr, Function, PrimitiveCall, Var, post_order


def graph_json(func: Function, kernel_names: dict[int, str]) -> tuple[str, dict, StoragePlan]:
    """Return (graph JSON text, params {name: ndarray}, the storage plan).

    ``kernel_names`` maps each PrimitiveCall's uid to the kernel (function) name it calls.
    """
    nodes: list[dict] = []
    entry_of: dict[int, int] = {}
    types: list = []
    params: dict[str, np.ndarray] = {}
    ops: list[tuple[list[int], int]] = []
    external: set[int] = set()

    def add_null(name: str, expr: Expr) -> None:
        entry_of[expr.uid] = len(nodes)
        external.add(len(nodes))
        nodes.append({"op": "null", "name": name, "inputs": []})
        types.append(expr.checked_type)

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
        assert isinstance(node, PrimitiveCall), f"unfused node {node!r} reached graph codegen"
        inputs = [entry_of[a.uid] for a in node.args]
        entry_of[node.uid] = len(nodes)
        ops.append((inputs, len(nodes)))
        nodes.append({
            "op": "tvm_op", "name": node.name,
            "inputs": [[e, 0, 0] for e in inputs],
            "attrs": {"func_name": kernel_names[node.uid], "num_inputs": str(len(inputs)),
                      "num_outputs": "1", "flatten_data": "0"},
        })
        types.append(node.checked_type)
    heads = [entry_of[o.uid] for o in func.outputs]
    plan = plan_memory([t.nbytes for t in types], external, ops, set(heads))
    graph = {
        "nodes": nodes,
        "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"],
        "heads": [[h, 0, 0] for h in heads],
        "node_row_ptr": list(range(len(nodes) + 1)),
        "attrs": {
            "dltype": ["list_str", [t.dtype for t in types]],
            "storage_id": ["list_int", plan.storage_id],
            "shape": ["list_shape", [list(t.shape) for t in types]],
            "device_index": ["list_int", [1] * len(nodes)],
            "output_names": ["list_str", list(func.output_names)],
        },
    }
    return json.dumps(graph, indent=1), params, plan
