"""``kiln.debug_executor``: the debug graph module — per-node time and per-node outputs (TVM's
``python/tvm/contrib/debugger/debug_executor.py`` and ``debug_result.py``).

Usage, on a fresh build or an exported library loaded back::

    lib = kiln.runtime.load_module("model.so")
    dbg = kiln.debug_executor.GraphModuleDebug(lib["debug_create"]("default", kiln.cpu()),
                                               dump_root="dump")
    report = dbg.run(x=x, repeat=10)   # times every node, writes dump/*.npy
    print(report.table())

The runtime side (timing node by node over the same prebuilt kernel calls as ``run``) is
``kiln.runtime.graph_executor.debug.GraphExecutorDebug``. Imports only ``kiln.runtime``.

**Kiln:** ``run`` returns the :class:`DebugReport` instead of printing it, and outputs are
dumped as one ``.npy`` per node output plus ``nodes.json`` (TVM writes ``output_tensors.params``
and a Chrome trace under ``_tvmdbg_device_CPU_0``).

May import: kiln.graph_executor, kiln.runtime (and kiln.errors).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.graph_executor import GraphModule
from kiln.runtime import Module, NDArray
from kiln.runtime.graph_executor.onnx_source import (
    OnnxSource,
    nodes_text,
    onnx_source,
    to_model_layout,
)

_DEBUG_FUNCTIONS = ("run_individual", "execute_node", "get_node_output", "get_op_nodes",
                    "get_graph_json")


@dataclass(frozen=True)
class NodeTime:
    """Measurements of one node.

    Attributes
    ----------
    nid : int
        Graph node id.
    name, func_name : str
        Node name and the kernel it calls.
    shapes, dtypes : tuple
        One per node output (the kernel's layout, e.g. NCHW8c).
    times_s : tuple of float
        Seconds per call, one per repeat.
    onnx : OnnxSource, optional
        The ONNX nodes the kernel covers; None for a library without them (docs/formats.md
        §4.1) or a kernel that covers none (a layout change of a graph input).
    input_shapes, input_dtypes : tuple
        Shapes and dtypes of the node's inputs, in the kernel's layout.
    """

    nid: int
    name: str
    func_name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    times_s: tuple[float, ...]
    onnx: OnnxSource | None = None
    input_shapes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()

    @property
    def model_shape(self) -> str:
        """The output shape in the model's terms: the ONNX tensor's shape, with the layout the
        kernel stores it in when that differs (``1x24x12x12 (NCHW8c)``)."""
        if self.onnx is not None and self.onnx.layout:
            return f"{_shape_text((self.onnx.shape,))} ({self.onnx.layout})"
        return _shape_text(self.shapes)

    @property
    def median_us(self) -> float:
        """Median time per call, microseconds."""
        return statistics.median(self.times_s) * 1e6

    @property
    def min_us(self) -> float:
        """Fastest time per call, microseconds."""
        return min(self.times_s) * 1e6


def _shape_text(shapes: tuple[tuple[int, ...], ...]) -> str:
    return ", ".join("x".join(map(str, s)) or "scalar" for s in shapes)


@dataclass
class DebugReport:
    """Per-node times of one profile, in graph order.

    Attributes
    ----------
    nodes : list of NodeTime
    number : int
        Calls per measurement.
    repeat : int
        Measurements per node.
    """

    nodes: list[NodeTime]
    number: int
    repeat: int

    @property
    def total_us(self) -> float:
        """Sum over nodes of the median time, microseconds."""
        return sum(n.median_us for n in self.nodes)

    def table(self, sort_by_time: bool = True, top: int | None = None) -> str:
        """The nodes as a text table: name, op (kernel), median and min time (us), % of the
        total, output shape (:attr:`NodeTime.model_shape`), and when the library records
        them the ONNX nodes each kernel covers (three names, then ``+N more``); slowest first
        when ``sort_by_time``; at most ``top`` rows."""
        rows = sorted(self.nodes, key=lambda n: -n.median_us) if sort_by_time else self.nodes
        shown = rows if top is None else rows[:top]
        total = self.total_us
        with_onnx = any(n.onnx is not None for n in self.nodes)
        header = ("Node Name", "Ops", "Time(us)", "Min(us)", "Time(%)", "Shape",
                  *(("ONNX nodes",) if with_onnx else ()))
        body = [(n.name, n.func_name, f"{n.median_us:.1f}", f"{n.min_us:.1f}",
                 f"{100 * n.median_us / total if total else 0.0:.1f}", n.model_shape,
                 *((nodes_text(n.onnx.nodes) if n.onnx else "",) if with_onnx else ()))
                for n in shown]
        footer = ("Total", "", f"{total:.1f}", "", "100.0", "", *(("",) if with_onnx else ()))
        table = [header, *body, footer]
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]

        def line(row: tuple[str, ...]) -> str:
            cells = [c.rjust(w) if 2 <= i <= 4 else c.ljust(w)
                     for i, (c, w) in enumerate(zip(row, widths))]
            return "  ".join(cells).rstrip()

        rule = "  ".join("-" * w for w in widths)
        out = [line(header), rule, *map(line, body)]
        if len(shown) < len(rows):
            out.append(f"... {len(rows) - len(shown)} more nodes")
        note = (f"{len(self.nodes)} nodes; time: median of {self.repeat} measurement(s) of "
                f"{self.number} call(s) each")
        out += [rule, line(footer), note]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"number", "repeat", "total_us", "nodes": [...]}``."""
        return {"number": self.number, "repeat": self.repeat, "total_us": self.total_us,
                "nodes": [{"nid": n.nid, "name": n.name, "func_name": n.func_name,
                           "shapes": [list(s) for s in n.shapes], "dtypes": list(n.dtypes),
                           "median_us": n.median_us, "min_us": n.min_us,
                           "times_us": [t * 1e6 for t in n.times_s], **_onnx_dict(n.onnx)}
                          for n in self.nodes]}


def _onnx_dict(source: OnnxSource | None) -> dict[str, Any]:
    if source is None:
        return {}
    return {"onnx_nodes": list(source.nodes), "onnx_op_types": list(source.op_types),
            "onnx_output": source.output}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80] or "node"


class GraphModuleDebug(GraphModule):
    """A :class:`~kiln.graph_executor.GraphModule` over a debug executor.

    Parameters
    ----------
    module : Module
        A debug executor: ``factory["debug_create"]("default", kiln.cpu())``, or
        ``kiln.graph_executor.create(graph_json, lib, debug=True).module``.
    dump_root : str or Path, optional
        Folder :meth:`run` writes the per-node outputs to (see :meth:`dump_outputs`).

    Raises
    ------
    KilnError
        ``module`` is not a debug executor; a graph JSON node with malformed ``onnx_*``
        attrs (docs/formats.md §4.1).

    Notes
    -----
    As every executor, use it from one thread at a time.
    """

    def __init__(self, module: Module, dump_root: str | Path | None = None):
        super().__init__(module)
        missing = [f for f in _DEBUG_FUNCTIONS if module.get_function(f) is None]
        if missing:
            raise KilnError(f"GraphModuleDebug needs a debug executor (factory 'debug_create' or "
                            f"graph_executor.create(..., debug=True)); module "
                            f"'{module.type_key}' lacks {', '.join(missing)}")
        self.dump_root = dump_root
        self.report: DebugReport | None = None
        self._nodes: list[dict[str, Any]] = module["get_op_nodes"]()
        graph = json.loads(module["get_graph_json"]())
        self._graph_nodes: list[dict[str, Any]] = graph["nodes"]
        self._sources: dict[int, OnnxSource | None] = {
            nid: onnx_source(node.get("attrs") or {}, f"node {nid} ({node['name']})")
            for nid, node in enumerate(self._graph_nodes)}
        self._nid_by_name: dict[str, int] = {}
        for nid, node in enumerate(self._graph_nodes):
            self._nid_by_name.setdefault(str(node["name"]), nid)

    def _nid(self, node: int | str) -> int:
        if isinstance(node, str):
            if node not in self._nid_by_name:
                raise KilnError(f"graph has no node named {node!r}")
            return self._nid_by_name[node]
        return node

    def run(self, number: int = 1, repeat: int = 1, **inputs: Any) -> DebugReport:
        """Set ``inputs`` (by name), time every node (:meth:`profile`), then, when the module
        has a ``dump_root``, write every node's output there (:meth:`dump_outputs`). Outputs
        are valid afterwards, as after a plain run.

        Returns
        -------
        DebugReport
            Also kept as :attr:`report`.

        Raises
        ------
        KilnError
            Bad inputs, ``number``/``repeat``, a kernel failure, an unwritable ``dump_root``.
        """
        if inputs:
            self.set_input(**inputs)
        report = self.profile(number, repeat)
        if self.dump_root is not None:
            self.dump_outputs(self.dump_root, report)
        return report

    def profile(self, number: int = 1, repeat: int = 1) -> DebugReport:
        """Time every node: ``repeat`` passes over the graph, each node measured over
        ``number`` calls right after the node before it ran.

        Raises
        ------
        KilnError
            ``number``/``repeat`` not positive integers; a kernel failure.
        """
        times = self.run_individual(number, repeat)
        self.report = DebugReport(
            [NodeTime(n["nid"], n["name"], n["func_name"], tuple(map(tuple, n["shapes"])),
                      tuple(n["dtypes"]), tuple(times[n["nid"]]), self._sources[n["nid"]],
                      tuple(map(tuple, n.get("input_shapes", ()))),
                      tuple(n.get("input_dtypes", ()))) for n in self._nodes],
            number, repeat)
        return self.report

    def onnx_source(self, node: int | str) -> OnnxSource | None:
        """The ONNX nodes kernel ``node`` (id or name) covers, from its graph JSON attrs;
        None for a library without them or a node that covers none."""
        return self._sources.get(self._nid(node))

    def run_individual(self, number: int = 1, repeat: int = 1) -> dict[int, list[float]]:
        """Node id → seconds per call, one per repeat (the runtime's ``run_individual``)."""
        return self.module["run_individual"](number, repeat)

    def execute_node(self, node: int | str) -> None:
        """Run the graph up to ``node`` (id or name)."""
        self.module["execute_node"](self._nid(node))

    def get_node_output(self, node: int | str, index: int = 0) -> NDArray:
        """A copy of output ``index`` of ``node`` (id or name) as last computed.

        Raises
        ------
        KilnError
            Unknown node; the node has not run or its storage was reused since (call
            :meth:`execute_node` first).
        """
        return self.module["get_node_output"](self._nid(node), index)

    def dump_outputs(self, dump_root: str | Path, report: DebugReport | None = None) -> Path:
        """Run the graph node by node and save every node's outputs, and the graph inputs.

        Writes ``<nid>_<name>_<k>.npy`` per output ``k`` as the kernel stores it (nid
        zero-padded to 4 digits, name with characters other than letters, digits, ``_.-``
        replaced by ``_``), ``graph.json`` and ``nodes.json`` (per node: nid, name, func_name,
        files, shapes, dtypes, the times of ``report`` when given, and ``onnx_nodes``,
        ``onnx_op_types``, ``onnx_output`` when the library records them). When it does,
        also ``onnx_tensors.npz``: the graph inputs and every kernel output that is an ONNX
        tensor, keyed by the ONNX tensor name and in the model's layout (NCHW, not NCHWc), to
        compare with onnxruntime's values of the same names.

        Returns
        -------
        Path
            ``dump_root``.

        Raises
        ------
        KilnError
            The folder cannot be created or written; a kernel failure; a kernel output whose
            shape does not fit the layout its ``onnx_*`` attrs record.
        """
        root = Path(dump_root)
        times = {n.nid: n for n in (report.nodes if report else [])}
        manifest: list[dict[str, Any]] = []
        tensors: dict[str, np.ndarray] = {}  # ONNX tensor name → value in the model's layout
        try:
            root.mkdir(parents=True, exist_ok=True)
            shapes, _ = self.get_input_info()
            for name in shapes:
                nid = self._nid_by_name[name]
                manifest.append(self._save(root, nid, "null", [self.get_input(name)]))
                tensors[name] = self.get_input(name).numpy()
            for node in self._nodes:
                nid = node["nid"]
                self.execute_node(nid)
                outs = [self.get_node_output(nid, k) for k in range(len(node["shapes"]))]
                entry = self._save(root, nid, node["func_name"], outs)
                if nid in times:
                    entry.update(median_us=times[nid].median_us, min_us=times[nid].min_us)
                source = self._sources[nid]
                entry.update(_onnx_dict(source))
                if source is not None and source.output is not None:
                    tensors[source.output] = to_model_layout(outs[0].numpy(), source)
                manifest.append(entry)
            (root / "graph.json").write_text(self.module["get_graph_json"]())
            (root / "nodes.json").write_text(json.dumps(manifest, indent=1))
            if any(s is not None for s in self._sources.values()):
                np.savez(root / "onnx_tensors.npz", **tensors)
        except OSError as err:
            raise KilnError(f"cannot write node outputs to {root}: {err.strerror or err}") \
                from None
        return root

    def _save(self, root: Path, nid: int, func_name: str, outs: list[NDArray]) -> dict[str, Any]:
        name = str(self._graph_nodes[nid]["name"])
        files = []
        for k, out in enumerate(outs):
            fname = f"{nid:04d}_{_safe(name)}_{k}.npy"
            np.save(root / fname, out.numpy())
            files.append(fname)
        return {"nid": nid, "name": name, "func_name": func_name, "files": files,
                "shapes": [list(o.shape) for o in outs], "dtypes": [o.dtype for o in outs]}


__all__ = ["DebugReport", "GraphModuleDebug", "NodeTime"]
