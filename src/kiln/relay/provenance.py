"""Which ONNX nodes a fused kernel covers, and which ONNX tensor its output is.

The importer keeps each call's ONNX node name as its ``span`` (passes copy it when they rebuild
a call) and records, in ``main``'s ``attrs["onnx_nodes"]``, every ONNX node's op type and its
outputs' names, shapes and dtypes. After FuseOps a kernel's body holds the calls it fused, so
their spans name the ONNX nodes it covers (TVM's ``Span.source_name`` plays this role). The graph
executor codegen writes :func:`kernel_attrs` into each ``tvm_op`` node (docs/formats.md §4.1),
which profiles and dumps read to speak in the model's terms.

A kernel's output *is* an ONNX tensor when the call it ends with came from node X (through
``layout_transform``/crop calls, which carry no span), its type is X's output type, or X's
NCHW output in ``NCHW{c}c`` (AlterOpLayout's blocked layout, channels maybe padded to a
multiple of ``c``), and no later kernel covers X too. A node lowered to several kernels ends
in the last of them; the others hold partial results of the same type (SplitConcat turns a
conv of a concat into a sum of convs: the first conv kernel holds one term of it). Otherwise
the kernel's output is an intermediate value and has no ONNX name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kiln.relay.graph import Call, Expr, Function, FunctionCall, PrimitiveCall, post_order

#: key of ``Function.attrs`` holding ``{ONNX node name: NodeInfo}`` (set by the ONNX importer)
ONNX_NODES = "onnx_nodes"

#: ops a pass adds between a kernel's last ONNX call and its output (no span of their own)
_LAYOUT_OPS = ("layout_transform", "strided_slice")


@dataclass(frozen=True)
class NodeInfo:
    """One ONNX node: ``op_type`` and its outputs as ``(tensor name, shape, dtype)``; a
    symbolic dim of a shape is its text."""

    op_type: str
    outputs: tuple[tuple[str, tuple[int | str, ...], str], ...]


def lookup(table: dict[str, NodeInfo], span: str | None) -> tuple[str, NodeInfo] | None:
    """The ONNX node ``span`` names: itself, or for a node of an ONNX function body
    (``Node/inner``) the node the function expanded."""
    if not span:
        return None
    name = span if span in table else span.split("/", 1)[0]
    return (name, table[name]) if name in table else None


def covered_nodes(body: Function, table: dict[str, NodeInfo]) -> list[str]:
    """Names of the ONNX nodes whose calls ``body`` holds, in graph order, each once."""
    names: dict[str, None] = {}
    for node in post_order(body.outputs):
        found = lookup(table, getattr(node, "span", None)) if isinstance(node, Call) else None
        if found:
            names.setdefault(found[0])
    return list(names)


def _last_node(expr: Expr, table: dict[str, NodeInfo]) -> tuple[str, NodeInfo] | None:
    while isinstance(expr, Call):
        found = lookup(table, expr.span)
        if found:
            return found
        if expr.op.name not in _LAYOUT_OPS or not expr.args:
            return None
        expr = expr.args[0]
    return None


def stored_layout(kernel: tuple, model: tuple) -> str | None:
    """``""`` when a kernel output of shape ``kernel`` holds a tensor of shape ``model`` as is,
    ``"NCHW{c}c"`` when it holds the NCHW tensor blocked by ``c`` (channels maybe padded),
    None when neither."""
    if tuple(kernel) == tuple(model):
        return ""
    if len(kernel) == 5 and len(model) == 4 and all(isinstance(d, int) for d in kernel + model):
        n, cb, h, w, c = kernel
        if (n, h, w) == (model[0], model[2], model[3]) and (cb - 1) * c < model[1] <= cb * c:
            return f"NCHW{c}c"
    return None


def _output_tensor(call: PrimitiveCall, table: dict[str, NodeInfo]
                   ) -> tuple[str, str, str, tuple] | None:
    """(ONNX node, tensor name, stored layout, model shape) of ``call``'s output, or None."""
    found = _last_node(call.body.outputs[0], table)
    if found is None:
        return None
    out_type = call.checked_type
    matches = []
    for name, shape, dtype in found[1].outputs:
        layout = stored_layout(tuple(out_type.shape), tuple(shape))
        if layout is not None and dtype == out_type.dtype:
            matches.append((found[0], name, layout, tuple(shape)))
    return matches[0] if len(matches) == 1 else None


def kernel_attrs(func: Function) -> dict[int, dict[str, str]]:
    """Per kernel call of ``func`` (uid), the ``onnx_*`` attrs of its graph JSON node.

    ``onnx_nodes`` and ``onnx_op_types``: JSON lists (as strings, like every ``tvm_op`` attr)
    of the covered nodes' names and op types; ``onnx_output``: the ONNX tensor its output
    holds; with ``onnx_layout`` (e.g. ``"NCHW8c"``) and ``onnx_shape`` (JSON list) when it
    holds it in another layout than the model's. Empty when the importer left no table (a
    graph not imported from ONNX).
    """
    table: dict[str, NodeInfo] = func.attrs.get(ONNX_NODES) or {}
    if not table:
        return {}
    kernels = [(node, covered_nodes(node.body, table)) for node in post_order(func.outputs)
               if isinstance(node, (PrimitiveCall, FunctionCall))]
    last_cover = {name: node.uid for node, names in kernels for name in names}
    result: dict[int, dict[str, str]] = {}
    for node, names in kernels:
        if not names:
            continue
        attrs = result[node.uid] = {
            "onnx_nodes": json.dumps(names),
            "onnx_op_types": json.dumps([table[n].op_type for n in names])}
        out = _output_tensor(node, table) if isinstance(node, PrimitiveCall) else None
        if out is not None and last_cover[out[0]] == node.uid:
            attrs["onnx_output"] = out[1]
            if out[2]:
                attrs.update(onnx_layout=out[2], onnx_shape=json.dumps(list(out[3])))
    return result


__all__ = ["NodeInfo", "ONNX_NODES", "covered_nodes", "kernel_attrs", "lookup", "stored_layout"]
