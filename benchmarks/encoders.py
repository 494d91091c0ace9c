"""Transformer and OCR encoders: Kiln vs onnxruntime and OpenVINO at fixed shapes (issue 17).

Cases: paraphrase-MiniLM-L3-v2 (``kiln.models`` wheel ``minilm_l3``) at [1, 32] and [1, 128]
tokens, in float32 and dynamically quantized to int8 (``kiln.models.dynamic_int8``), and the
PP-OCRv4 text detector at 1x3x480x640 and recognizer at 1x3x48x320 (wheels
``ppocrv4_det`` / ``ppocrv4_rec``). Each is compiled once per shape (static graph executor build,
``--target``, default ``llvm -mcpu=native``); then, per thread count, a child process (with
``KILN_NUM_THREADS`` set before the libraries load) checks Kiln's and OpenVINO's outputs
against onnxruntime's and times Kiln, an onnxruntime session and an OpenVINO model (``peers.py``;
``-`` where it is not installed) side by side in three alternating blocks, so machine load hits
all alike. Reported: median ms of each, Kiln / ORT, Kiln / best peer, and the geometric means of
the ratios; the committed summary goes to ``results/summary/`` (``summary.py``).

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
import peers
import summary
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
    p.add_argument("--summary", default="encoders",
                   help="name of the committed summary, benchmarks/results/summary/"
                        "NAME-<machine class>.{json,md}; '' writes none (default: encoders)")
    p.add_argument("--note", default="",
                   help="a sentence recorded with the results, e.g. that the machine was busy")
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


def load_engines(case: dict, feed: dict, threads: int, missing: dict) -> tuple[dict, dict]:
    """Kiln's library and the installed peers for one case: (name → one inference returning
    the outputs, name → why a peer other than onnxruntime failed to load)."""
    import kiln

    gmod = kiln.graph_executor.GraphModule(
        kiln.runtime.load_module(case["so"])["default"](kiln.cpu()))
    for k, v in feed.items():
        gmod.set_input(k, v)

    def kiln_run(g=gmod):
        g.run()
        return [g.get_output(i).numpy() for i in range(g.get_num_outputs())]

    runs, errors = peers.load_peers([p for p in peers.PEERS if p not in missing],
                                    case["onnx"], feed, threads, "int8" in case["name"])
    return {"kiln": kiln_run, **runs}, errors


def time_cases(cases: list[dict], threads: int, repeat: int) -> list[dict]:
    """Medians (ms) of Kiln and the installed peers per case at ``threads`` (this process's
    KILN_NUM_THREADS), with the output checks of :func:`peers.check_outputs`."""
    missing = peers.missing_peers()
    rng = np.random.default_rng(0)
    rows = []
    for case in cases:
        feed = feed_inputs({k: tuple(v) for k, v in case["shapes"].items()}, rng)
        runs, errors = load_engines(case, feed, threads, missing)
        row = {"case": case["name"], "threads": threads,
               **peers.check_outputs(runs, errors, "int8" in case["name"])}
        times = _time_blocks(runs, repeat)
        row |= {f"{name}_ms": times.get(name) for name in ("kiln", *peers.PEERS)}
        row |= {f"{name}_error": msg for name, msg in errors.items()}
        row["ratio"] = row["kiln_ms"] / row["ort_ms"]
        row |= peers.kiln_over_best_peer(row)
        rows.append(row)
        print(f"{case['name']} @{threads}: " + ", ".join(
            f"{n} {times[n]:.3f} ms" for n in times), file=sys.stderr)
    return rows


def _cell(row: dict, peer: str) -> str:
    if row.get(f"{peer}_error"):
        return "failed"
    ms = row.get(f"{peer}_ms")
    cell = "-" if ms is None else f"{ms:.3f}"
    return cell if row.get(f"{peer}_ok", True) else f"{cell} ⚠ wrong"


def _err(row: dict, name: str) -> str:
    if row.get(f"{name}_err") is None:
        return "-"
    return f"{row[f'{name}_err']:.1e}" + ("" if row[f"{name}_ok"] else " ⚠")


def _notes(rows: list[dict], missing: dict) -> list[str]:
    notes = [f"- {peers.PEERS[p]}: not run, {why}" for p, why in missing.items()]
    for r in rows:
        where = f"{r['case']} at {r['threads']} thread(s)"
        for name, label in (("kiln", "Kiln"), ("openvino", "OpenVINO")):
            if r.get(f"{name}_error"):
                notes.append(f"- {label} failed on {where}: {r[f'{name}_error']}")
            elif r.get(f"{name}_ok") is False:
                notes.append(f"- {label}'s outputs disagree with onnxruntime's on {where} "
                             f"(max abs err {r[f'{name}_err']:.2e})")
    return notes


def report(rows: list[dict], args) -> str:
    """The markdown report: one row per case and thread count, geometric means, peer notes."""
    lines = [f"# Encoders: Kiln ({args.target}) vs onnxruntime and OpenVINO", "",
             f"CPU: {_cpu()}; load average at end: {os.getloadavg()[0]:.2f}", ""]
    if args.note:
        lines += [f"Note: {args.note}", ""]
    lines += ["| case | threads | Kiln ms | ORT ms | OpenVINO ms | Kiln / ORT | Kiln / best peer "
              "| Kiln err | OpenVINO err |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = "-" if r["kiln_best_peer"] is None else f"{r['kiln_best_peer']:.2f}"
        lines.append(f"| {r['case']} | {r['threads']} | {r['kiln_ms']:.3f} | "
                     f"{r['ort_ms']:.3f} | {_cell(r, 'openvino')} | {r['ratio']:.2f} | "
                     f"{best} | {_err(r, 'kiln')} | {_err(r, 'openvino')} |")
    for t in sorted({r["threads"] for r in rows}):
        sel = [r for r in rows if r["threads"] == t]
        lines.append(f"\ngeomean Kiln / ORT at {t} thread(s): "
                     f"{_geomean([r['ratio'] for r in sel]):.2f}")
        best = [r["kiln_best_peer"] for r in sel if r["kiln_best_peer"] is not None]
        if best:
            lines.append(f"geomean Kiln / best peer at {t} thread(s): {_geomean(best):.2f}")
    notes = _notes(rows, peers.missing_peers())
    if notes:
        lines += ["", "Peers:", "", *notes]
    return "\n".join(lines) + "\n"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = peers.missing_peers()
    if "ort" in missing:  # the reference every output is checked against
        sys.exit(f"encoders.py: {missing['ort']}")
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
    if args.summary:
        settings = (f"encoders.py, target `{args.target}`, median of 3 block medians of "
                    f"{args.repeat} runs, threads {args.threads}")
        path, text = summary.write_summary(
            args.summary, [summary.summary_row(r["case"], r) for r in rows],
            summary.machine_info(), note=args.note, settings=settings)
        print(text)
        print(f"wrote {path} and {path.with_suffix('.md').name} (commit them)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
