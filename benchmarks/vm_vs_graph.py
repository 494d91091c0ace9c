"""The VM against the graph executor on one compiled fixed-shape model (decision 014's target:
within 10 %).

Builds the model once (``kiln.build``), exports the graph-executor factory, and exports a VM
executable that does the same work over the same kernel library (the graph JSON translated to
bytecode by ``tests/vm_programs.from_graph_json``, until the VM compiler emits it). Each is
loaded back in its own process (each library has its own thread pool) and timed per call the
way users call them: graph executor ``set_input`` + ``run`` + ``get_output`` (copies in and
out); VM ``vm["main"](x)`` (input used in place when aligned, output copied out). Prints the
best median of each and the ratio; the outputs must agree.

    .venv/bin/python benchmarks/vm_vs_graph.py --model mobilenet_v2 --target c --repeat 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import kiln
from kiln.frontend import from_onnx


def _model(name: str):
    import onnx

    from kiln import models

    if name == "mobilenet_v2":
        return models.mobilenet_v2()
    return models.randomize_weights(onnx.load(models.light_model_path(name)), 0)


def _median_ms(fn, repeat: int, warmup: int) -> tuple[float, float]:
    """Median wall and process-CPU milliseconds per call (CPU time, all threads: with
    ``KILN_NUM_THREADS=1`` it compares the work done even on a loaded machine)."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def _time_engine(engine: str, workdir: str, input_name: str, repeat: int, warmup: int) -> None:
    """Time one engine in this process (each library has its own thread pool: two pools in one
    process would compete for the cores) and print ``ms <median>``."""
    x = np.load(f"{workdir}/x.npy")
    lib = kiln.runtime.load_module(f"{workdir}/{engine}.so")
    if engine == "graph":
        gmod = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))

        def call():
            gmod.set_input(input_name, x)
            gmod.run()
            return gmod.get_output(0)
    else:
        vm = kiln.vm.VirtualMachine(lib)

        def call():
            return vm["main"](x)
    out = call()
    np.save(f"{workdir}/{engine}_out.npy", (out[0] if isinstance(out, tuple) else out).numpy())
    wall, cpu = _median_ms(call, repeat, warmup)
    print(f"ms {wall} {cpu}")


def main(argv: list[str]) -> int:
    import subprocess

    from vm_programs import from_graph_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--target", default="c")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time", choices=("graph", "vm"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.time:
        _time_engine(args.time, args.workdir, args.input, args.repeat, args.warmup)
        return 0

    model = _model(args.model)
    inits = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
    mod, params = from_onnx(model, shape={inp.name: shape})
    factory = kiln.build(mod, target=args.target, params=params)
    exe = from_graph_json(factory.get_graph_json(), factory.lib, factory.get_params())
    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/x.npy", np.random.default_rng(0).standard_normal(shape).astype("float32"))
        factory.export_library(f"{tmp}/graph.so")
        exe.export_library(f"{tmp}/vm.so")
        times: dict[str, list[tuple[float, float]]] = {"graph": [], "vm": []}
        for _ in range(args.rounds):  # alternating processes, so drift hits both alike
            for engine in ("graph", "vm"):
                out = subprocess.run(
                    [sys.executable, __file__, "--time", engine, "--workdir", tmp, "--input",
                     inp.name, "--repeat", str(args.repeat), "--warmup", str(args.warmup)],
                    check=True, capture_output=True, text=True).stdout
                times[engine].append(tuple(float(v) for v in out.split()[-2:]))
        np.testing.assert_allclose(np.load(f"{tmp}/vm_out.npy"), np.load(f"{tmp}/graph_out.npy"),
                                   rtol=1e-5, atol=1e-5)
    kernels = sum(1 for f in exe.functions if not f.name.startswith("vm.builtin."))
    for i, what in enumerate(("wall", "cpu")):
        g = min(t[i] for t in times["graph"])
        v = min(t[i] for t in times["vm"])
        print(f"{args.model} ({args.target}, {kernels} kernels), {what}: graph executor "
              f"{g:.3f} ms, VM {v:.3f} ms, VM/graph = {v / g:.3f} (best median of "
              f"{args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
