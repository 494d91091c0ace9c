"""Per conv shape inside a whole model: Kiln's kernels against onnxruntime's nodes, 1 thread.

Builds the model with Kiln (``--target``, default ``llvm -mcpu=native``) and loads its debug
executor; opens an onnxruntime session with ``enable_profiling``. Then alternates ``--passes``
times: one Kiln pass timing each kernel call in place (wall and thread CPU time, as
``tune_per_kernel.node_times``) and one onnxruntime run (its profile's ``*_kernel_time`` events:
wall µs, the only per-node time it records). Convolutions are matched by shape — (input
channels, output channels, kernel, input and output plane), read from Kiln's blocked weight and
data entries and from onnxruntime's node input shapes — and the per-call medians (and the
fastest calls) summed per shape::

    PYTHONPATH=src .venv/bin/python benchmarks/conv_vs_ort.py --model resnet50 --passes 30

Prints a markdown table per shape (calls in the model, Kiln's median thread CPU and fastest wall
µs per model run, onnxruntime's median and fastest wall µs, both ratios, Kiln GFLOP/s) sorted by
the absolute loss, then the rest of each engine's nodes by kind. On a loaded machine the
fastest-of-N wall times compare the engines best (Kiln's thread CPU medians spread more).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--passes", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the per-shape rows here")
    return p.parse_args(argv)


ShapeKey = tuple[int, int, int, int, int, int, int, int]  # ci, co, kh, kw, ih, iw, oh, ow


def kiln_conv_key(graph, nid: int) -> ShapeKey | None:
    """The conv shape of a Kiln node: its 6-D blocked weight ``[co/b, ci/ib, kh, kw, ib, b]``
    (depthwise: ``[co/b, 1, kh, kw, 1, b]``), its data (first input) and its output."""
    node = graph.nodes[nid]
    if "conv2d" not in node.func_name:
        return None
    shapes = [graph.shape[graph.entry_id(s, i)] for s, i in node.inputs]
    weight = next((s for s in shapes if len(s) == 6), None)
    if weight is None:
        return None
    data, out = shapes[0], graph.shape[graph.entry_id(nid)]
    co, ci = weight[0] * weight[5], weight[1] * weight[4]
    if "depthwise" in node.func_name:
        ci = 1
    return (ci, co, weight[2], weight[3], data[2], data[3], out[2], out[3])


def ort_conv_key(event: dict) -> ShapeKey | None:
    """The conv shape of an onnxruntime profile event (``Conv``, ``FusedConv``, NCHWc
    ``Conv``): input ``[n, c, h, w]`` (channels padded to its block), weight
    ``[co, ci / group, kh, kw]``, output ``[n, co, oh, ow]``."""
    args = event.get("args", {})
    if "Conv" not in args.get("op_name", ""):
        return None
    ins = [next(iter(d.values())) for d in args["input_type_shape"]]
    out = next(iter(args["output_type_shape"][0].values()))
    data, weight = ins[0], ins[1]
    return (weight[1], weight[0], weight[2], weight[3], data[2], data[3], out[2], out[3])


def kiln_times(ex, passes_cpu: dict, passes_wall: dict) -> None:
    ex._run_prologue()
    for nid, op in zip(ex._op_nids, ex._op_execs):
        t0, c0 = time.perf_counter(), time.thread_time()
        op()
        passes_cpu[nid].append(time.thread_time() - c0)
        passes_wall[nid].append(time.perf_counter() - t0)
    ex._run_epilogue()


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["KILN_NUM_THREADS"] = "1"
    import onnxruntime as ort

    import kiln
    from kiln.frontend import from_onnx
    from models import input_shapes, load_model

    model = load_model(args.model, args.seed)
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(s).astype(np.float32)
             for k, s in input_shapes(model).items()}
    with tempfile.TemporaryDirectory() as tmp:
        mod, params = from_onnx(model)
        path = str(Path(tmp) / "m.so")
        kiln.build(mod, target=args.target, params=params).export_library(path)
        ex = kiln.runtime.load_module(path)["debug_create"]("default", kiln.cpu())
        for k, v in feeds.items():
            ex.set_input(k, v)
        ex.run()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        cpu, wall = defaultdict(list), defaultdict(list)
        for _ in range(args.passes):
            kiln_times(ex, cpu, wall)
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    ort_us: dict[str, list[float]] = defaultdict(list)
    ort_event: dict[str, dict] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ort_us[e["name"]].append(e["dur"])
            ort_event[e["name"]] = e
    g = ex.graph
    rows: dict[ShapeKey, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    other = defaultdict(lambda: defaultdict(float))
    for nid in ex._op_nids:
        key = kiln_conv_key(g, nid)
        us_cpu, us_wall = statistics.median(cpu[nid]) * 1e6, min(wall[nid]) * 1e6
        us_wall_median = statistics.median(wall[nid]) * 1e6
        if key is None:
            kind = g.nodes[nid].func_name.split("_", 1)[-1].rstrip("_0123456789")[:40]
            other[kind]["kiln"] += us_cpu
            continue
        r = rows[key]
        r["calls"] += 1
        r["kiln"] += us_cpu
        r["kiln_wall"] += us_wall
        r["kiln_wall_median"] += us_wall_median
    ort_runs = args.passes + 1
    for name, durs in ort_us.items():
        key = ort_conv_key(ort_event[name])
        timed = durs[-args.passes:] if len(durs) >= ort_runs else [0.0]
        us, us_min = statistics.median(timed), min(timed)
        if key is None or key not in rows:
            op = ort_event[name]["args"]["op_name"]
            other[op if key is None else f"{op} {key} (no Kiln match)"]["ort"] += us
            continue
        rows[key]["ort"] += us
        rows[key]["ort_min"] += us_min
        rows[key]["ort_calls"] += 1
    print(f"{args.model}, {args.target}, 1 thread, {args.passes} alternating passes, per-call "
          f"medians (fastest) summed per shape; Kiln thread CPU (fastest wall), onnxruntime "
          f"profile wall (fastest); ratios of the medians (of the fastest); "
          f"load {os.getloadavg()[0]:.1f}\n")
    print("| ci→co k×k in→out | calls (kiln/ort) | Kiln µs | ORT µs | Kiln/ORT | "
          "loss µs | Kiln GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    total = [0.0, 0.0, 0.0, 0.0]
    for key, r in sorted(rows.items(), key=lambda kv: kv[1]["ort"] - kv[1]["kiln"]):
        ci, co, kh, kw, ih, iw, oh, ow = key
        gflop = 2 * ci * co * kh * kw * oh * ow * r["calls"] / 1e9
        ratio = r["kiln"] / r["ort"] if r["ort"] else float("nan")
        fastest = r["kiln_wall"] / r["ort_min"] if r["ort_min"] else float("nan")
        total = [a + r[k] for a, k in zip(total, ("kiln", "ort", "kiln_wall", "ort_min"))]
        print(f"| {ci}→{co} {kh}×{kw} {ih}×{iw}→{oh}×{ow} | {r['calls']:.0f}/"
              f"{r['ort_calls']:.0f} | {r['kiln']:.0f} ({r['kiln_wall']:.0f}) | "
              f"{r['ort']:.0f} ({r['ort_min']:.0f}) | {ratio:.2f} ({fastest:.2f}) | "
              f"{r['kiln'] - r['ort']:+.0f} | "
              f"{gflop / (r['kiln'] * 1e-6):.1f} |")
    print(f"\nconvs: Kiln {total[0] / 1e3:.2f} ms ({total[2] / 1e3:.2f}), onnxruntime "
          f"{total[1] / 1e3:.2f} ms ({total[3] / 1e3:.2f}); {total[0] / total[1]:.3f} "
          f"({total[2] / total[3]:.3f})\n\nother nodes (µs per model run):")
    for kind, r in sorted(other.items(), key=lambda kv: -max(kv[1].values())):
        print(f"  {kind:60s} kiln {r['kiln']:8.0f}  ort {r['ort']:8.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"shape": list(k), **v} for k, v in rows.items()], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
