"""Whole models, two Kiln builds (as is, and with schedule constants changed) beside onnxruntime
in one process, 1 thread by default: the before / after of a schedule change
(docs/decisions/003).

    .venv/bin/python benchmarks/model_ab.py --models squeezenet,resnet50,mobilenet_v2 \\
        --alt kiln.topi.nn_nchwc.SUBSAMPLE_STRIDED_POINTWISE=False [--blocks 12] [--calls 3]

Timing as ``benchmarks/fp32_conv.py``: CPU time of the calling thread over ``--calls`` runs,
in alternating blocks (Kiln, Kiln alt, onnxruntime), the median over blocks; prints each build's
time and its ratio to onnxruntime's, and the geometric mean of the ratios.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
from cpu_timing import cpu_us as _cpu_us
from fp32_conv import _kiln, _set_attrs

from models import input_shapes, load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="squeezenet,resnet50,mobilenet_v2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--alt", action="append", default=[], metavar="MODULE.NAME=VALUE")
    args = p.parse_args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    import onnxruntime as ort

    print(f"threads {args.threads}, {args.blocks} blocks x {args.calls} calls, thread CPU time; "
          f"load {os.getloadavg()[0]:.1f}; alt (the 'before'): {args.alt}")
    ratios: dict[str, list[float]] = {"kiln": [], "kiln alt": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = load_model(name, 0)
            shapes = input_shapes(model)
            rng = np.random.default_rng(0)
            feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
            sess = ort.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            want = sess.run(None, feeds)[0]
            calls = {}
            for label, alt in (("kiln", []), ("kiln alt", args.alt)):
                saved = _set_attrs(alt)
                try:
                    gm = _kiln(model, args.target, Path(tmp) / f"{name}_{len(alt)}.so")
                finally:
                    for mod, attr, value in saved:
                        setattr(mod, attr, value)
                for k, v in feeds.items():
                    gm.set_input(k, v)
                gm.run()
                err = float(np.abs(gm.get_output(0).numpy() - want).max())
                print(f"{name} {label}: max abs difference from onnxruntime {err:.1e}",
                      flush=True)
                calls[label] = gm.run
            calls["onnxruntime"] = lambda: sess.run(None, feeds)  # noqa: B023
            times: dict[str, list[float]] = {k: [] for k in calls}
            for fn in calls.values():
                _cpu_us(fn, 1)
            for _ in range(args.blocks):
                for label, fn in calls.items():
                    times[label].append(_cpu_us(fn, args.calls))
            ort_us = statistics.median(times["onnxruntime"])
            for label, t in times.items():
                ms = statistics.median(t) / 1e3
                print(f"{name:>14} {label:>12} {ms:8.2f} ms  {ms * 1e3 / ort_us:5.2f}",
                      flush=True)
                if label in ratios:
                    ratios[label].append(ms * 1e3 / ort_us)
    for label, r in ratios.items():
        print(f"geomean {label}: {math.exp(sum(map(math.log, r)) / len(r)):.3f}")


if __name__ == "__main__":
    main()
