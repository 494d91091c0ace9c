"""Reading a compiled library's graph JSON for the CLI: input/output names, shapes, dtypes.

Format: TVM's graph executor JSON (``nodes``, ``arg_nodes``, ``node_row_ptr``, ``heads``,
``attrs.shape``/``attrs.dltype`` per entry, Kiln's ``attrs.output_names``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kiln.errors import ModuleLoadError


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one graph input, param or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class GraphInfo:
    """What the CLI needs to know about a graph: inputs, params, outputs, op count."""

    inputs: list[TensorInfo]
    params: list[TensorInfo]
    outputs: list[TensorInfo]
    num_ops: int


def _entry_attr(attrs: dict, key: str) -> list:
    value = attrs.get(key)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], list)):
        raise ModuleLoadError(f"graph JSON has no attrs.{key} list")
    return value[1]


def graph_info(graph_json: str, param_names: set[str]) -> GraphInfo:
    """Parse a graph JSON into inputs (non-param arg nodes), params and outputs.

    Parameters
    ----------
    graph_json : str
        The library's ``get_graph_json()``.
    param_names : set of str
        Names bound as params (``get_graph_params()`` keys); other arg nodes are inputs.

    Returns
    -------
    GraphInfo

    Raises
    ------
    ModuleLoadError
        If the JSON is malformed.
    """
    try:
        g = json.loads(graph_json)
        nodes = g["nodes"]
        row_ptr = g.get("node_row_ptr") or list(range(len(nodes) + 1))
        shapes = _entry_attr(g["attrs"], "shape")
        dtypes = _entry_attr(g["attrs"], "dltype")
        names_attr = g["attrs"].get("output_names")
        out_names = names_attr[1] if isinstance(names_attr, list) and len(names_attr) == 2 \
            else []

        def info(nid: int, index: int, name: str) -> TensorInfo:
            eid = row_ptr[nid] + index
            return TensorInfo(name, tuple(int(d) for d in shapes[eid]), str(dtypes[eid]))

        inputs, params = [], []
        for nid in g["arg_nodes"]:
            name = nodes[nid]["name"]
            (params if name in param_names else inputs).append(info(nid, 0, name))
        outputs = []
        for k, head in enumerate(g["heads"]):
            nid, index = int(head[0]), int(head[1])
            name = out_names[k] if len(out_names) == len(g["heads"]) else f"output_{k}"
            outputs.append(info(nid, index, str(name)))
        num_ops = sum(1 for n in nodes if n.get("op") == "tvm_op")
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ModuleLoadError(f"malformed graph JSON: {type(err).__name__}: {err}") from None
    return GraphInfo(inputs, params, outputs, num_ops)
