"""Single float32 convolution, Kiln beside onnxruntime, one process (docs/decisions/003).

    .venv/bin/python benchmarks/fp32_conv.py [--shapes 256x512x56k1s2,3x64x224k7s2,...]
        [--threads 1] [--target "llvm -mcpu=native"] [--rounds 15] [--repeat 10]
        [--alt kiln.schedules.conv_blocks.NAME=VALUE ...]

A shape ``CINxCOUTxHkK[sS]`` (``benchmarks/int8_conv.py``): input channels, output channels,
input height = width, kernel, stride, padding K // 2; the model is ``Conv`` (with bias) →
``Relu`` on an NCHW input, so Kiln's time includes its layout transforms at the edges.
``--alt`` compiles a second Kiln library with module attributes set (a schedule constant, to
compare before / after in the same process); the attributes are restored afterwards.

Timing: **CPU time of the calling thread** (``time.thread_time``) of ``--repeat`` calls, in
alternating rounds (Kiln, [Kiln alt], onnxruntime); the median over rounds of each round's mean.
On a shared, loaded machine wall time mostly measures the other processes; run at 1 thread
(``--threads 1``: ``KILN_NUM_THREADS`` and onnxruntime's intra-op threads) for CPU time to be
the work done.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
from pathlib import Path

import numpy as np
from cpu_timing import alternating_medians
from int8_conv import macs, parse_shape
from peers import ort_runner

DEFAULT_SHAPES = ("256x512x56k1s2,512x1024x28k1s2,1024x2048x14k1s2,"
                  "3x64x224k7s2,3x64x224k3s2,3x32x224k3s2")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--repeat", type=int, default=10, help="calls per engine and round")
    p.add_argument("--alt", action="append", default=[], metavar="MODULE.NAME=VALUE",
                   help="a second Kiln build with this attribute set (a Python literal)")
    return p.parse_args()


def conv_model(cin: int, cout: int, h: int, k: int, stride: int, seed: int = 0):
    """Conv (seeded weights and bias, padding k // 2) → Relu, input ``x: [1, cin, h, h]``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4,
                              strides=[stride, stride], kernel_shape=[k, k]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _set_attrs(assignments: list[str]) -> list[tuple[object, str, object]]:
    """Set ``module.NAME=literal`` attributes; returns what to restore."""
    import ast

    saved = []
    for text in assignments:
        path, value = text.split("=", 1)
        module, name = path.rsplit(".", 1)
        mod = importlib.import_module(module)
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, ast.literal_eval(value))
    return saved


def _kiln(model, target: str, path: Path):
    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(model)
    kiln.build(mod, target=target, params=params).export_library(str(path))
    return kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(path))["default"](
        kiln.cpu()))


def bench_shape(shape, args, folder: Path) -> list[tuple[str, float, float, float]]:
    """(engine, median µs, GFLOP/s, max abs difference from onnxruntime) per engine."""
    model = conv_model(*shape)
    x = np.random.default_rng(1).standard_normal((1, shape[0], shape[2], shape[2])) \
        .astype(np.float32)
    ort_run = ort_runner(model.SerializeToString(), {"x": x}, args.threads)
    want = ort_run()[0]
    builds = {"kiln": []}
    if args.alt:
        builds["kiln alt"] = args.alt
    calls, errors = {}, {}
    for name, alt in builds.items():
        saved = _set_attrs(alt)
        try:
            gm = _kiln(model, args.target, folder / f"{name.replace(' ', '_')}.so")
        finally:
            for mod, attr, value in saved:
                setattr(mod, attr, value)
        gm.set_input("x", x)
        gm.run()
        errors[name] = float(np.abs(gm.get_output(0).numpy() - want).max())
        calls[name] = gm.run
    calls["onnxruntime"] = ort_run
    errors["onnxruntime"] = 0.0
    medians = alternating_medians(calls, args.rounds, args.repeat, warmup=2)
    flop = 2 * macs(*shape)
    return [(name, us, flop / us / 1e3, errors[name])
            for name, us in medians.items()]


def main() -> None:
    args = _args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    print(f"threads {args.threads}, target {args.target!r}, {args.rounds} rounds x "
          f"{args.repeat} calls, thread CPU time, median of round means; "
          f"load average {os.getloadavg()[0]:.1f}; alt: {args.alt}")
    print(f"{'shape':>18} {'engine':>12} {'us':>9} {'GFLOP/s':>8} {'x ORT':>6} {'max err':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.shapes.split(","):
            rows = bench_shape(parse_shape(text), args, Path(tmp))
            ort_us = rows[-1][1]
            for name, us, gflops, err in rows:
                print(f"{text:>18} {name:>12} {us:9.1f} {gflops:8.1f} {us / ort_us:6.2f} "
                      f"{err:8.1e}", flush=True)


if __name__ == "__main__":
    main()
