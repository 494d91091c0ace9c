"""Everything in a model the importer cannot convert, found before any conversion work, so one
error lists it all (onnxruntime names one op at a time; a user fixing a model wants the list).

A node is supported when it is in the default domain and its op type is control flow, has a
converter for the model's opset (:mod:`kiln.frontend.onnx.registry`), or has an ONNX function
body at that opset (:mod:`kiln.frontend.onnx.functions`); or when it is one of onnxruntime's
``com.microsoft`` ops Kiln writes as standard ops (:mod:`kiln.frontend.onnx.contrib`).
Subgraphs (If branches, Loop and Scan bodies) are walked too. What this cannot know before
converting (an attribute value or a shape a converter rejects) is still reported by the
converter itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import AttributeProto

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.contrib import MS_DOMAIN, has_contrib_body
from kiln.frontend.onnx.control_flow import CONTROL_FLOW_OPS
from kiln.frontend.onnx.functions import has_function_body
from kiln.frontend.onnx.registry import find_converter

DEFAULT_DOMAINS = ("", "ai.onnx")
#: node names shown per unsupported op before "and N more"
_SHOWN = 3


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs, depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _nodes(g)


def _supported(node: onnx.NodeProto, opset: int) -> bool:
    if node.domain == MS_DOMAIN:
        return has_contrib_body(node.op_type)
    return (node.op_type in CONTROL_FLOW_OPS or find_converter(node.op_type, opset) is not None
            or has_function_body(node.op_type, opset))


def unsupported_ops(graph: onnx.GraphProto, opset: int) -> dict[tuple[str, str], list[str]]:
    """``{(domain, op_type): [node names]}`` of every node the importer has no way to convert
    (domain ``""`` for the default one), in the order they first appear."""
    out: dict[tuple[str, str], list[str]] = {}
    for k, node in enumerate(_nodes(graph)):
        foreign = node.domain not in (*DEFAULT_DOMAINS, MS_DOMAIN)
        if foreign or not _supported(node, opset):
            domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
            names = out.setdefault((domain, node.op_type), [])
            name = node.name or f"{node.op_type}_{k}"
            if name not in names:  # a subgraph may be shared by an If's two branches
                names.append(name)
    return out


def check_supported(model: onnx.ModelProto, opset: int) -> None:
    """Raise one UnsupportedOpError listing every op of ``model`` the importer cannot convert
    (op type, domain, opset, the nodes that use it); nothing when all are supported."""
    missing = unsupported_ops(model.graph, opset)
    if not missing:
        return
    parts = []
    for (domain, op_type), nodes in missing.items():
        shown = ", ".join(f"'{n}'" for n in nodes[:_SHOWN])
        more = f" and {len(nodes) - _SHOWN} more" if len(nodes) > _SHOWN else ""
        where = f"domain '{domain}'" if domain else f"opset {opset}"
        parts.append(f"{op_type} (node{'s' if len(nodes) > 1 else ''} {shown}{more}, {where})")
    raise UnsupportedOpError(f"the ONNX model uses {len(missing)} op"
                             f"{'s' if len(missing) > 1 else ''} Kiln cannot convert: "
                             + "; ".join(parts))
