"""Winograd F(2×2, 3×3) / F(4×4, 3×3) against Kiln's direct blocked conv and onnxruntime, per
3×3 stride-1 conv of resnet50 (docs/decisions/050), one process.

    .venv/bin/python benchmarks/winograd_conv.py [--shapes 64x56,128x28,256x14,512x7]
        [--threads 1] [--target "llvm -mcpu=native"] [--rounds 9] [--repeat 5]
        [--engines direct,f2,f4,rule] [--peak 114]

Each shape ``CxH`` is one model, ``Conv`` 3×3 C → C, padding 1, bias → ``Relu`` on
``x: [1, C, H, H]`` (benchmarks/conv_families.py's ``conv_model``, so both engines' layout
transforms are in). Engines: ``direct`` (``kiln.relay.transform.winograd.WINOGRAD`` off),
``f2`` / ``f4`` (the rule forced on with that tile), ``rule`` (Kiln's default choice),
``onnxruntime``. GFLOP/s count the
*direct* convolution's multiply-adds × 2 (what the layer computes, not what Winograd
executes), beside one core's float32 FMA peak ``--peak`` GFLOP/s × threads (default: 114,
measured on this machine's Zen 4 EPYC by a loop of 12 independent zmm FMA chains, thread CPU
time: one 16-lane FMA a cycle at ~3.55 GHz). Timing as conv_families.py: thread CPU time,
alternating rounds, median of the round means; run at 1 thread on a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
from conv_families import conv_model, graph_module, macs
from cpu_timing import alternating_medians
from peers import ort_runner


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="64x56,128x28,256x14,512x7")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--repeat", type=int, default=5, help="calls per engine and round")
    p.add_argument("--engines", default="direct,f2,f4")
    p.add_argument("--peak", type=float, default=114.0, help="one core's FMA GFLOP/s")
    return p.parse_args()


def _kiln(model, target: str, path: Path, engine: str):
    """A GraphModule of ``model`` built with ``engine``'s setting of the Winograd rule:
    ``direct`` (off), ``rule`` (as is), ``f2``/``f4`` (that tile on every 3x3 conv)."""
    settings: dict[str, object] = {}
    if engine == "direct":
        settings = {"WINOGRAD": False}
    elif engine != "rule":
        settings = {"TILE": int(engine[1:]), "MIN_CHANNELS": 1, "MIN_PIXELS": 1}
    return graph_module(model, target, path, {"kiln.relay.transform.winograd": settings})


def bench(shape: dict, args, folder: Path) -> dict[str, tuple[float, float]]:
    """engine → (median µs, max |difference| from onnxruntime / max |onnxruntime|)."""
    model = conv_model(**shape)
    x = np.random.default_rng(1).standard_normal((1, shape["cin"], shape["h"], shape["h"])) \
        .astype(np.float32)
    ort_run = ort_runner(model.SerializeToString(), {"x": x}, args.threads)
    want = ort_run()[0]
    calls, errors = {}, {}
    for engine in args.engines.split(","):
        gm = _kiln(model, args.target, folder / f"{engine}.so", engine)
        gm.set_input("x", x)
        gm.run()
        errors[engine] = float(np.abs(gm.get_output(0).numpy() - want).max()
                               / np.abs(want).max())
        calls[engine] = gm.run
    calls["onnxruntime"], errors["onnxruntime"] = ort_run, 0.0
    medians = alternating_medians(calls, args.rounds, args.repeat, warmup=1)
    return {name: (us, errors[name]) for name, us in medians.items()}


def main() -> None:
    args = _args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    peak = args.peak * args.threads
    print(f"threads {args.threads}, target {args.target!r}, {args.rounds} rounds x "
          f"{args.repeat} calls, thread CPU time, median of round means; load average "
          f"{os.getloadavg()[0]:.1f}; FMA peak {peak:.0f} GFLOP/s; GFLOP/s of direct-conv FLOPs")
    print(f"{'conv':>14} {'engine':>12} {'us':>10} {'GFLOP/s':>8} {'% peak':>6} {'x ORT':>6} "
          f"{'rel err':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.shapes.split(","):
            c, h = map(int, text.split("x"))
            shape = dict(cin=c, cout=c, h=h)
            rows = bench(shape, args, Path(tmp))
            ort_us = rows["onnxruntime"][0]
            for name, (us, err) in rows.items():
                gflops = 2 * macs(**shape) / us / 1e3
                print(f"{text:>14} {name:>12} {us:10.1f} {gflops:8.1f} {100 * gflops / peak:6.0f} "
                      f"{us / ort_us:6.2f} {err:8.1e}", flush=True)


if __name__ == "__main__":
    main()
