"""The VM against the graph executor on one compiled fixed-shape model (decision 014's target:
within 10 %).

Builds the model once (``kiln.build``), exports the graph-executor factory, and exports a VM
executable that does the same work over the same kernel library (the graph JSON translated to
bytecode by ``tests/vm_programs.from_graph_json``, until the VM compiler emits it). Both are
loaded back and timed per call from Python the way users call them: graph executor
``set_input`` + ``run`` + ``get_output`` (copies in and out); VM ``vm["main"](x)`` (input used in
place when aligned, output copied out). Prints the medians and the ratio.

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


def _median_ms(fn, repeat: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str]) -> int:
    from vm_programs import from_graph_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--target", default="c")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)

    model = _model(args.model)
    inits = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
    mod, params = from_onnx(model, shape={inp.name: shape})
    factory = kiln.build(mod, target=args.target, params=params)
    exe = from_graph_json(factory.get_graph_json(), factory.lib, factory.get_params())
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    with tempfile.TemporaryDirectory() as tmp:
        factory.export_library(f"{tmp}/graph.so")
        exe.export_library(f"{tmp}/vm.so")
        gmod = kiln.graph_executor.GraphModule(
            kiln.runtime.load_module(f"{tmp}/graph.so")["default"](kiln.cpu()))
        vm = kiln.vm.VirtualMachine(kiln.runtime.load_module(f"{tmp}/vm.so"))

        def graph_call():
            gmod.set_input(inp.name, x)
            gmod.run()
            return gmod.get_output(0)

        def vm_call():
            return vm["main"](x)

        want = graph_call().numpy()
        got = vm_call()
        got = got[0] if isinstance(got, tuple) else got
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        rounds = []
        for _ in range(3):  # interleaved, so drift hits both alike
            g = _median_ms(graph_call, args.repeat, args.warmup)
            v = _median_ms(vm_call, args.repeat, args.warmup)
            rounds.append((g, v))
        g = min(r[0] for r in rounds)
        v = min(r[1] for r in rounds)
        kernels = sum(1 for n in exe.functions if not n.name.startswith("vm.builtin."))
        print(f"{args.model} ({args.target}, {kernels} kernels): graph executor {g:.3f} ms, "
              f"VM {v:.3f} ms, VM/graph = {v / g:.3f}; VM {vm.replay_stats()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
