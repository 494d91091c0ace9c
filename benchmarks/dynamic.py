"""Symbolic shapes: one VM artifact vs a static Kiln build per shape vs onnxruntime.

For each shape of a model with symbolic dims (paraphrase-MiniLM-L3 by default), in one process:
the VM artifact compiled once (``kiln.build`` with the dims symbolic), a graph-executor build
compiled for that shape alone, and an onnxruntime session; each timed in alternating blocks
(VM, static, ORT, repeated three times) so machine load hits all three alike. Reported per
shape: median latency of each, VM / static and VM / ORT, the geometric means, and the VM's own
difference per call (the VM's own work: shape checks, replay, copies of the results).

Memory (a child process per measurement): peak RSS of the VM after running only the largest
shape, and after 1,000 calls at random sequence lengths 1..384 — the VM's arena grows to the
largest shape and is reused, so the two should be within 10 %.

    .venv/bin/python benchmarks/dynamic.py [--threads 1] [--repeat 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = [(1, 1), (1, 7), (1, 32), (1, 128), (4, 33), (2, 384)]
BOUNDS = {"sequence_length": (1, 512)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=20, help="timed runs per engine and block")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--memory-calls", type=int, default=1000)
    p.add_argument("--rss-child", choices=["largest", "random"], help=argparse.SUPPRESS)
    p.add_argument("--so", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _inputs(batch: int, seq: int, rng) -> dict[str, np.ndarray]:
    ids = rng.integers(1000, 30000, (batch, seq)).astype("int64")
    return {"input_ids": ids, "attention_mask": np.ones((batch, seq), "int64")}


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _time_blocks(engines: dict, repeat: int) -> dict[str, float]:
    """Median ms per engine over three alternating blocks (after a pause, so one engine's
    spinning threads do not steal the next one's core)."""
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for fn in engines.values():
        fn()
        fn()
    for _ in range(3):
        for name, fn in engines.items():
            time.sleep(0.2)
            samples[name].append(_median_ms(fn, repeat))
    return {k: statistics.median(v) for k, v in samples.items()}


def compile_vm(path: Path, target: str, out: Path) -> Path:
    import onnx

    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(onnx.load(path), dim_bounds=BOUNDS)
    kiln.build(mod, target=target, params=params).export_library(str(out))
    return out


def static_module(path: Path, shape, target: str, workdir: Path):
    import onnx

    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(onnx.load(path), shape={"input_ids": shape,
                                                    "attention_mask": shape})
    so = workdir / f"static_{shape[0]}x{shape[1]}.so"
    kiln.build(mod, target=target, params=params).export_library(str(so))
    loaded = kiln.runtime.load_module(str(so))
    return kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))


def bench_shapes(args, model: Path, vm_so: Path, workdir: Path) -> list[dict]:
    import onnxruntime as ort

    import kiln
    from kiln.vm import VirtualMachine

    vm = VirtualMachine(kiln.runtime.load_module(str(vm_so)), kiln.cpu())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    rows = []
    for shape in SHAPES:
        feed = _inputs(*shape, rng)
        gmod = static_module(model, shape, args.target, workdir)
        for k, v in feed.items():
            gmod.set_input(k, v)
        ids, mask = feed["input_ids"], feed["attention_mask"]

        def static(g=gmod):
            g.run()
            g.get_output(3)

        times = _time_blocks({"vm": lambda i=ids, m=mask: vm["main"](i, m), "static": static,
                              "ort": lambda f=feed: sess.run(None, f)}, args.repeat)
        rows.append({"shape": list(shape), **{f"{k}_ms": v for k, v in times.items()},
                     "vm_static": times["vm"] / times["static"],
                     "vm_ort": times["vm"] / times["ort"],
                     "vm_minus_static_us": (times["vm"] - times["static"]) * 1e3})
        print(f"{shape}: vm {times['vm']:.3f} ms, static {times['static']:.3f} ms, "
              f"ort {times['ort']:.3f} ms", file=sys.stderr)
    return rows


def rss_child(args) -> None:
    """Print the peak RSS (MiB) after the largest shape only, or after random lengths.

    VmHWM of /proc/self/status, not getrusage: ru_maxrss survives execve, so a child started
    by the (large) harness would report the harness's peak."""
    import kiln
    from kiln.vm import VirtualMachine

    vm = VirtualMachine(kiln.runtime.load_module(args.so), kiln.cpu())
    rng = np.random.default_rng(1)
    feed = _inputs(1, 384, rng)
    vm["main"](feed["input_ids"], feed["attention_mask"])
    if args.rss_child == "random":
        for seq in rng.integers(1, 385, args.memory_calls):
            feed = _inputs(1, int(seq), rng)
            vm["main"](feed["input_ids"], feed["attention_mask"])
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    print(int(hwm.split()[1]) / 1024)


def peak_rss(args, so: Path, mode: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--rss-child", mode, "--so", str(so),
                          "--memory-calls", str(args.memory_calls)],
                         check=True, capture_output=True, text=True, env=_env(args))
    return float(out.stdout.strip().splitlines()[-1])


def _env(args) -> dict:
    env = dict(os.environ)
    env["KILN_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(args.threads)
    return env


def report(rows: list[dict], rss: dict, args) -> str:
    def geo(key):
        return float(np.exp(np.mean([np.log(r[key]) for r in rows])))

    plural = "s" if args.threads > 1 else ""
    title = (f"## paraphrase-MiniLM-L3, one VM artifact vs static builds ({args.threads} "
             f"thread{plural}, {args.target})")
    lines = [title, "",
             "| shape | VM ms | static ms | ORT ms | VM/static | VM/ORT | VM − static µs |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b, s = r["shape"]
        lines.append(f"| {b}×{s} | {r['vm_ms']:.3f} | {r['static_ms']:.3f} | {r['ort_ms']:.3f} "
                     f"| {r['vm_static']:.2f} | {r['vm_ort']:.2f} "
                     f"| {r['vm_minus_static_us']:.0f} |")
    lines.append(f"| geomean | | | | {geo('vm_static'):.2f} | {geo('vm_ort'):.2f} | |")
    growth = 100 * (rss["random"] / rss["largest"] - 1)
    lines += ["", (f"Peak RSS: largest shape (1×384) only {rss['largest']:.1f} MiB; after "
                   f"{args.memory_calls} calls at random lengths 1..384 {rss['random']:.1f} MiB "
                   f"(+{growth:.1f} %).")]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        rss_child(args)
        return 0
    os.environ.update(_env(args))
    from kiln.models.fetch import wheel_file_path

    model = wheel_file_path("minilm_l3")
    with tempfile.TemporaryDirectory(prefix="kiln-dynamic-") as tmp:
        workdir = Path(tmp)
        vm_so = compile_vm(model, args.target, workdir / "vm.so")
        rows = bench_shapes(args, model, vm_so, workdir)
        rss = {mode: peak_rss(args, vm_so, mode) for mode in ("largest", "random")}
    text = report(rows, rss, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dynamic.md").write_text(text + "\n")
    (out / "dynamic.json").write_text(json.dumps({"rows": rows, "rss_mib": rss,
                                                  "threads": args.threads,
                                                  "target": args.target}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
