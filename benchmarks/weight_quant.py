"""GEMV micro-benchmark of weight-only quantization (docs/decisions/018): one MatMul
``x[M, K] · W[K, N]`` (``W`` an initializer) compiled by Kiln with float32, int8 and q4 weights,
beside onnxruntime's float32 MatMul, in one process, timed in alternating rounds.

    .venv/bin/python benchmarks/weight_quant.py [--shapes 576x1536,1536x576,576x49152]
        [--rows 1] [--threads 1] [--target "llvm -mcpu=native"] [--rounds 7] [--repeat 200]

Prints per shape and engine the median time of one call in µs (the median over rounds of each
round's mean) and the effective bandwidth of the weight bytes (bytes of the stored weight and
its scales / time). Warm caches: a weight that fits the L2/L3 cache reads faster than memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="576x1536,1536x576,576x49152",
                   help="comma-separated KxN weight shapes")
    p.add_argument("--rows", type=int, default=1, help="M, rows of x (default 1: GEMV)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeat", type=int, default=200, help="calls per engine and round")
    return p.parse_args()


def _model(k: int, n: int, rows: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def weight_bytes(mode: str | None, k: int, n: int) -> int:
    """Bytes a call reads for the weight: values plus scales (int8: a float32 scale per
    channel; q4: float16 d and m per block of 32)."""
    if mode == "int8":
        return k * n + 4 * n
    if mode == "q4":
        return k * n // 2 + 2 * 2 * (k // 32) * n
    return 4 * k * n


def _kiln_runner(model, mode: str | None, target: str, folder: Path):
    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(model)
    lib = kiln.build(mod, target=target, params=params, quantize_weights=mode)
    path = folder / f"gemv_{mode or 'fp32'}.so"
    lib.export_library(str(path))
    gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(path))["default"](
        kiln.cpu()))
    return gm


def _ort_session(model, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _mean_us(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def bench_shape(k: int, n: int, args, folder: Path) -> list[tuple[str, float, float, float]]:
    """(engine, median µs, GB/s of weight bytes, max abs error vs float) per engine."""
    model = _model(k, n, args.rows)
    x = np.random.default_rng(1).standard_normal((args.rows, k)).astype(np.float32)
    sess = _ort_session(model, args.threads)
    want = sess.run(None, {"x": x})[0]
    calls = {"onnxruntime fp32": (None, lambda: sess.run(None, {"x": x}))}
    errors = {"onnxruntime fp32": 0.0}
    for mode in (None, "int8", "q4"):
        gm = _kiln_runner(model, mode, args.target, folder)
        gm.set_input("x", x)
        gm.run()
        name = f"kiln {mode or 'fp32'}"
        errors[name] = float(np.abs(gm.get_output(0).numpy() - want).max())
        calls[name] = (mode, gm.run)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for name, (_, fn) in calls.items():
        _mean_us(fn, max(1, args.repeat // 10))  # warm-up
    for _ in range(args.rounds):
        for name, (_, fn) in calls.items():
            times[name].append(_mean_us(fn, args.repeat))
    rows = []
    for name, (mode, _) in calls.items():
        us = statistics.median(times[name])
        rows.append((name, us, weight_bytes(mode, k, n) / us / 1e3, errors[name]))
    return rows


def main() -> None:
    args = _args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    print(f"M={args.rows}, threads {args.threads}, target {args.target!r}, "
          f"{args.rounds} rounds x {args.repeat} calls, median of round means; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'K x N':>12} {'engine':>17} {'us':>9} {'GB/s':>7} {'x ORT':>6} {'max err':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.lower().split("x"))
            rows = bench_shape(k, n, args, Path(tmp))
            ort_us = rows[0][1]
            for name, us, gbs, err in rows:
                print(f"{shape:>12} {name:>17} {us:9.1f} {gbs:7.1f} {ort_us / us:6.2f} "
                      f"{err:9.2e}")


if __name__ == "__main__":
    main()
