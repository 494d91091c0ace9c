"""The VM's cost per call over the graph executor's on small models of many cheap kernels
(issue 32: a replayed VM call should cost at most 50 us more than a graph-executor run).

Each model is built twice from one ONNX graph: for the graph executor at a fixed shape, and
for the VM (``executor="vm"`` at the same fixed shape, or with symbolic dims for the
``*_symbolic`` models, which the VM serves through its guarded replay). Both load in this one
process with one kernel thread (``KILN_NUM_THREADS=1``: the calling thread runs every kernel,
so the two libraries' thread pools never compete) and are called the way users call them:
graph executor ``set_input`` + ``run`` + ``get_output`` (a copy in and a copy out), VM
``vm["main"](x)`` (input used in place, result copied out). Timed in alternating blocks, thread
CPU time (benchmarks/cpu_timing.py) and wall time per block, together with each engine's
kernels alone (graph executor ``run()``; the VM trace's batches of C calls), so that a
symbolic build's own kernels are not counted as overhead; the medians are printed with the
differences. The outputs must agree, and every timed VM call must be a replay.

    KILN_NUM_THREADS=1 .venv/bin/python benchmarks/vm_overhead.py --models chain,mobile
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("KILN_NUM_THREADS", "1")  # (read at the first kernel launch)

import numpy as np  # noqa: E402

MODELS = ("chain", "mobile", "chain_symbolic", "mobile_symbolic")


# ------------------------------------------------------------------------------ models
class _Graph:
    """ONNX nodes and seeded initializers, named in creation order."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []

    def weight(self, shape: tuple[int, ...], scale: float = 0.2) -> str:
        from onnx import numpy_helper

        name = f"w{len(self.inits)}"
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1,
             group: int = 1) -> str:
        w = self.weight((cout, cin // group, k, k), (2.0 / (cin // group * k * k)) ** 0.5)
        return self.node("Conv", [x, w, self.weight((cout,))], pads=[k // 2] * 4,
                         strides=[stride] * 2, group=group)

    def model(self, x: str, shape: tuple, out: str):
        from onnx import TensorProto, helper

        g = helper.make_graph(self.nodes, "small", [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], [
            helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], self.inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8  # (what onnxruntime reads)
        return model


def chain(blocks: int = 30, channels: int = 16, size: int = 8):
    """``blocks`` × (3×3 conv + ReLU, times the sigmoid of its input): 120 kernels of a few
    microseconds at 16×8×8 (a detector head's scale)."""
    g = _Graph(0)
    x = "x"
    for _ in range(blocks):
        y = g.node("Relu", [g.conv(x, channels, channels)])
        x = g.node("Mul", [y, g.node("Sigmoid", [x])])
    return g.model("x", (1, channels, size, size), x), (1, channels, size, size)


def mobile(size: int = 32):
    """A MobileNet-like backbone at ``size``×``size``: a stride-2 stem, inverted residual
    blocks (1×1 expand, 3×3 depthwise, 1×1 project, residual add when the shape allows) over
    four resolutions, global pooling: ~40 kernels of 1-20 us, several storages."""
    g = _Graph(1)
    x = g.node("Relu", [g.conv("x", 3, 16, stride=2)])
    cin = 16
    for cout, stride, blocks in ((16, 1, 1), (24, 2, 2), (32, 2, 3), (48, 1, 2), (64, 2, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            h = g.node("Relu", [g.conv(x, cin, cin * 4, k=1)])
            h = g.node("Relu", [g.conv(h, cin * 4, cin * 4, stride=s, group=cin * 4)])
            h = g.conv(h, cin * 4, cout, k=1)
            x = g.node("Add", [x, h]) if s == 1 and cin == cout else h
            cin = cout
    x = g.node("GlobalAveragePool", [x])
    return g.model("x", (1, 3, size, size), x), (1, 3, size, size)


def _symbolic(model, shape: tuple):
    """``model`` with a symbolic batch dim (``N``)."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "N"
    return model, shape


BUILDERS: dict[str, Callable] = {
    "chain": chain, "mobile": mobile,
    "chain_symbolic": lambda: _symbolic(*chain()),
    "mobile_symbolic": lambda: _symbolic(*mobile()),
}


# ------------------------------------------------------------------------------ timing
def alternating(calls: dict[str, Callable[[], object]], rounds: int, repeat: int,
                warmup: int) -> dict[str, tuple[float, float]]:
    """Per engine, the median over ``rounds`` alternating blocks of ``repeat`` calls of the
    thread-CPU and the wall microseconds per call."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    cpu: dict[str, list[float]] = {n: [] for n in calls}
    wall: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            c0, w0 = time.thread_time(), time.perf_counter()
            for _ in range(repeat):
                fn()
            cpu[name].append((time.thread_time() - c0) / repeat * 1e6)
            wall[name].append((time.perf_counter() - w0) / repeat * 1e6)
    return {n: (statistics.median(cpu[n]), statistics.median(wall[n])) for n in calls}


def _engines(name: str, target: str, tmp: str):
    import kiln
    from kiln.frontend import from_onnx

    model, shape = BUILDERS[name]()
    mod, params = from_onnx(model, shape={"x": shape})
    kiln.build(mod, target=target, params=params, executor="graph").export_library(
        f"{tmp}/{name}_graph.so")
    symbolic = name.endswith("_symbolic")
    mod, params = from_onnx(model) if symbolic else from_onnx(model, shape={"x": shape})
    exe = kiln.build(mod, target=target, params=params, executor="vm")
    exe.export_library(f"{tmp}/{name}_vm.so")
    gmod = kiln.graph_executor.GraphModule(
        kiln.runtime.load_module(f"{tmp}/{name}_graph.so")["default"](kiln.cpu()))
    vm = kiln.vm.VirtualMachine(kiln.runtime.load_module(f"{tmp}/{name}_vm.so"))
    return gmod, vm, shape


def measure(name: str, target: str, rounds: int, repeat: int, tmp: str,
            inputs: int = 1) -> dict:
    gmod, vm, shape = _engines(name, target, tmp)
    import kiln

    rng = np.random.default_rng(2)
    xs = [kiln.runtime.array(rng.standard_normal(shape).astype("float32"))
          for _ in range(inputs)]
    main = vm["main"]
    turn = [0, 0]

    def graph_call():
        turn[0] += 1
        gmod.set_input("x", xs[turn[0] % inputs])
        gmod.run()
        return gmod.get_output(0)

    def vm_call():
        turn[1] += 1
        return main(xs[turn[1] % inputs])

    for _ in range(inputs):
        np.testing.assert_allclose(vm_call().numpy(), graph_call().numpy(), rtol=1e-4,
                                   atol=1e-4)
    (trace,) = vm.module._traces.values()
    batches = [s for s in trace.steps if s[0] == "batch"]

    def vm_kernels():  # the trace's C calls alone (a symbolic build's kernels are its own)
        for step in batches:
            trace._run_batch(step)

    before = vm.replay_stats()
    times = alternating({"graph": graph_call, "vm": vm_call, "graph_run": gmod.run,
                         "vm_kernels": vm_kernels}, rounds, repeat, warmup=20)
    after = vm.replay_stats()
    served = after["replays"] - before["replays"]
    calls = after["calls"] - before["calls"]
    if served != calls:
        raise SystemExit(f"{name}: {calls - served} of {calls} timed VM calls were not replays")
    return {"model": name, **times, "patches": getattr(trace, "patches", "-"),
            "repoints": getattr(trace, "repoints", "-"), "kernel_calls": trace.num_calls,
            "steps": len(trace.steps)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="chain,mobile,chain_symbolic")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--inputs", type=int, default=1,
                    help="distinct input arrays the calls take in turn (2+: a new address "
                         "on every call)")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(measure(name, args.target, args.rounds, args.repeat, tmp, args.inputs))
    print(f"KILN_NUM_THREADS={os.environ['KILN_NUM_THREADS']}, target {args.target}, medians "
          f"of {args.rounds} alternating blocks of {args.repeat} calls, {args.inputs} input "
          f"array(s) in turn; us per call")
    print("overhead = a call minus its kernels alone (graph: run(); VM: the trace's batches)")
    print("| model | kernel calls / replay steps | graph | VM | VM - graph | graph overhead "
          "| VM overhead | VM - graph overhead | graph wall | VM wall | replays that patched / "
          "repointed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        (gc, gw), (vc, vw) = r["graph"], r["vm"]
        go, vo = gc - r["graph_run"][0], vc - r["vm_kernels"][0]
        print(f"| {r['model']} | {r['kernel_calls']} / {r['steps']} | {gc:.1f} | {vc:.1f} | "
              f"{vc - gc:+.1f} | {go:.1f} | {vo:.1f} | {vo - go:+.1f} | {gw:.1f} | {vw:.1f} | "
              f"{r['patches']} / {r['repoints']} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
