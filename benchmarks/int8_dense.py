"""Int8 GEMM micro-benchmark (docs/decisions/021, MiniLM int8): one ``MatMulInteger`` (uint8
activations ``[M, K]``, a constant int8 weight ``[K, N]``, a run-time uint8 zero point — what
onnxruntime's ``quantize_dynamic`` writes) compiled by Kiln (``qnn.dense_pack``) beside
onnxruntime's run of the same model, optionally beside a second Kiln build of another source
tree (the "before" of a change), in one process.

    .venv/bin/python benchmarks/int8_dense.py [--shapes 128x384x1536,...] [--blocks 15]
        [--calls 10] [--target "llvm -mcpu=native"] [--baseline-src /work/main/src]
        [--set kiln.schedules.dense_cpu.DENSE_K_UNROLL=4]

A shape ``MxKxN``. Timing: CPU time of the calling thread (``time.thread_time``) over
``--calls`` calls, engines alternating block by block, the median over blocks; 1 thread
(``KILN_NUM_THREADS=1``, onnxruntime ``intra_op_num_threads = 1``). Prints per shape and
engine µs per call and G multiply-adds/s, and whether Kiln's int32 output equals numpy's
(onnxruntime's AVX2 U8S8 GEMM saturates in ``vpmaddubsw``: its largest difference is shown).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from fp32_conv import _set_attrs

DEFAULT_SHAPES = "128x384x384,128x384x1536,128x1536x384,32x384x384,32x384x1536,32x1536x384"


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--calls", type=int, default=10, help="calls per engine and block")
    p.add_argument("--baseline-src", default="",
                   help="a Kiln source tree (PYTHONPATH) to build the 'before' libraries with")
    p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                   help="a schedule constant changed for this tree's build (not the baseline's)")
    p.add_argument("--build-only", default="", help=argparse.SUPPRESS)  # the baseline's child
    return p.parse_args(argv)


def parse_shape(text: str) -> tuple[int, int, int]:
    m, k, n = (int(v) for v in text.strip().split("x"))
    return m, k, n


def model(m: int, k: int, n: int, seed: int = 0):
    """(MatMulInteger model, its weight ``B``): ``Y = (A - a_zp) @ B`` in int32."""
    from onnx import TensorProto, helper, numpy_helper

    b = np.random.default_rng(seed).integers(-128, 128, (k, n)).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zp"], ["Y"])
    graph = helper.make_graph(
        [node], "mmi",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k]),
         helper.make_tensor_value_info("a_zp", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])],
        [numpy_helper.from_array(b, "B")])
    mdl = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mdl.ir_version = 8
    return mdl, b


def build(shape: tuple[int, int, int], target: str, path: Path) -> None:
    import kiln
    from kiln.frontend import from_onnx

    m, k, _ = shape
    mod, params = from_onnx(model(*shape)[0], shape={"A": (m, k), "a_zp": ()})
    kiln.build(mod, target=target, params=params).export_library(str(path))


def _cpu_us(fn, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


def bench(shape, libs: dict[str, Path], args) -> dict[str, float]:
    """Median µs per engine; asserts nothing, prints exactness."""
    import onnxruntime as ort

    import kiln

    m, k, n = shape
    mdl, b = model(*shape)
    a = np.random.default_rng(1).integers(0, 256, (m, k)).astype(np.uint8)
    zp = np.array(131, np.uint8)
    want = (a.astype(np.int64) - 131) @ b.astype(np.int64)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(mdl.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {"A": a, "a_zp": zp}
    engines = {"ort": lambda: sess.run(None, feed)}
    notes = [f"ort max |diff| {int(np.abs(sess.run(None, feed)[0] - want).max())}"]
    for name, path in libs.items():
        gm = kiln.graph_executor.GraphModule(
            kiln.runtime.load_module(str(path))["default"](kiln.cpu()))
        gm.set_input("A", a)
        gm.set_input("a_zp", zp)
        gm.run()
        notes.append(f"{name} exact {bool((gm.get_output(0).numpy() == want).all())}")
        engines[name] = gm.run
    samples: dict[str, list[float]] = {e: [] for e in engines}
    for fn in engines.values():
        fn()
    for _ in range(args.blocks):
        for e, fn in engines.items():
            samples[e].append(_cpu_us(fn, args.calls))
    med = {e: statistics.median(v) for e, v in samples.items()}
    macs = m * k * n
    cells = ", ".join(f"{e} {us:.0f} us ({macs / us / 1e3:.1f} G/s)" for e, us in med.items())
    print(f"{m}x{k}x{n}: {cells}; " + "; ".join(notes), flush=True)
    return med


def main(argv=None) -> int:
    args = _args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    if args.build_only:
        for i, shape in enumerate(shapes):
            build(shape, args.target, Path(args.build_only) / f"dense{i}.so")
        return 0
    os.environ["KILN_NUM_THREADS"] = "1"
    print(f"thread CPU time, 1 thread, {args.blocks} blocks x {args.calls} calls; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.baseline_src:
            (work / "before").mkdir()
            env = {**os.environ, "PYTHONPATH": args.baseline_src}
            subprocess.run([sys.executable, __file__, "--build-only", str(work / "before"),
                            "--shapes", args.shapes, "--target", args.target], env=env,
                           check=True)
        _set_attrs(args.set)
        for i, shape in enumerate(shapes):
            build(shape, args.target, work / f"dense{i}.so")
            libs = {"kiln": work / f"dense{i}.so"}
            if args.baseline_src:
                libs["before"] = work / "before" / f"dense{i}.so"
            bench(shape, libs, args)
    print(f"load at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
