"""QDQ resnet50 on an AVX2 target without VNNI: Kiln's exact products against its saturating
``vpmaddubsw`` mode (docs/decisions/049), beside onnxruntime and OpenVINO, in one process.

    .venv/bin/python benchmarks/int8_saturate.py [--target "llvm -mcpu=haswell"] \\
        [--models u8s8,s8s8,u8s8_rr] [--blocks 15] [--calls 3]

Models (``kiln.models.qdq_resnet50``, seed 0): ``u8s8`` per tensor (uint8 activations),
``s8s8`` per channel (int8 activations), ``*_rr`` the same with ``reduce_range`` (7-bit
weights: the exact mode takes ``vpmaddubsw`` on its own); ``mobilenet_u8s8`` /
``mobilenet_s8s8`` (``kiln.models.qdq_mobilenet_v2``). Engines: Kiln ``exact`` (the default
build), Kiln ``saturate`` (``int8_products="saturate"``), onnxruntime and OpenVINO (int8; both
pick this CPU's best kernels — VNNI where it has it — whatever ``--target`` says). Timing: the
engines alternate block by block (``--calls`` runs a block), medians over ``--blocks`` blocks
of the calling thread's CPU time (``cpu_timing``) and of wall time (OpenVINO may infer on a
worker thread: read its wall column). ``--openvino-isa AVX2`` caps OpenVINO's oneDNN kernels
(``ONEDNN_MAX_CPU_ISA``): its speed on a CPU without VNNI. Prints each engine's times, its
ratio to onnxruntime's, and the largest output difference from onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from cpu_timing import cpu_us
from peers import openvino_runner, ort_runner

#: name → (builder in kiln.models, per channel, reduce_range)
MODELS = {"u8s8": ("qdq_resnet50", False, False), "s8s8": ("qdq_resnet50", True, False),
          "u8s8_rr": ("qdq_resnet50", False, True), "s8s8_rr": ("qdq_resnet50", True, True),
          "mobilenet_u8s8": ("qdq_mobilenet_v2", False, False),
          "mobilenet_s8s8": ("qdq_mobilenet_v2", True, False)}


def _kiln(model_path: Path, target: str, products: str, so: Path):
    import onnx

    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(onnx.load(str(model_path)))
    kiln.build(mod, target=target, params=params, int8_products=products) \
        .export_library(str(so))
    gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(so))["default"](
        kiln.cpu()))

    def run(feeds: dict) -> list:
        for k, v in feeds.items():
            gm.set_input(k, v)
        gm.run()
        return [gm.get_output(0).numpy()]

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="llvm -mcpu=haswell")
    p.add_argument("--models", default="u8s8,s8s8")
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--openvino-isa", metavar="ISA",
                   help="cap OpenVINO's oneDNN kernels at this ISA (ONEDNN_MAX_CPU_ISA, e.g. "
                        "AVX2: its kernels for CPUs without VNNI)")
    args = p.parse_args()
    os.environ["KILN_NUM_THREADS"] = "1"
    if args.openvino_isa:  # read once, when oneDNN first dispatches: before openvino loads
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.openvino_isa
    import onnx

    from kiln import models

    print(f"target {args.target!r}, 1 thread, {args.blocks} blocks x {args.calls} calls, "
          f"OpenVINO ISA cap {args.openvino_isa}, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            builder, per_channel, reduce_range = MODELS[name]
            folder = Path(tmp) / name
            folder.mkdir()
            options = {"reduce_range": True} if reduce_range else {}
            path = getattr(models, builder)(folder, per_channel, 0, **options)
            x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
            feeds = {onnx.load(str(path)).graph.input[0].name: x}
            engines = {f"kiln {mode}": _kiln(path, args.target, mode, folder / f"{mode}.so")
                       for mode in ("exact", "saturate")}
            runs = {k: (lambda f=f: f(feeds)) for k, f in engines.items()}
            runs["onnxruntime"] = ort_runner(str(path), feeds, 1)
            runs["openvino"] = openvino_runner(str(path), feeds, 1, int8=True)
            want = runs["onnxruntime"]()[0]
            for label, fn in runs.items():
                err = float(np.abs(np.asarray(fn()[0]) - want).max())
                print(f"{name} {label}: max abs difference from onnxruntime {err:.2e}",
                      flush=True)
            cpu: dict[str, list[float]] = {k: [] for k in runs}
            wall: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.blocks):
                for label, fn in runs.items():
                    start = time.perf_counter()
                    cpu[label].append(cpu_us(fn, args.calls))
                    wall[label].append((time.perf_counter() - start) / args.calls * 1e6)
            ort_cpu = statistics.median(cpu["onnxruntime"])
            ort_wall = statistics.median(wall["onnxruntime"])
            for label in runs:
                c, w = statistics.median(cpu[label]), statistics.median(wall[label])
                print(f"{name:>8} {label:>14}  cpu {c / 1e3:7.2f} ms ({c / ort_cpu:4.2f})  "
                      f"wall {w / 1e3:7.2f} ms ({w / ort_wall:4.2f})", flush=True)


if __name__ == "__main__":
    main()
