"""Latency under load: Kiln vs onnxruntime while other processes keep the cores busy.

Issue 17: with OpenMP's busy-waiting team, Kiln at 2 threads on a machine whose 2 cores were
shared with two busy processes had a median of 5.6 ms but spikes of 300 ms on a model that takes
1.3 ms alone (onnxruntime: max 15 ms). Serving users see the tail, so this reports p50, p99 and
max of every inference, and the target: Kiln's p99 <= 1.5x onnxruntime's.

How a run goes: compile the model once (``models.py``'s models and settings), start ``--busy``
background processes that spin in a Python loop, then in this process
load the Kiln library and an onnxruntime session side by side (``--threads`` each:
``KILN_NUM_THREADS`` set before the library's first launch, ``intra_op_num_threads``), warm both
up and run ``--blocks`` alternating blocks of ``--runs`` inferences (Kiln, ORT, Kiln, ...), each
after a pause of 0.2 s so that neither engine's idle spinning leaks into the other's block. Every
latency is kept; the background processes are stopped at the end. ``--busy 0`` gives the
unloaded numbers.

    .venv/bin/python benchmarks/load.py                       # squeezenet, 2 threads, 2 busy
    .venv/bin/python benchmarks/load.py --model mobilenet_v2 --threads 1 --busy 0

Output: a markdown table on stdout and in ``DIR/load.md``, every latency in ``DIR/load.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # benchmarks/models.py: the models, their inputs and the compile

PAUSE_S = 0.2
TARGET_RATIO = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="squeezenet", choices=models.ALL_MODELS)
    p.add_argument("--threads", type=int, default=2, help="threads of each engine (default 2)")
    p.add_argument("--busy", type=int, default=2, help="busy background processes (default 2)")
    p.add_argument("--blocks", type=int, default=10, help="alternating blocks per engine")
    p.add_argument("--runs", type=int, default=100, help="inferences per block (default 100)")
    p.add_argument("--warmup", type=int, default=20, help="untimed inferences of each first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default="llvm -mcpu=native", help="Kiln target")
    p.add_argument("--byoc", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    return p.parse_args(argv)


#: the load: spin until stopped, or until this process is gone (it was killed)
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


def start_busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin (the load); stopped by :func:`stop_busy`."""
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def stats(times: list[float]) -> dict:
    t = np.asarray(times)
    return {"p50": float(np.percentile(t, 50)), "p99": float(np.percentile(t, 99)),
            "max": float(t.max()), "mean": float(t.mean()), "n": len(times)}


def measure(fns: dict, blocks: int, runs: int, warmup: int) -> dict[str, list[float]]:
    """Latencies (ms) of each engine's ``blocks * runs`` inferences in alternating blocks."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            time.sleep(PAUSE_S)
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def report(args: argparse.Namespace, res: dict[str, dict]) -> str:
    k, o = res["kiln"], res["ort"]
    ratio = k["p99"] / o["p99"]
    lines = [
        (f"## {args.model}: {args.threads} thread(s), {args.busy} busy process(es), "
         f"{os.cpu_count()} CPUs, {k['n']} inferences each"),
        "",
        "| engine | p50 (ms) | p99 (ms) | max (ms) | mean (ms) |",
        "|---|---|---|---|---|",
        *(f"| {name} | {r['p50']:.2f} | {r['p99']:.2f} | {r['max']:.2f} | {r['mean']:.2f} |"
          for name, r in (("Kiln", k), ("ORT", o))),
        "",
        (f"Kiln/ORT: p50 {k['p50'] / o['p50']:.2f}, p99 {ratio:.2f}, max "
         f"{k['max'] / o['max']:.2f} (target: p99 <= {TARGET_RATIO}: "
         f"{'met' if ratio <= TARGET_RATIO else 'NOT met'})"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["KILN_NUM_THREADS"] = str(args.threads)  # before the library's first launch
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # (a libgomp-based Kiln reads this)
    with tempfile.TemporaryDirectory(prefix="kiln-load-") as work:
        built = models.compile_model(args.model, args, Path(work))
        so = built["so"]
        from worker import make_feeds, ort_runner

        from kiln.graph_executor import GraphModule
        from kiln.runtime import cpu, load_module

        feeds = make_feeds(built["inputs"], args.seed)
        gmod = GraphModule(load_module(so)["default"](cpu()))

        def kiln_run() -> None:
            for name, value in feeds.items():
                gmod.set_input(name, value)
            gmod.run()
            for i in range(gmod.get_num_outputs()):
                gmod.get_output(i).numpy()

        fns = {"kiln": kiln_run, "ort": ort_runner(built["onnx"], feeds, args.threads)}
        busy = start_busy(args.busy)
        try:
            time.sleep(0.5)  # the load is up
            times = measure(fns, args.blocks, args.runs, args.warmup)
        finally:
            stop_busy(busy)
    res = {name: stats(t) for name, t in times.items()}
    text = report(args, res)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.md").write_text(text)
    (out / "load.json").write_text(json.dumps({"settings": vars(args), "stats": res,
                                               "times_ms": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
