"""The integer dense and 1×1 convolution with and without AMX (docs/decisions/026-amx.md):
``qnn.dense`` of int8 data [M, K] and an int8 weight [N, K] (or ``qnn.conv2d`` 1×1 of int8 data
[1, CIN, H, H]) compiled once for ``--target``; two copies of the library
in one process, one running the AMX kernel (support/amx.c) and one told ``KILN_AMX=0`` (its
VNNI / AVX2 loops), timed in alternating rounds, each output checked against numpy's int64
product.

    python benchmarks/amx_dense.py [--shapes 256x1024x1024,...] [--threads 1]
        [--target "llvm -mcpu=native"] [--rounds 7] [--repeat 20]

A shape ``MxKxN`` (dense) or ``conv:CINxCOUTxH`` (1×1 convolution, stride 1: M = H², K = CIN,
N = COUT). Prints per shape the AMX status of this process (``KilnAMXStatus``), the
median time of one call in µs for each library, GOP/s (2 · M · K · N / time) and the ratio.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="128x768x768,256x1024x1024,512x2048x512,16x4096x4096,"
                   "conv:64x256x56,conv:256x64x56,conv:512x128x28,conv:1024x256x14")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeat", type=int, default=20)
    return p.parse_args()


def main() -> None:
    args = _args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    import kiln
    from kiln.relay.graph import Call, Constant, Function, TensorType, Var

    rng = np.random.default_rng(0)
    work = Path(tempfile.mkdtemp(prefix="kiln-amx-bench-"))
    print(f"target {args.target!r}, {args.threads} thread(s)")
    for shape in args.shapes.split(","):
        conv = shape.startswith("conv:")
        a, b, c = (int(v) for v in shape.removeprefix("conv:").split("x"))
        m, k, n = (c * c, a, b) if conv else (a, b, c)
        x = rng.integers(-128, 128, (1, k, c, c) if conv else (m, k)).astype(np.int8)
        w = rng.integers(-128, 128, (n, k)).astype(np.int8)
        xv = Var("x", TensorType(x.shape, "int8"))
        if conv:
            attrs = {"strides": (1, 1), "padding": (0,) * 4, "dilation": (1, 1), "groups": 1,
                     "input_zero_point": -3}
            op = Call("qnn.conv2d", [xv, Constant(w.reshape(n, k, 1, 1))], attrs)
            ref = np.einsum("kp,nk->np", x.reshape(k, m).astype(np.int64) + 3,
                            w.astype(np.int64)).reshape(1, n, c, c)
        else:
            op = Call("qnn.dense", [xv, Constant(w)], {"input_zero_point": -3})
            ref = (x.astype(np.int64) + 3) @ w.astype(np.int64).T
        func = Function([xv], [op])
        paths = [work / f"{shape}_amx.so", work / f"{shape}_loops.so"]
        kiln.build(func, target=args.target).export_library(str(paths[0]))
        shutil.copyfile(paths[0], paths[1])
        mods = []
        for path, amx in zip(paths, ("", "0")):
            os.environ["KILN_AMX"] = amx  # read at the library's first AMX call
            gm = kiln.graph_executor.GraphModule(
                kiln.runtime.load_module(str(path))["default"](kiln.cpu()))
            gm.set_input("x", x)
            gm.run()
            assert np.array_equal(gm.get_output(0).numpy(), ref), f"{shape} {path.name}"
            mods.append(gm)
            if not amx:  # the same handle as the loaded library's (dlopen of one path)
                status = ctypes.CDLL(str(path)).KilnAMXStatus()
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for i, gm in enumerate(mods):
                t0 = time.perf_counter()
                for _ in range(args.repeat):
                    gm.run()
                times[i].append((time.perf_counter() - t0) / args.repeat * 1e6)
        amx, loops = (statistics.median(t) for t in times)
        gops = [2 * m * k * n / t / 1e3 for t in (amx, loops)]
        print(f"{shape}: status {status}  AMX {amx:.1f} us ({gops[0]:.0f} GOP/s)  "
              f"loops {loops:.1f} us ({gops[1]:.0f} GOP/s)  loops/AMX {loops / amx:.2f}  "
              "exact")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
