"""``JSONRuntimeModule`` (type_key ``kiln_json``): an external function shipped as a JSON graph
plus the names of its constants, run by a small interpreter (TVM's JSON runtime for DNNL and
TensorRT: src/runtime/contrib/json/json_runtime.h, json_node.h).

This is the shape of a BYOC backend whose runtime takes *a graph plus weights* (an accelerator
driver, a vendor inference library). The build side (``kiln.byoc.kiln_json``) serializes one
partitioned function into

- a graph JSON: ``{"nodes": [...], "arg_nodes": [...], "heads": [[nid, index, 0], ...],
  "node_row_ptr": [...]}``, where a node is ``{"op": "input", "name", "attrs": {"shape",
  "dtype"}}`` (a function argument), ``{"op": "const", "name", "attrs": {...}}`` (a weight,
  by name) or ``{"op": "kernel", "name": <graph op or composite>, "inputs": [[nid, index, 0],
  ...], "attrs": {<op attrs>, "shape": [[...]], "dtype": [...]}}``;
- the constant names (``<symbol>_const_<i>``); the values travel through the const loader
  (``const_loader_module``), which calls ``__init_<symbol>`` with them before first use.

Functions: ``get_symbol()``, ``get_const_vars()``, ``__init_<symbol>(*constants)``, and
``<symbol>(*inputs, *outputs)`` (NDArrays, as the graph executor passes them). Kernels are
numpy functions looked up by node name in ``json_kernels`` (a vendor registers its own).

Serialized form (as TVM's ``JSONRuntimeBase::SaveToBinary``)::

    string symbol | string graph_json | vec<string> const_names
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime.binary_module import register_module_loader
from kiln.runtime.contrib.json.json_kernels import Kernel, get_json_kernel
from kiln.runtime.module import Module
from kiln.runtime.ndarray import NDArray
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.stream import StreamReader, StreamWriter

TYPE_KEY = "kiln_json"
#: dtypes the interpreter accepts in node attrs
_DTYPES = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}


@dataclass
class _Node:
    op: str
    name: str
    inputs: list[tuple[int, int]]
    attrs: dict[str, Any]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    kernel: Kernel | None = None


def _fail(symbol: str, msg: str) -> ModuleLoadError:
    return ModuleLoadError(f"{TYPE_KEY} module {symbol!r}: {msg}")


def _parse(symbol: str, graph_json: str) -> tuple[list[_Node], list[int], list[tuple[int, int]]]:
    """Validate the graph JSON; returns (nodes, arg node ids, heads)."""
    try:
        g = json.loads(graph_json)
    except (ValueError, RecursionError) as err:
        raise _fail(symbol, f"graph JSON is not valid JSON: {err}") from None
    if not isinstance(g, dict) or not isinstance(g.get("nodes"), list):
        raise _fail(symbol, "graph JSON has no 'nodes' list")
    nodes: list[_Node] = []
    for nid, raw in enumerate(g["nodes"]):
        where = f"node {nid}"
        if not isinstance(raw, dict) or raw.get("op") not in ("input", "const", "kernel"):
            raise _fail(symbol, f"{where}: 'op' must be input, const or kernel")
        attrs = raw.get("attrs", {})
        name = raw.get("name")
        if not isinstance(name, str) or not isinstance(attrs, dict):
            raise _fail(symbol, f"{where}: needs a string 'name' and an 'attrs' object")
        shapes, dtypes = attrs.get("shape"), attrs.get("dtype")
        if (not isinstance(shapes, list) or not isinstance(dtypes, list) or not shapes
                or len(shapes) != len(dtypes)
                or not all(isinstance(s, list) and all(isinstance(d, int) and 0 <= d < 2**40
                                                       for d in s) for s in shapes)
                or not all(isinstance(d, str) and d in _DTYPES for d in dtypes)):
            raise _fail(symbol, f"{where} ({name}): 'shape' and 'dtype' must list each "
                                "output's shape and a supported dtype")
        inputs: list[tuple[int, int]] = []
        for e in raw.get("inputs", []):
            if (not isinstance(e, list) or len(e) != 3 or not all(isinstance(v, int) for v in e)
                    or not 0 <= e[0] < nid or not 0 <= e[1] < len(nodes[e[0]].shapes)):
                raise _fail(symbol, f"{where} ({name}): input {e!r} is not an earlier node's "
                                    "output")
            inputs.append((e[0], e[1]))
        node = _Node(raw["op"], name, inputs, attrs, [tuple(s) for s in shapes], list(dtypes))
        if node.op == "kernel":
            node.kernel = get_json_kernel(name)
            if node.kernel is None:
                raise _fail(symbol, f"{where}: no kiln_json kernel for {name!r} (register one "
                                    "with kiln.runtime.register_json_kernel)")
        elif inputs:
            raise _fail(symbol, f"{where}: an {node.op} node has no inputs")
        nodes.append(node)
    args = g.get("arg_nodes", [])
    heads_raw = g.get("heads", [])
    if (not isinstance(args, list) or not all(isinstance(a, int) and 0 <= a < len(nodes)
                                              and nodes[a].op == "input" for a in args)):
        raise _fail(symbol, "'arg_nodes' must list input nodes")
    heads: list[tuple[int, int]] = []
    for h in heads_raw if isinstance(heads_raw, list) else [None]:
        if (not isinstance(h, list) or len(h) != 3 or not all(isinstance(v, int) for v in h)
                or not 0 <= h[0] < len(nodes) or not 0 <= h[1] < len(nodes[h[0]].shapes)):
            raise _fail(symbol, f"head {h!r} is not a node output")
        heads.append((h[0], h[1]))
    if not heads:
        raise _fail(symbol, "the graph has no outputs ('heads')")
    return nodes, list(args), heads


class JSONRuntimeModule(Module):
    """One external function as a JSON graph run by the ``kiln_json`` interpreter.

    Parameters
    ----------
    symbol : str
        The function's ``global_symbol`` (the graph executor calls it by this name).
    graph_json : str
        The graph (module doc); validated now.
    const_names : list of str
        The ``const`` nodes' names, in the order ``__init_<symbol>`` receives their values.

    Raises
    ------
    ModuleLoadError
        A malformed graph, a kernel name with no registered kernel, a ``const`` node not in
        ``const_names``.
    """

    type_key = TYPE_KEY
    is_binary_serializable = True

    def __init__(self, symbol: str, graph_json: str, const_names: Sequence[str]):
        super().__init__()
        self.symbol = str(symbol)
        self.graph_json = graph_json
        self.const_names = [str(c) for c in const_names]
        self._nodes, self._args, self._heads = _parse(self.symbol, graph_json)
        unknown = [n.name for n in self._nodes if n.op == "const"
                   and n.name not in self.const_names]
        if unknown:
            raise _fail(self.symbol, f"const nodes {unknown} are not among its constants")
        self._consts: dict[str, np.ndarray] | None = None if self.const_names else {}
        self._lock = threading.Lock()
        # Intermediate values are dropped after their last reader (whole-model regions).
        last: dict[tuple[int, int], int] = {}
        for nid, node in enumerate(self._nodes):
            for e in node.inputs:
                last[e] = nid
        self._release: dict[int, list[tuple[int, int]]] = {}
        for e, nid in last.items():
            if self._nodes[e[0]].op == "kernel" and e not in self._heads:
                self._release.setdefault(nid, []).append(e)

    # -- functions
    def _init(self, *arrays: NDArray) -> int:
        if len(arrays) != len(self.const_names):
            raise KilnError(f"{TYPE_KEY} {self.symbol}: __init_{self.symbol} got "
                            f"{len(arrays)} constants, expects {len(self.const_names)}")
        consts = {}
        for name, arr in zip(self.const_names, arrays):
            value = arr._arr if isinstance(arr, NDArray) else np.asarray(arr)
            consts[name] = value  # the const loader's arrays, read in place
        for n in self._nodes:
            if n.op == "const":
                v = consts[n.name]
                if v.shape != n.shapes[0] or str(v.dtype) != n.dtypes[0]:
                    raise KilnError(f"{TYPE_KEY} {self.symbol}: constant {n.name} is "
                                    f"{v.shape} {v.dtype}, the graph says {n.shapes[0]} "
                                    f"{n.dtypes[0]}")
        with self._lock:
            self._consts = consts
        return 0

    def run(self, *tensors: NDArray) -> None:
        """Run the graph: ``tensors`` are the inputs (``arg_nodes`` order) then the outputs.

        Raises
        ------
        KilnError
            Not initialized with its constants, wrong argument count, shape or dtype.
        """
        if self._consts is None:
            raise KilnError(f"{TYPE_KEY} {self.symbol}: called before __init_{self.symbol} "
                            "gave it its constants (load it under a const loader)")
        n_in, n_out = len(self._args), len(self._heads)
        if len(tensors) != n_in + n_out:
            raise KilnError(f"{TYPE_KEY} {self.symbol}: expects {n_in} inputs and {n_out} "
                            f"outputs, got {len(tensors)} tensors")
        arrays = [t._arr if isinstance(t, NDArray) else np.asarray(t) for t in tensors]
        values: dict[tuple[int, int], np.ndarray] = {}
        for k, nid in enumerate(self._args):
            values[(nid, 0)] = self._checked(arrays[k], self._nodes[nid], f"input {k}")
        outputs = {h: arrays[n_in + k] for k, h in enumerate(self._heads)}
        for k, h in enumerate(self._heads):
            node = self._nodes[h[0]]
            self._checked(outputs[h], node, f"output {k}", h[1])
            if not outputs[h].flags.c_contiguous:
                raise KilnError(f"{TYPE_KEY} {self.symbol}: output {k} is not contiguous")
        for nid, node in enumerate(self._nodes):
            if node.op == "const":
                values[(nid, 0)] = self._consts[node.name]
            elif node.op == "kernel":
                ins = [values[e] for e in node.inputs]
                # A node with several outputs is not among the built-in kernels: one output.
                out = outputs.get((nid, 0))
                if out is None:
                    out = np.empty(node.shapes[0], node.dtypes[0])
                assert node.kernel is not None, "kernel resolved at load"
                node.kernel(ins, node.attrs, out)
                values[(nid, 0)] = out
                for e in self._release.get(nid, ()):
                    del values[e]
            elif (nid, 0) not in values:
                raise KilnError(f"{TYPE_KEY} {self.symbol}: input node {nid} is not an argument")
        for k, h in enumerate(self._heads):  # a head listed twice fills both outputs
            dst = arrays[n_in + k]
            if values[h] is not dst:
                np.copyto(dst, values[h])

    def _checked(self, arr: np.ndarray, node: _Node, what: str, index: int = 0) -> np.ndarray:
        if arr.shape != node.shapes[index] or str(arr.dtype) != node.dtypes[index]:
            raise KilnError(f"{TYPE_KEY} {self.symbol}: {what} is {arr.shape} {arr.dtype}, "
                            f"expected {node.shapes[index]} {node.dtypes[index]}")
        return arr

    def _functions(self) -> dict[str, Any]:
        return {"get_symbol": lambda: self.symbol,
                "get_const_vars": lambda: list(self.const_names),
                f"__init_{self.symbol}": self._init,
                self.symbol: self.run}

    def _get_own_function(self, name: str) -> PackedFunc | None:
        fn = self._functions().get(name)
        return PackedFunc(fn, name) if fn is not None else None

    def list_function_names(self) -> list[str]:
        return list(self._functions())

    # -- serialization
    def save_to_binary(self) -> bytes:
        w = StreamWriter()
        w.string(self.symbol)
        w.string(self.graph_json)
        w.vec_str(self.const_names)
        return w.getvalue()

    @staticmethod
    def load_from_binary(data: bytes) -> JSONRuntimeModule:
        """Inverse of :meth:`save_to_binary` (``runtime.module.loadbinary_kiln_json``).

        Raises
        ------
        ModuleLoadError
            Truncated or corrupt bytes, or an invalid graph.
        """
        r = StreamReader(data, f"{TYPE_KEY} module")
        symbol = r.string("symbol")
        graph_json = r.string("graph_json")
        const_names = r.vec_str("const_names")
        if r.remaining:
            raise r.error(f"{r.remaining} unexpected trailing bytes")
        return JSONRuntimeModule(symbol, graph_json, const_names)

    def __repr__(self) -> str:
        return (f"<kiln.runtime.JSONRuntimeModule {self.symbol!r} nodes={len(self._nodes)} "
                f"constants={len(self.const_names)}>")


register_module_loader(TYPE_KEY, JSONRuntimeModule.load_from_binary, override=True)

__all__ = ["JSONRuntimeModule"]
