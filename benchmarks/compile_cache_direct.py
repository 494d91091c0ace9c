"""CPU time of a tiny model's build + export with a warm compile cache, per Kiln source tree:
what the compile cache's direct mode (docs/decisions/029-compile-cache-direct-mode.md) saves.

    python benchmarks/compile_cache_direct.py --src OLD_CHECKOUT/src,src [--rounds 5] [--n 5]
                                              [--cold]

For each round, one fresh worker process per source tree (alternating, so both see the same
machine load) imports Kiln from that tree, builds a one-``Relu`` ONNX model for target ``c``
(``kiln.build`` + ``export_library``) once to warm the cache (a cache folder shared by all
workers of one tree), then times ``--n`` more build + export runs. Time is the process's CPU
time *with its children* (``getrusage``: user + system of this process and of the compilers it
waited for), robust to other processes on shared cores. Prints the median per tree and the load
average. With ``--cold`` every timed build gets a fresh, empty cache folder instead (every key
a miss: what recording the manifests costs on top of the compiles).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(n: int, out_dir: str, cold: bool) -> None:
    """Build + export a one-Relu model ``n + 1`` times; print the CPU seconds of the last n
    (with ``cold``, each in a fresh cache folder)."""
    import onnx
    from onnx import TensorProto, helper

    import kiln

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    times = []
    for k in range(n + 1):
        if cold:
            os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(dir=out_dir)
        start = cpu_seconds()
        mod, params = kiln.frontend.from_onnx(model)
        lib = kiln.build(mod, target="c", params=params)
        lib.export_library(os.path.join(out_dir, f"relu{k}.so"))
        times.append(cpu_seconds() - start)
    print(json.dumps(times[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True,
                        help="comma-separated Kiln source trees (folders holding kiln/)")
    parser.add_argument("--rounds", type=int, default=5, help="worker processes per tree")
    parser.add_argument("--n", type=int, default=5, help="timed build + exports per worker")
    parser.add_argument("--cold", action="store_true", help="an empty cache for every build")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.n, args.out, args.cold)
        return
    trees = [os.path.abspath(s) for s in args.src.split(",")]
    results: dict[str, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="kiln-direct-bench-") as scratch:
        for _ in range(args.rounds):
            for i, tree in enumerate(trees):
                env = dict(os.environ, PYTHONPATH=tree,
                           KILN_CACHE_DIR=os.path.join(scratch, f"cache{i}"))
                env.pop("KILN_NO_CACHE", None)
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", "--n", str(args.n), "--out", scratch,
                     "--src", tree, *(["--cold"] if args.cold else [])],
                    env=env, capture_output=True, text=True, check=True)
                results[tree] += json.loads(out.stdout.strip().splitlines()[-1])
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"load average at end: {' '.join(load)}")
    for tree, times in results.items():
        print(f"{tree}: median {statistics.median(times) * 1000:.0f} ms CPU per build + export "
              f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, n={len(times)})")


if __name__ == "__main__":
    main()
