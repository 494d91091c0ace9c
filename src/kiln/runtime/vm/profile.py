"""Timing the VM: ``time_evaluator`` results and the per-kernel ``profile`` report.

TVM's ``Module.time_evaluator`` (python/tvm/runtime/module.py, ``BenchmarkResult`` in
python/tvm/runtime/profiling) and the Relax VM profiler (``vm.profile``,
src/runtime/relax_vm/vm.cc ``VirtualMachineProfiler``). Kiln's report lists every kernel call
in order with its argument shapes and the bytes it reads and writes (destination passing: the
last ``len(outputs)`` tensor arguments of a kernel are written, one when the function table
gives the kernel no output signature).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.runtime.graph_executor.onnx_source import nodes_text
from kiln.runtime.ndarray import NDArray
from kiln.runtime.packed_func import PackedFunc


@dataclass(frozen=True)
class BenchmarkResult:
    """Seconds per call of each repeat (TVM's ``BenchmarkResult``).

    Attributes
    ----------
    results : tuple of float
        One per repeat: the mean over ``number`` calls, seconds.
    """

    results: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        return statistics.median(self.results)

    @property
    def min(self) -> float:
        return min(self.results)

    @property
    def max(self) -> float:
        return max(self.results)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.results)

    def __str__(self) -> str:
        return (f"Execution time summary:\n mean (ms)  median (ms)  max (ms)  min (ms)  std (ms)\n"
                f" {self.mean * 1e3:9.4f}  {self.median * 1e3:11.4f}  {self.max * 1e3:8.4f}  "
                f"{self.min * 1e3:8.4f}  {self.std * 1e3:8.4f}")


def time_calls(call: Callable[[], Any], number: int, repeat: int,
               min_repeat_ms: float = 0.0) -> BenchmarkResult:
    """Time ``call``: one warm-up call, then ``repeat`` measurements of ``number`` calls each
    (``number`` grows until a measurement takes ``min_repeat_ms``, as TVM's)."""
    call()
    results = []
    for _ in range(repeat):
        n = number
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            dt = time.perf_counter() - t0
            if dt * 1e3 >= min_repeat_ms or n >= 1 << 20:
                break
            n *= 2
        results.append(dt / n)
    return BenchmarkResult(tuple(results))


@dataclass(frozen=True)
class KernelRow:
    """One kernel call of a profiled VM call.

    Attributes
    ----------
    name : str
        The kernel's name in the function table.
    time_us : float
        Wall time of the call, microseconds.
    shapes : tuple of tuple of int
        Shapes of its tensor arguments, in order.
    bytes_read, bytes_written : int
        Bytes of its input and output tensors.
    start_us : float
        When the call started, microseconds after the profiled VM call began (the
        ``ts`` of its Chrome trace event).
    dtypes : tuple of str
        Dtypes of its tensor arguments, in order.
    num_outputs : int
        How many of the tensor arguments (the last ones) it writes.
    onnx_nodes, onnx_op_types : tuple of str
        The ONNX nodes the call computes and their op types (the executable's sources
        section; empty for an executable without it).
    """

    name: str
    time_us: float
    shapes: tuple[tuple[int, ...], ...]
    bytes_read: int
    bytes_written: int
    start_us: float = 0.0
    dtypes: tuple[str, ...] = ()
    num_outputs: int = 1
    onnx_nodes: tuple[str, ...] = ()
    onnx_op_types: tuple[str, ...] = ()


@dataclass
class ProfileReport:
    """Per-kernel times of one VM call, in call order.

    Attributes
    ----------
    rows : list of KernelRow
    total_us : float
        Wall time of the whole call (kernels plus the VM's own work), microseconds.
    """

    rows: list[KernelRow] = field(default_factory=list)
    total_us: float = 0.0

    @property
    def kernel_us(self) -> float:
        return sum(r.time_us for r in self.rows)

    def table(self) -> str:
        """The rows as text: name, time (us), % of the call, bytes read/written, shapes, and
        when the executable records them the ONNX nodes of each call (three names, then
        ``+N more``); then the kernels' sum and the VM's own time."""
        total = self.total_us or 1.0
        onnx = any(r.onnx_nodes for r in self.rows)
        extra = ("",) if onnx else ()
        header = ("Name", "Time(us)", "Time(%)", "Read(B)", "Written(B)", "Shapes",
                  *(("ONNX nodes",) if onnx else ()))
        body = [(r.name, f"{r.time_us:.1f}", f"{100 * r.time_us / total:.1f}",
                 str(r.bytes_read), str(r.bytes_written),
                 ", ".join("x".join(map(str, s)) or "scalar" for s in r.shapes),
                 *((nodes_text(r.onnx_nodes),) if onnx else ()))
                for r in self.rows]
        foot = [("Kernels", f"{self.kernel_us:.1f}", f"{100 * self.kernel_us / total:.1f}",
                 str(sum(r.bytes_read for r in self.rows)),
                 str(sum(r.bytes_written for r in self.rows)), "", *extra),
                ("VM overhead", f"{self.total_us - self.kernel_us:.1f}",
                 f"{100 * (self.total_us - self.kernel_us) / total:.1f}", "", "", "", *extra),
                ("Total", f"{self.total_us:.1f}", "100.0", "", "", "", *extra)]
        rows = [header, *body, *foot]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

        def line(row: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if 1 <= i <= 4 else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip()

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(header), rule, *map(line, body), rule, *map(line, foot)])

    def to_dict(self) -> dict[str, Any]:
        return {"total_us": self.total_us, "kernel_us": self.kernel_us,
                "rows": [{"name": r.name, "time_us": r.time_us,
                          "shapes": [list(s) for s in r.shapes], "bytes_read": r.bytes_read,
                          "bytes_written": r.bytes_written, "start_us": r.start_us,
                          "onnx_nodes": list(r.onnx_nodes),
                          "onnx_op_types": list(r.onnx_op_types)}
                         for r in self.rows]}


class Profiler:
    """Runs kernel calls one at a time, timing each (the VM calls :meth:`kernel`)."""

    def __init__(self, num_outputs: dict[str, int]):
        self.report = ProfileReport()
        self._num_outputs = num_outputs
        self.start = time.perf_counter()  # the VM resets it when the profiled call begins

    def kernel(self, name: str, func: PackedFunc, args: list,
               source: tuple[tuple[str, ...], tuple[str, ...]] | None = None) -> Any:
        """Call kernel ``name`` (``func``) on ``args``, timing it; returns its result.
        ``source``: the ONNX nodes and op types of this call site, when known."""
        call = func.prepare(*args) if func._cfunc is not None else None
        t0 = time.perf_counter()
        out = call() if call is not None else func(*args)
        dt = time.perf_counter() - t0
        tensors = [a for a in args if type(a) is NDArray]
        n_out = min(self._num_outputs.get(name, 1) or 1, len(tensors))
        written = tensors[len(tensors) - n_out:]
        read = tensors[:len(tensors) - n_out]
        self.report.rows.append(KernelRow(
            name, dt * 1e6, tuple(t.shape for t in tensors),
            sum(t.nbytes for t in read), sum(t.nbytes for t in written),
            (t0 - self.start) * 1e6, tuple(t.dtype for t in tensors), n_out,
            *(source or ((), ()))))
        return out


__all__ = ["BenchmarkResult", "KernelRow", "ProfileReport", "Profiler", "time_calls"]
