"""ONNX ops defined as functions: expand a node into its function body (ONNX's own definition).

Many ONNX ops (Attention, RMSNormalization, NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss, Celu, ...) have a *function body* in their schema: a subgraph of
simpler ops that defines them, possibly built for the node's attributes and input types (a
"context-dependent" function). For an op without a converter the importer converts that body
instead, the way onnxruntime inlines functions. Names inside the body get a per-node prefix;
attribute references (``ref_attr_name``) take the node's attribute, else the schema default.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto, defs, helper

from kiln.relay.graph import TensorType


def expand_function(node: NodeProto, opset: int, input_types: list[TensorType | None],
                    prefix: str) -> tuple[list[NodeProto], int] | None:
    """The nodes of ``node``'s function body at ``opset`` with names renamed into the graph,
    and the default-domain opset the body is written for; None when the op has no function.

    Parameters
    ----------
    node : the node to expand (default domain).
    opset : the model's default-domain opset.
    input_types : the type of each of ``node``'s inputs (None for an omitted one); needed by
        context-dependent functions.
    prefix : prepended to every name internal to the body (must be unique per node).
    """
    try:
        schema = defs.get_schema(node.op_type, opset, domain=node.domain)
    except defs.SchemaError:
        return None
    body = _function_body(schema, node, opset, input_types)
    if body is None:
        return None
    attrs = {a.name: a for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in attrs and attr.default_value.name:
            attrs[name] = attr.default_value
    body_opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")),
                      opset)
    rename = _renamer(node, body, prefix)
    nodes = [_instantiate(n, rename, attrs) for n in body.node]
    for k, n in enumerate(nodes):
        n.name = prefix + (n.name or f"{n.op_type}_{k}")
    return nodes, body_opset


def has_function_body(op_type: str, opset: int) -> bool:
    """Whether the default-domain op ``op_type`` has an ONNX function body (plain or
    context-dependent) at ``opset``: what :func:`expand_function` can expand, short of a
    context-dependent builder that rejects the node."""
    try:
        schema = defs.get_schema(op_type, opset)
    except defs.SchemaError:
        return False
    return any(v <= opset for v in [*schema.function_opset_versions,
                                    *schema.context_dependent_function_opset_versions])


def _function_body(schema: defs.OpSchema, node: NodeProto, opset: int,
                   input_types: list[TensorType | None]) -> FunctionProto | None:
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if versions:
        body = FunctionProto()
        body.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        return body
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not versions:
        return None
    types = [_type_proto(t).SerializeToString() for t in input_types]
    try:
        raw = schema.get_context_dependent_function_with_opset_version(
            max(versions), node.SerializeToString(), types)
    except Exception:  # noqa: BLE001 - the C++ builder rejects this node (its error types vary)
        return None
    body = FunctionProto()
    body.ParseFromString(raw)
    return body if body.node else None


def _type_proto(t: TensorType | None) -> TypeProto:
    if t is None:
        return TypeProto()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))
    return helper.make_tensor_type_proto(elem, t.shape)


def _renamer(node: NodeProto, body: FunctionProto, prefix: str):
    names = {formal: (node.input[k] if k < len(node.input) else "")
             for k, formal in enumerate(body.input)}
    for k, formal in enumerate(body.output):
        if k < len(node.output) and node.output[k]:
            names[formal] = node.output[k]

    def rename(name: str) -> str:
        if name in names:
            return names[name]
        return prefix + name if name else ""

    return rename


def _instantiate(inner: NodeProto, rename, attrs: dict[str, AttributeProto]) -> NodeProto:
    out = NodeProto()
    out.CopyFrom(inner)
    del out.input[:]
    del out.output[:]
    del out.attribute[:]
    out.input.extend(rename(n) for n in inner.input)
    out.output.extend(rename(n) for n in inner.output)
    for a in inner.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name not in attrs:
                continue  # an optional attribute the node leaves unset
            bound = AttributeProto()
            bound.CopyFrom(attrs[a.ref_attr_name])
            bound.name = a.name
            out.attribute.append(bound)
        elif a.type == AttributeProto.GRAPH:
            copy = AttributeProto()
            copy.CopyFrom(a)
            _rename_subgraph(copy.g, rename, attrs)
            out.attribute.append(copy)
        else:
            out.attribute.append(a)
    return out


def _rename_subgraph(graph: GraphProto, rename, attrs: dict[str, AttributeProto]) -> None:
    """Rename a body's subgraph in place: its own inputs, outputs and initializers and every
    name it uses go through ``rename`` (outer references reach the renamed body values)."""
    for v in [*graph.input, *graph.output, *graph.initializer]:
        v.name = rename(v.name)
    nodes = [_instantiate(n, rename, attrs) for n in graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
