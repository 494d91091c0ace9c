"""Transformer and OCR encoders: Kiln vs onnxruntime at fixed shapes (issue 17's encoder targets).

Cases: paraphrase-MiniLM-L3-v2 (``kiln.models`` wheel ``minilm_l3``) at [1, 32] and [1, 128]
tokens, in float32 and dynamically quantized to int8 (``kiln.models.dynamic_int8``), and the
PP-OCRv4 text detector at 1x3x480x640 and recognizer at 1x3x48x320 (wheels
``ppocrv4_det`` / ``ppocrv4_rec``). Each is compiled once per shape (static graph executor build,
``--target``, default ``llvm -mcpu=native``); then, per thread count, a child process (with
``KILN_NUM_THREADS`` set before the libraries load) times Kiln and an onnxruntime session side
by side in three alternating blocks, so machine load hits both alike. Reported: median ms of
each, Kiln / ORT, and the geometric mean of the ratios.

    .venv/bin/python benchmarks/encoders.py [--threads 1,2] [--repeat 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from dynamic import _time_blocks

#: (case name, wheel file, {input: shape})
CASES = [
    ("minilm 1x32", "minilm_l3", {"input_ids": (1, 32), "attention_mask": (1, 32)}),
    ("minilm 1x128", "minilm_l3", {"input_ids": (1, 128), "attention_mask": (1, 128)}),
    # quantize_dynamic's int8 MiniLM (kiln.models.dynamic_int8): both engines' int8 kernels
    ("minilm int8 1x32", "minilm_l3:int8", {"input_ids": (1, 32), "attention_mask": (1, 32)}),
    ("minilm int8 1x128", "minilm_l3:int8", {"input_ids": (1, 128),
                                             "attention_mask": (1, 128)}),
    ("ppocrv4 det 480x640", "ppocrv4_det", {"x": (1, 3, 480, 640)}),
    ("ppocrv4 rec 48x320", "ppocrv4_rec", {"x": (1, 3, 48, 320)}),
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per engine and block")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # the JSON file of compiled cases
    return p.parse_args(argv)


def feed_inputs(shapes: dict, rng) -> dict[str, np.ndarray]:
    """Seeded inputs of one case: token ids (int64) and an all-ones attention mask for the
    encoders, uniform float32 images for the others."""
    if "input_ids" in shapes:
        shape = shapes["input_ids"]
        return {"input_ids": rng.integers(1000, 30000, shape).astype("int64"),
                "attention_mask": np.ones(shape, "int64")}
    return {k: rng.uniform(-1, 1, s).astype("float32") for k, s in shapes.items()}


def case_model_path(wheel: str, workdir: Path) -> Path:
    """The ONNX file of a case's ``wheel`` entry of CASES: the cached wheel file, or (``:int8``)
    its ``quantize_dynamic`` copy written to ``workdir``."""
    from kiln.models import dynamic_int8
    from kiln.models.fetch import wheel_file_path

    path = wheel_file_path(wheel.split(":")[0])
    return dynamic_int8(path, workdir) if wheel.endswith(":int8") else path


def compile_cases(target: str, workdir: Path, only: str = "") -> list[dict]:
    """Each case compiled to a ``.so`` in ``workdir``: [{name, onnx, so, shapes}]."""
    import onnx

    import kiln
    from kiln.frontend import from_onnx

    out = []
    for k, (name, wheel, shapes) in enumerate(CASES):
        if only and name not in only.split(","):
            continue
        path = case_model_path(wheel, workdir)
        mod, params = from_onnx(onnx.load(path), shape=shapes)
        so = workdir / f"case{k}.so"
        kiln.build(mod, target=target, params=params).export_library(str(so))
        out.append({"name": name, "onnx": str(path), "so": str(so),
                    "shapes": {i: list(s) for i, s in shapes.items()}})
        print(f"compiled {name}", file=sys.stderr)
    return out


def time_cases(cases: list[dict], threads: int, repeat: int) -> list[dict]:
    """Kiln and onnxruntime medians per case at ``threads`` (this process's KILN_NUM_THREADS)."""
    import onnxruntime as ort

    import kiln

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    rng = np.random.default_rng(0)
    rows = []
    for case in cases:
        feed = feed_inputs({k: tuple(v) for k, v in case["shapes"].items()}, rng)
        sess = ort.InferenceSession(case["onnx"], opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        gmod = kiln.graph_executor.GraphModule(
            kiln.runtime.load_module(case["so"])["default"](kiln.cpu()))
        for k, v in feed.items():
            gmod.set_input(k, v)
        ort_feed = {k: v for k, v in feed.items() if k in names}

        def kiln_run(g=gmod):
            g.run()
            g.get_output(0)

        times = _time_blocks({"kiln": kiln_run,
                              "ort": lambda s=sess, f=ort_feed: s.run(None, f)}, repeat)
        rows.append({"case": case["name"], "threads": threads, "kiln_ms": times["kiln"],
                     "ort_ms": times["ort"], "ratio": times["kiln"] / times["ort"]})
        print(f"{case['name']} @{threads}: kiln {times['kiln']:.3f} ms, "
              f"ort {times['ort']:.3f} ms", file=sys.stderr)
    return rows


def report(rows: list[dict], args) -> str:
    lines = [f"# Encoders: Kiln ({args.target}) vs onnxruntime", "",
             f"CPU: {_cpu()}; load average at end: {os.getloadavg()[0]:.2f}", "",
             "| case | threads | Kiln ms | ORT ms | Kiln / ORT |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['threads']} | {r['kiln_ms']:.3f} | "
                     f"{r['ort_ms']:.3f} | {r['ratio']:.2f} |")
    for t in sorted({r["threads"] for r in rows}):
        ratios = [r["ratio"] for r in rows if r["threads"] == t]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(f"\ngeomean Kiln / ORT at {t} thread(s): {geo:.2f}")
    return "\n".join(lines) + "\n"


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        cases = json.loads(Path(args.child).read_text())
        threads = int(os.environ["KILN_NUM_THREADS"])
        print(json.dumps(time_cases(cases, threads, args.repeat)))
        return 0
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = work / "cases.json"
        spec.write_text(json.dumps(compile_cases(args.target, work, args.cases)))
        for t in (int(x) for x in args.threads.split(",")):
            env = {**os.environ, "KILN_NUM_THREADS": str(t), "OMP_NUM_THREADS": str(t)}
            child = subprocess.run([sys.executable, __file__, "--child", str(spec),
                                    "--repeat", str(args.repeat), "--target", args.target],
                                   env=env, check=True, capture_output=True, text=True)
            sys.stderr.write(child.stderr)
            rows += json.loads(child.stdout.strip().splitlines()[-1])
    text = report(rows, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "encoders.md").write_text(text)
    (out / "encoders.json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
