"""Convolution micro-benchmark of the integer kernels (docs/decisions/021): one QDQ convolution
``uint8/int8 x → DequantizeLinear → Conv (int8 weight per output channel, int32 bias) →
QuantizeLinear`` compiled by Kiln (FakeQuantizationToInteger: ``qnn.conv2d_NCHWc``) beside
onnxruntime's run of the same QDQ model (its QLinearConv) and Kiln's float32 Conv over the
dequantized weights, in one process, timed in alternating rounds.

    .venv/bin/python benchmarks/int8_conv.py [--shapes 64x64x56k3,256x64x56k1,...]
        [--activations u8,s8] [--threads 1] [--target "llvm -mcpu=native"] [--rounds 7]
        [--repeat 20] [--int8-only] [--baseline-src /work/main/src]

A shape ``CINxCOUTxHkK[sS]``: input channels, output channels, input height = width, kernel,
stride (padding K // 2). Time: CPU time of the calling thread (``time.thread_time``; the
machine is shared). Prints per shape the median time of one call in µs (the median over
rounds of each round's mean), GOP/s (2 · multiply-adds / time) and the Kiln int8 output's
largest difference from onnxruntime's in quantization steps. ``--baseline-src``: a second
Kiln int8 build of another source tree ("kiln before", built in a child process) in the same
rounds; ``--int8-only`` leaves out the float engines.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from weight_quant import _ort_session

DEFAULT_SHAPES = ("3x64x224k7s2,64x64x56k3,64x256x56k1,256x64x56k1,128x128x28k3,512x512x7k3,"
                  "256x512x56k1s2")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--activations", default="u8,s8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeat", type=int, default=20, help="calls per engine and round")
    p.add_argument("--int8-only", action="store_true", help="no float32 engines")
    p.add_argument("--baseline-src", default="",
                   help="a Kiln source tree (PYTHONPATH) to build a 'kiln before' int8 engine")
    p.add_argument("--build-only", default="", help=argparse.SUPPRESS)  # the baseline's child
    return p.parse_args()


def _mean_us(fn, repeat: int) -> float:
    """Mean thread CPU time of one call, µs."""
    start = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - start) / repeat * 1e6


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """``CINxCOUTxHkK[sS]`` → (cin, cout, h, k, stride)."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)k(\d+)(?:s(\d+))?", text.strip())
    if m is None:
        raise SystemExit(f"bad shape {text!r}: expected CINxCOUTxHkK[sS], e.g. 64x64x56k3")
    cin, cout, h, k, s = m.groups()
    return int(cin), int(cout), int(h), int(k), int(s or 1)


def macs(cin: int, cout: int, h: int, k: int, stride: int) -> int:
    out = (h + 2 * (k // 2) - k) // stride + 1
    return cin * cout * k * k * out * out


def qdq_conv_model(cin: int, cout: int, h: int, k: int, stride: int, act: str, seed: int = 0):
    """(QDQ model, float model over the dequantized weight): input ``x`` of dtype ``act``
    (uint8 zero point 128 / int8 zero point 0), scales like a calibrated layer's."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (cout, cin, k, k)).astype(np.int8)
    w_scale = (rng.uniform(0.5, 1.5, cout) / 127 / np.sqrt(cin * k * k)).astype(np.float32)
    x_scale, y_scale = np.float32(4 / 255), np.float32(6 / 255)
    bias = rng.integers(-2000, 2000, cout).astype(np.int32)
    dtype = TensorProto.UINT8 if act == "u8" else TensorProto.INT8
    zp = np.array(128 if act == "u8" else 0, np.uint8 if act == "u8" else np.int8)
    inits = [numpy_helper.from_array(v, n) for v, n in (
        (w, "w"), (w_scale, "ws"), (np.zeros(cout, np.int8), "wz"), (np.array(x_scale), "xs"),
        (zp, "xz"), (np.array(y_scale), "ys"), (bias, "b"), (x_scale * w_scale, "bs"),
        (np.zeros(cout, np.int32), "bz"))]
    pads = [k // 2] * 4
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["yf"], pads=pads,
                              strides=[stride, stride]),
             helper.make_node("QuantizeLinear", ["yf", "ys", "xz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_conv",
                              [helper.make_tensor_value_info("x", dtype, [1, cin, h, h])],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    qdq = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    wf = (w.astype(np.float32) * w_scale[:, None, None, None]).astype(np.float32)
    fgraph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads, strides=[stride, stride])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(wf, "w"),
         numpy_helper.from_array((bias * x_scale * w_scale).astype(np.float32), "b")])
    fmodel = helper.make_model(fgraph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return qdq, fmodel


def _build(model, target: str, path: Path) -> None:
    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(model)
    kiln.build(mod, target=target, params=params).export_library(str(path))


def _lib_name(shape: tuple[int, ...], act: str) -> str:
    return "q_" + "_".join(map(str, shape)) + f"_{act}.so"


def _kiln(model, target: str, path: Path, build: bool = True):
    import kiln

    if build:
        _build(model, target, path)
    return kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(path))["default"](
        kiln.cpu()))


def bench_shape(shape: tuple[int, ...], act: str, args, folder: Path) -> list[tuple]:
    """(engine, median µs, GOP/s, steps from onnxruntime) per engine."""
    cin, _, h, _, _ = shape
    qdq, fmodel = qdq_conv_model(*shape, act)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, cin, h, h)).astype(np.uint8)
    if act == "s8":
        x = (x.astype(np.int16) - 128).astype(np.int8)
    xf = ((x.astype(np.float32) - (128 if act == "u8" else 0)) * 4 / 255).astype(np.float32)
    sess = _ort_session(qdq, args.threads)
    want = sess.run(None, {"x": x})[0]
    int8 = _kiln(qdq, args.target, folder / _lib_name(shape, act))
    int8.set_input("x", x)
    int8.run()
    steps = int(np.abs(int8.get_output(0).numpy().astype(np.int32) - want).max())
    calls = {"onnxruntime int8": lambda: sess.run(None, {"x": x}), "kiln int8": int8.run}
    if args.baseline_src:
        before = _kiln(qdq, args.target, folder / "before" / _lib_name(shape, act), build=False)
        before.set_input("x", x)
        before.run()
        if not (before.get_output(0).numpy() == int8.get_output(0).numpy()).all():
            print(f"{shape} {act}: kiln before and kiln int8 differ", flush=True)
        calls["kiln before"] = before.run
    if not args.int8_only:
        fp32 = _kiln(fmodel, args.target, folder / "f.so")
        fp32.set_input("x", xf)
        fsess = _ort_session(fmodel, args.threads)
        calls["kiln fp32"] = fp32.run
        calls["onnxruntime fp32"] = lambda: fsess.run(None, {"x": xf})
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        _mean_us(fn, 2)
    for _ in range(args.rounds):
        for name, fn in calls.items():
            times[name].append(_mean_us(fn, args.repeat))
    ops = 2 * macs(*shape)
    return [(name, statistics.median(t), ops / statistics.median(t) / 1e3,
             steps if name == "kiln int8" else None) for name, t in times.items()]


def main() -> None:
    args = _args()
    shapes = [parse_shape(text) for text in args.shapes.split(",")]
    if args.build_only:
        for shape in shapes:
            for act in args.activations.split(","):
                _build(qdq_conv_model(*shape, act)[0], args.target,
                       Path(args.build_only) / _lib_name(shape, act))
        return
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    print(f"threads {args.threads}, target {args.target!r}, {args.rounds} rounds x "
          f"{args.repeat} calls, median of round means; load average {os.getloadavg()[0]:.1f}")
    print(f"{'shape':>14} {'act':>3} {'engine':>17} {'us':>9} {'GOP/s':>7} {'x ORT8':>6} "
          f"{'steps':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_src:
            (Path(tmp) / "before").mkdir()
            subprocess.run([sys.executable, __file__, "--build-only", str(Path(tmp) / "before"),
                            "--shapes", args.shapes, "--activations", args.activations,
                            "--target", args.target],
                           env={**os.environ, "PYTHONPATH": args.baseline_src}, check=True)
        for text in args.shapes.split(","):
            for act in args.activations.split(","):
                rows = bench_shape(parse_shape(text), act, args, Path(tmp))
                ort_us = rows[0][1]
                for name, us, gops, steps in rows:
                    shown = "" if steps is None else str(steps)
                    print(f"{text:>14} {act:>3} {name:>17} {us:9.1f} {gops:7.1f} "
                          f"{ort_us / us:6.2f} {shown:>5}", flush=True)


if __name__ == "__main__":
    main()
