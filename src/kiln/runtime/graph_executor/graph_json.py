"""Parse and validate the graph executor's JSON (TVM's ``GraphExecutor::Load``,
src/runtime/graph_executor/graph_executor.h; docs/formats.md §4).

Everything the executor later indexes is checked here, so a malformed graph fails with a
:class:`ModuleLoadError` naming the node or attribute instead of an IndexError mid-run.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import ModuleLoadError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import checked_nbytes

_DTYPE_ALIASES = {"uint1": "bool"}  # classic TVM's name for bool


@dataclass
class Node:
    op: str
    name: str
    inputs: list[tuple[int, int]]  # (node id, output index)
    attrs: dict[str, Any] = field(default_factory=dict)
    num_outputs: int = 1

    @property
    def func_name(self) -> str:
        return str(self.attrs.get("func_name", ""))


@dataclass
class Graph:
    nodes: list[Node]
    arg_nodes: list[int]
    heads: list[tuple[int, int]]
    node_row_ptr: list[int]
    dltype: list[str]
    storage_id: list[int]
    shape: list[tuple[int, ...]]
    device_index: list[int]
    attrs: dict[str, Any]

    def entry_id(self, nid: int, index: int = 0) -> int:
        return self.node_row_ptr[nid] + index

    @property
    def num_entries(self) -> int:
        return self.node_row_ptr[-1]


def _fail(msg: str) -> ModuleLoadError:
    return ModuleLoadError(f"graph JSON: {msg}")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise _fail(f"{what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):  # tvm_op attrs are strings
        try:
            return int(value)
        except ValueError:
            pass
    raise _fail(f"{what} must be an integer, got {value!r}")


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(f"{what} must be a list, got {type(value).__name__}")
    return value


def _entry_ref(value: Any, what: str) -> tuple[int, int]:
    ref = _list(value, what)
    if len(ref) not in (2, 3):
        raise _fail(f"{what} must be [node_id, index(, version)], got {value!r}")
    return _int(ref[0], what), _int(ref[1], what)


def _typed_attr(attrs: dict[str, Any], key: str, kind: str, n: int, required: bool) -> list[Any]:
    if key not in attrs:
        if required:
            raise _fail(f"attrs.{key} is missing")
        return []
    value = _list(attrs[key], f"attrs.{key}")
    if len(value) != 2 or value[0] != kind:
        raise _fail(f'attrs.{key} must be ["{kind}", [...]], got {str(value)[:80]}')
    items = _list(value[1], f"attrs.{key}[1]")
    if len(items) != n:
        raise _fail(f"attrs.{key} has {len(items)} items but the graph has {n} entries")
    return items


def parse_graph(text: str | bytes) -> Graph:
    """Parse and validate graph JSON text.

    Returns
    -------
    Graph

    Raises
    ------
    ModuleLoadError
        For invalid JSON (also: nested deeper than Python's recursion limit, integers of more
        than 4300 digits), missing keys, wrong types, references to unknown nodes or entries
        (inputs must refer to earlier nodes), attribute lists of the wrong length, dltypes
        other than the runtime's dtype names (and TVM's ``uint1`` for bool), negative storage
        ids, and shapes that are negative, have more than 64 dimensions or more bytes than
        any array can have (:func:`kiln.runtime.ndarray.checked_nbytes`). Whether the
        storage fits in memory is checked by :func:`storage_pool_bytes`.
    """
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError: ValueError
        raise _fail(f"not valid JSON: {str(err)[:200]}") from None
    try:
        return _validate(doc)
    except RecursionError:  # repr() of a value nested almost as deep as json allows
        raise _fail("a value is nested too deeply") from None


def _validate(doc: Any) -> Graph:
    if not isinstance(doc, dict):
        raise _fail(f"top level must be an object, got {type(doc).__name__}")
    for key in ("nodes", "arg_nodes", "heads", "attrs"):
        if key not in doc:
            raise _fail(f"missing key {key!r}")
    nodes: list[Node] = []
    for nid, raw in enumerate(_list(doc["nodes"], "nodes")):
        if not isinstance(raw, dict) or "op" not in raw or "name" not in raw:
            raise _fail(f"node {nid} must be an object with 'op' and 'name'")
        name = str(raw["name"])
        where = f"node {nid} ({name})"
        attrs = raw.get("attrs", {}) or {}
        if not isinstance(attrs, dict):
            raise _fail(f"{where}: attrs must be an object")
        inputs = [_entry_ref(x, f"{where} input {k}")
                  for k, x in enumerate(_list(raw.get("inputs", []), f"{where} inputs"))]
        node = Node(str(raw["op"]), name, inputs, dict(attrs))
        if node.op == "tvm_op":
            if "func_name" not in attrs:
                raise _fail(f"{where}: tvm_op without attrs.func_name")
            node.num_outputs = _int(attrs.get("num_outputs", 1), f"{where} num_outputs")
            n_in = _int(attrs.get("num_inputs", len(inputs)), f"{where} num_inputs")
            if n_in != len(inputs):
                raise _fail(f"{where}: num_inputs is {n_in} but it lists {len(inputs)} inputs")
            if node.num_outputs < 1:
                raise _fail(f"{where}: num_outputs must be >= 1")
        elif node.op == "null":
            if inputs:
                raise _fail(f"{where}: a null (input) node cannot have inputs")
        else:
            raise _fail(f"{where}: unknown op {node.op!r} (expected 'null' or 'tvm_op')")
        for src, idx in inputs:
            if not 0 <= src < nid:
                raise _fail(f"{where}: input refers to node {src}, which is not an earlier node")
            if not 0 <= idx < nodes[src].num_outputs:
                raise _fail(f"{where}: input refers to output {idx} of node {src} "
                            f"({nodes[src].name}), which has {nodes[src].num_outputs}")
        nodes.append(node)
    row_ptr = [0]
    for node in nodes:
        row_ptr.append(row_ptr[-1] + node.num_outputs)
    if "node_row_ptr" in doc:
        given = [_int(v, "node_row_ptr") for v in _list(doc["node_row_ptr"], "node_row_ptr")]
        if given != row_ptr:
            raise _fail(f"node_row_ptr {given[:10]} does not match the nodes' outputs "
                        f"{row_ptr[:10]}")
    n_entries = row_ptr[-1]
    arg_nodes = [_int(v, "arg_nodes") for v in _list(doc["arg_nodes"], "arg_nodes")]
    for nid in arg_nodes:
        if not 0 <= nid < len(nodes) or nodes[nid].op != "null":
            raise _fail(f"arg_nodes lists {nid}, which is not a null node")
    heads = [_entry_ref(h, f"heads[{k}]") for k, h in enumerate(_list(doc["heads"], "heads"))]
    for nid, idx in heads:
        if not 0 <= nid < len(nodes) or not 0 <= idx < nodes[nid].num_outputs:
            raise _fail(f"heads refers to output {idx} of node {nid}, which does not exist")
    attrs = doc["attrs"]
    if not isinstance(attrs, dict):
        raise _fail("attrs must be an object")
    dltype = []
    for eid, d in enumerate(_typed_attr(attrs, "dltype", "list_str", n_entries, True)):
        # TVM's dtype strings exactly (no numpy spellings such as "f4" or ">f4")
        name = _DTYPE_ALIASES.get(d, d) if isinstance(d, str) else None
        if name not in C.SUPPORTED_DTYPES:
            raise _fail(f"entry {eid}: unsupported dltype {str(d)[:40]!r} (supported: "
                        f"{', '.join(C.SUPPORTED_DTYPES)}, uint1)")
        dltype.append(name)
    storage = [_int(s, f"storage_id[{eid}]")
               for eid, s in enumerate(_typed_attr(attrs, "storage_id", "list_int", n_entries,
                                                    True))]
    if any(s < 0 for s in storage):
        raise _fail("storage_id values must be >= 0")
    shapes = []
    for eid, s in enumerate(_typed_attr(attrs, "shape", "list_shape", n_entries, True)):
        shp = tuple(_int(d, f"shape[{eid}]") for d in _list(s, f"shape[{eid}]"))
        if any(d < 0 for d in shp):
            raise _fail(f"entry {eid}: negative shape {shp}")
        try:
            checked_nbytes(shp, np.dtype(dltype[eid]).itemsize)
        except ShapeError as err:
            raise _fail(f"entry {eid}: {err}") from None
        shapes.append(shp)
    devices = [_int(d, f"device_index[{eid}]") for eid, d in
               enumerate(_typed_attr(attrs, "device_index", "list_int", n_entries, False))]
    return Graph(nodes, arg_nodes, heads, row_ptr, dltype, storage, shapes,
                 devices or [C.kDLCPU] * n_entries, attrs)


def entry_nbytes(graph: Graph, eid: int) -> int:
    """Bytes of entry ``eid`` (shape × dtype size; Python ints, no overflow)."""
    return math.prod(graph.shape[eid]) * np.dtype(graph.dltype[eid]).itemsize


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def storage_pool_bytes(graph: Graph, limit: int | None = None) -> dict[int, int]:
    """The executor's storage plan: bytes of each pool (``storage_id`` → the largest entry
    sharing it; TVM's SetupStorage), checked *before* anything is allocated.

    Parameters
    ----------
    graph : Graph
    limit : int, optional
        Most bytes the pools may take together; default: :func:`memory_bytes`.

    Raises
    ------
    ModuleLoadError
        If the pools together need more than ``limit`` bytes (naming the largest entry), so a
        corrupt or foreign graph asking for terabytes fails before any allocation.
    """
    pools: dict[int, int] = {}
    for eid in range(graph.num_entries):
        sid = graph.storage_id[eid]
        pools[sid] = max(pools.get(sid, 0), entry_nbytes(graph, eid))
    limit = memory_bytes() if limit is None else limit
    total = sum(pools.values())
    if limit is not None and total > limit:
        big = max(range(graph.num_entries), key=lambda e: entry_nbytes(graph, e))
        raise _fail(f"its storage needs {total} bytes but this machine has {limit} bytes of "
                    f"memory (largest: entry {big}, shape {graph.shape[big]} of "
                    f"{graph.dltype[big]})")
    return pools
