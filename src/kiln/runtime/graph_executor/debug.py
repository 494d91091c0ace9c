"""The debug graph executor: per-node timing and per-node outputs (TVM's ``GraphExecutorDebug``,
src/runtime/graph_executor/debug/graph_executor_debug.cc).

It is a :class:`GraphExecutor` (same storage, same prebuilt kernel calls, so it times exactly
what ``run`` runs, on an exported and re-loaded library as well as a fresh build) with extra
functions: ``run_individual``, ``run_individual_node``, ``execute_node``, ``get_node_output``,
``get_op_nodes``, ``get_graph_json``. The user-facing side (report table, dumping outputs to a
folder) is ``kiln.debug_executor.GraphModuleDebug``.

**Kiln:** TVM's ``RunIndividual`` times each node after one warm-up run, when later nodes may
already have overwritten its inputs (the memory plan reuses storage). Here each repeat walks the
nodes in graph order and times node *i* right after node *i-1* ran, so every node is timed on
the inputs the graph really gives it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.module import Module
from kiln.runtime.ndarray import Device, NDArray, array


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise KilnError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


class GraphExecutorDebug(GraphExecutor):
    """A graph executor that can run and time node by node.

    Parameters
    ----------
    graph_json, lib, device, params, copy_params
        As :class:`GraphExecutor`.

    Raises
    ------
    ModuleLoadError
        Malformed graph JSON.
    KilnError
        As :class:`GraphExecutor`.

    Notes
    -----
    Node indices are graph node ids (positions in the JSON ``nodes`` list), as in TVM. Only
    ``tvm_op`` nodes with a kernel (not ``__nop``) run and are timed. Threads: as
    :class:`GraphExecutor`, one thread at a time per executor.
    """

    type_key = "GraphExecutorDebug"

    def __init__(self, graph_json: str, lib: Module, device: Device | None = None,
                 params: Mapping[str, NDArray | np.ndarray] | None = None,
                 copy_params: bool = True):
        super().__init__(graph_json, lib, device, params, copy_params)
        self.graph_json = graph_json
        self._last_executed = -1  # position in _op_execs of the last op run by execute_node
        # ops that write storage they read (in place): calling them twice in a row is not
        # calling them once, so repeated calls are followed by a clean run
        g = self.graph
        self._in_place = {
            nid for nid in self._op_nids
            if {g.storage_id[g.entry_id(nid, k)] for k in range(g.nodes[nid].num_outputs)}
            & {g.storage_id[g.entry_id(s, i)] for s, i in g.nodes[nid].inputs}}
        self._functions.update({
            "run_individual": self.run_individual,
            "run_individual_node": self.run_individual_node,
            "execute_node": self.execute_node,
            "get_node_output": self.get_node_output,
            "get_op_nodes": self.get_op_nodes,
            "get_graph_json": lambda: self.graph_json,
        })

    # -- node bookkeeping
    def _position(self, nid: int) -> int:
        """Index in ``_op_execs`` of the last op at or before node ``nid`` (-1: none)."""
        if isinstance(nid, bool) or not isinstance(nid, (int, np.integer)) or \
                not 0 <= nid < len(self.graph.nodes):
            raise KilnError(f"node index {nid!r} out of range: the graph has "
                            f"{len(self.graph.nodes)} nodes")
        return bisect.bisect_right(self._op_nids, int(nid)) - 1

    def get_op_nodes(self) -> list[dict[str, Any]]:
        """The nodes that run, in order: ``{"nid", "name", "func_name", "shapes", "dtypes",
        "input_shapes", "input_dtypes"}`` (one shape and dtype per output and per input)."""
        g = self.graph
        out = []
        for nid in self._op_nids:
            node = g.nodes[nid]
            eids = [g.entry_id(nid, k) for k in range(node.num_outputs)]
            out.append({"nid": nid, "name": node.name, "func_name": node.func_name,
                        "shapes": [g.shape[e] for e in eids],
                        "dtypes": [g.dltype[e] for e in eids],
                        "input_shapes": [g.shape[g.entry_id(n, k)] for n, k in node.inputs],
                        "input_dtypes": [g.dltype[g.entry_id(n, k)] for n, k in node.inputs]})
        return out

    def _run_ops(self, start: int, stop: int) -> None:
        """Run ops ``start..stop`` (positions, inclusive), with the run's copies at the ends."""
        if start == 0:
            self._run_prologue()
        for op in self._op_execs[start:stop + 1]:
            op()
        if stop == len(self._op_execs) - 1:
            self._run_epilogue()
        self._last_executed = stop

    def run(self) -> None:
        super().run()
        self._last_executed = len(self._op_execs) - 1

    # -- TVM's debug functions
    def execute_node(self, nid: int) -> None:
        """Run the graph up to node ``nid`` (TVM's ``execute_node``): from the node after the
        last one executed, or from the start when ``nid`` is not after it.

        Raises
        ------
        KilnError
            ``nid`` out of range, or a kernel failure.
        """
        pos = self._position(nid)
        if pos < 0 or pos == self._last_executed:
            return
        start = self._last_executed + 1 if pos > self._last_executed else 0
        self._run_ops(start, pos)

    def get_node_output(self, nid: int, index: int = 0) -> NDArray:
        """A copy of output ``index`` of node ``nid`` as last computed.

        Raises
        ------
        KilnError
            ``nid`` or ``index`` out of range; the node has not run yet, or a later node has
            since reused its storage (call ``execute_node(nid)`` first).
        """
        pos = self._position(nid)
        node = self.graph.nodes[nid]
        if not 0 <= index < node.num_outputs:
            raise KilnError(f"node {nid} ({node.name}) has {node.num_outputs} outputs, "
                            f"not {index + 1}")
        eid = self.graph.entry_id(nid, index)
        if node.op != "null":
            if pos > self._last_executed or (
                    node.func_name != "__nop" and self._op_nids[pos] != nid):
                raise KilnError(f"node {nid} ({node.name}) has not been executed yet; call "
                                f"execute_node({nid}) first")
            sid = self.graph.storage_id[eid]
            for later in range(pos + 1, self._last_executed + 1):
                lnid = self._op_nids[later]
                for k in range(self.graph.nodes[lnid].num_outputs):
                    other = self.graph.entry_id(lnid, k)
                    if other != eid and self.graph.storage_id[other] == sid:
                        raise KilnError(
                            f"node {nid} ({node.name}): its output was overwritten by node "
                            f"{lnid} ({self.graph.nodes[lnid].name}), which reuses its storage; "
                            f"call execute_node({nid}) first")
        return array(self._value(eid))

    def run_individual(self, number: int = 1, repeat: int = 1,
                       min_repeat_ms: int = 0, clock=None) -> dict[int, list[float]]:
        """Time every node (TVM's ``run_individual``).

        Each of ``repeat`` passes runs the whole graph in order; node *i* is timed over
        ``number`` consecutive calls right after node *i-1* ran.

        Parameters
        ----------
        number : int
            Calls per measurement (the measurement is their mean).
        repeat : int
            Measurements per node.
        min_repeat_ms : int
            Ignored (TVM compatibility: Kiln does not grow ``number`` to a minimum time).
        clock : callable, optional
            Seconds now (default :func:`time.perf_counter`; the tuner passes
            :func:`time.thread_time` when kernels run on the calling thread alone).

        Returns
        -------
        dict of int to list of float
            Node id → ``repeat`` times in **seconds** per call, in graph order. After the call
            the outputs are those of a run (with ``number > 1`` and nodes that compute in
            place, one more plain run is made to restore them).

        Raises
        ------
        KilnError
            ``number`` or ``repeat`` not a positive integer, or a kernel failure.
        """
        number = _positive(number, "number")
        repeat = _positive(repeat, "repeat")
        del min_repeat_ms
        times: dict[int, list[float]] = {nid: [] for nid in self._op_nids}
        clock = clock or time.perf_counter
        for _ in range(repeat):
            self._run_prologue()
            for nid, op in zip(self._op_nids, self._op_execs):
                start = clock()
                for _ in range(number):
                    op()
                times[nid].append((clock() - start) / number)
            self._run_epilogue()
        if number > 1 and self._in_place:
            super().run()
        self._last_executed = len(self._op_execs) - 1
        return times

    def run_individual_node(self, nid: int, number: int = 1, repeat: int = 1,
                            min_repeat_ms: int = 0) -> list[float]:
        """Time node ``nid`` alone: run the nodes before it once, then ``repeat``
        measurements of ``number`` calls (TVM's ``run_individual_node``).

        Returns
        -------
        list of float
            Seconds per call, one per repeat.

        Raises
        ------
        KilnError
            ``nid`` is not a node that runs a kernel; bad ``number``/``repeat``.
        """
        number = _positive(number, "number")
        repeat = _positive(repeat, "repeat")
        del min_repeat_ms
        pos = self._position(nid)
        if pos < 0 or self._op_nids[pos] != nid:
            raise KilnError(f"node {nid} ({self.graph.nodes[nid].name}) runs no kernel")
        if pos > 0:
            self.execute_node(self._op_nids[pos - 1])
        else:
            self._run_prologue()
        op = self._op_execs[pos]
        out = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                op()
            out.append((time.perf_counter() - start) / number)
        if number * repeat > 1 and nid in self._in_place:
            self._last_executed = -1  # its output is stale: execute_node recomputes it
            return out
        self._last_executed = pos
        if pos == len(self._op_execs) - 1:
            self._run_epilogue()
        return out
