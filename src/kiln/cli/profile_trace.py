"""``kiln run --profile-json``: a profile as a Chrome trace (chrome://tracing, Perfetto).

The Trace Event Format's JSON object form, ``{"traceEvents": [...]}``, with one complete
(``"ph": "X"``) event per kernel call, laid out as onnxruntime's profiler lays out its own:
``cat`` ``"Node"`` for a kernel call and ``"Session"`` for a whole model run (``"model_run"``);
``ts`` and ``dur`` in microseconds; ``args`` with ``op_name``, ``provider`` and
``input_type_shape`` / ``output_type_shape`` (``[{dtype: shape}, ...]``), plus Kiln's
``kernel``, ``onnx_nodes``, ``onnx_op_types`` and ``onnx_output``. An event's ``name`` is the
ONNX nodes its kernel covers (``"Conv_0, Add_1, HardSwish_2"``) where the library records them
(graph JSON attrs, docs/formats.md §4.1; the VM executable's sources section, §9.2), else the
kernel's name.

Graph executor: the debug executor times one node at a time, so a run's events are placed
back to back, each starting where the one before it ended (as TVM's debug executor writes its
trace); one run per ``--repeat``. VM: ``ts`` is when the VM called the kernel, measured, so the
gaps between events are the VM's own work.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kiln.cli.files import write_atomic
from kiln.runtime.graph_executor.onnx_source import nodes_text

PROVIDER = "KilnCPU"


def _type_shapes(shapes, dtypes) -> list[dict[str, list[int]]]:
    return [{str(d): [int(x) for x in s]} for s, d in zip(shapes, dtypes)]


def _event(name: str, cat: str, ts: float, dur: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": round(ts, 3), "dur": round(dur, 3),
            "pid": os.getpid(), "tid": 0, "args": args}


def graph_trace(report) -> dict[str, Any]:
    """Trace events of a :class:`kiln.debug_executor.DebugReport`: ``report.repeat`` model
    runs of one event per node each (seconds per call of that repeat as ``dur``)."""
    events: list[dict[str, Any]] = []
    ts = 0.0
    for r in range(report.repeat):
        run_start = ts
        for node in report.nodes:
            dur = node.times_s[r] * 1e6
            src = node.onnx
            args: dict[str, Any] = {
                "op_name": "+".join(src.op_types) if src else node.func_name,
                "provider": PROVIDER, "kernel": node.func_name, "node_index": node.nid,
                "input_type_shape": _type_shapes(node.input_shapes, node.input_dtypes),
                "output_type_shape": _type_shapes(node.shapes, node.dtypes),
                "onnx_nodes": list(src.nodes) if src else [],
                "onnx_op_types": list(src.op_types) if src else []}
            if src is not None and src.output is not None:
                args["onnx_output"] = src.output
                if src.layout:
                    args.update(output_layout=src.layout, onnx_shape=list(src.shape))
            events.append(_event(nodes_text(src.nodes) if src else node.name, "Node", ts, dur,
                                 args))
            ts += dur
        events.append(_event("model_run", "Session", run_start, ts - run_start,
                             {"executor": "graph", "repeat": r}))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def vm_trace(reports: list) -> dict[str, Any]:
    """Trace events of VM profiles (:class:`kiln.runtime.vm.profile.ProfileReport`, one per
    profiled call), the calls one after the other."""
    events: list[dict[str, Any]] = []
    offset = 0.0
    for r, report in enumerate(reports):
        for row in report.rows:
            dtypes = row.dtypes or ("",) * len(row.shapes)
            n_in = len(row.shapes) - row.num_outputs
            args = {"op_name": "+".join(row.onnx_op_types) or row.name, "provider": PROVIDER,
                    "kernel": row.name,
                    "input_type_shape": _type_shapes(row.shapes[:n_in], dtypes[:n_in]),
                    "output_type_shape": _type_shapes(row.shapes[n_in:], dtypes[n_in:]),
                    "bytes_read": row.bytes_read, "bytes_written": row.bytes_written,
                    "onnx_nodes": list(row.onnx_nodes), "onnx_op_types": list(row.onnx_op_types)}
            events.append(_event(nodes_text(row.onnx_nodes) or row.name, "Node",
                                 offset + row.start_us, row.time_us, args))
        events.append(_event("model_run", "Session", offset, report.total_us,
                             {"executor": "vm", "repeat": r}))
        offset += report.total_us
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str, trace: dict[str, Any]) -> None:
    """Write ``trace`` to ``path`` atomically (:func:`kiln.cli.files.write_atomic`).

    Raises
    ------
    KilnError
        The folder does not exist or is not writable.
    """
    data = json.dumps(trace, indent=0).encode()
    write_atomic(path, lambda f: f.write(data))


__all__ = ["PROVIDER", "graph_trace", "vm_trace", "write_trace"]
