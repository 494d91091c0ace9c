"""Grouped and dilated float32 convolutions, Kiln (with and without issue 32's kernels) beside
onnxruntime, one process (docs/decisions/045).

    .venv/bin/python benchmarks/conv_families.py [--cases deeplab,regnet,resnext]
        [--channels 256] [--threads 1] [--target "llvm -mcpu=native"] [--rounds 9]
        [--repeat 5] [--no-before] [--callgrind]

Cases, each ``Conv`` (with bias) → ``Relu`` on an NCHW input (so both engines' layout
transforms are in):

- ``deeplab``: DeepLabV3's ASPP head on a 20×20 map: three 3×3 convs ``--channels`` →
  ``--channels``, dilation and padding 12, 24, 36 (each its own model: per-kernel times);
- ``regnet``: RegNetY-400MF's grouped 3×3s (8 channels a group): 104 → 104 groups 13 at 28×28,
  208 → 208 groups 26 at 14×14 (stride 1 and 2);
- ``resnext``: ResNeXt-50's first-stage grouped 3×3, 128 → 128 groups 32 at 56×56.

"before" is the same Kiln with ``GROUPED_NCHWC`` and ``CLIP_DILATED_TAPS``
(``kiln.relay.transform.alter_op_layout``) off: grouped convs as the NCHW ``nn.conv2d`` kernel,
dilated convs computing every tap. Timing: CPU time of the calling thread
(``time.thread_time``) of ``--repeat`` calls, in alternating rounds (before, after,
onnxruntime); the median over rounds of each round's mean. On this shared, loaded machine run
at 1 thread (``KILN_NUM_THREADS`` and onnxruntime's intra-op threads) for CPU time to be the
work done: the ratios carry over, the µs less so.

``--callgrind``: instead of times, instructions per call of each engine, counted by
``valgrind --tool=callgrind`` (one valgrind process per engine and conv, loading the prebuilt
library or the ONNX model; only the instructions inside a ``functools.reduce`` around
``--repeat`` calls are collected: ``--toggle-collect=functools_reduce``). Independent of the
load; counts instructions, not their cost (vector width, cache misses).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from cpu_timing import alternating_medians
from peers import ort_runner

#: the switches "before" turns off (module, attribute)
SWITCHES = (("kiln.relay.transform.alter_op_layout", "GROUPED_NCHWC"),
            ("kiln.relay.transform.alter_op_layout", "CLIP_DILATED_TAPS"))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="deeplab,regnet,resnext")
    p.add_argument("--channels", type=int, default=256, help="deeplab's channels")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--repeat", type=int, default=5, help="calls per engine and round")
    p.add_argument("--no-before", action="store_true", help="skip the build without the kernels")
    p.add_argument("--callgrind", action="store_true", help="instructions per call instead")
    p.add_argument("--cg-run", nargs=3, metavar=("ENGINE", "PATH", "INPUT"),
                   help=argparse.SUPPRESS)  # one engine's calls, under valgrind
    return p.parse_args()


def shapes(args) -> list[dict]:
    """The convs of ``--cases``: dicts of conv_model's keywords and a ``name``."""
    c = args.channels
    table = {
        "deeplab": [dict(name=f"{c}x{c} 20x20 d{d}", cin=c, cout=c, h=20, dilation=d, pad=d)
                    for d in (12, 24, 36)],
        "regnet": [dict(name="104x104 g13 28x28", cin=104, cout=104, h=28, groups=13),
                   dict(name="208x208 g26 14x14", cin=208, cout=208, h=14, groups=26),
                   dict(name="208x208 g26 28x28 s2", cin=208, cout=208, h=28, groups=26,
                        stride=2)],
        "resnext": [dict(name="128x128 g32 56x56", cin=128, cout=128, h=56, groups=32)],
    }
    return [s for case in args.cases.split(",") for s in table[case]]


def conv_model(cin: int, cout: int, h: int, groups: int = 1, stride: int = 1,
               dilation: int = 1, pad: int = 1, seed: int = 0, **_):
    """3×3 Conv (seeded weights and bias) → Relu on ``x: [1, cin, h, h]``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin // groups, 3, 3)) / np.sqrt(cin // groups * 9)) \
        .astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, group=groups,
                              strides=[stride] * 2, dilations=[dilation] * 2),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def macs(cin: int, cout: int, h: int, groups: int = 1, stride: int = 1, **_) -> int:
    """Multiply-adds of the conv as ONNX defines it (every tap, padding included)."""
    out = (h - 1) // stride + 1
    return out * out * cout * (cin // groups) * 9


def graph_module(model, target: str, path: Path, overrides: dict[str, dict[str, object]]):
    """A GraphModule of ``model`` built for ``target`` (exported to ``path``) with module
    attributes set for the build: ``{"kiln.relay.transform.winograd": {"WINOGRAD": False}}``;
    each is restored after it."""
    import importlib

    import kiln
    from kiln.frontend import from_onnx

    saved = []
    for module, values in overrides.items():
        mod = importlib.import_module(module)
        for name, value in values.items():
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, value)
    try:
        mod, params = from_onnx(model)
        lib = kiln.build(mod, target=target, params=params)
    finally:
        for mod_, name, value in reversed(saved):
            setattr(mod_, name, value)
    lib.export_library(str(path))
    return kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(path))["default"](
        kiln.cpu()))


def _kiln(model, target: str, path: Path, on: bool):
    """``model`` built with this issue's kernels (SWITCHES) on or off."""
    overrides: dict[str, dict[str, object]] = {}
    for module, name in SWITCHES:
        overrides.setdefault(module, {})[name] = on
    return graph_module(model, target, path, overrides)


def bench(shape: dict, args, folder: Path) -> dict[str, tuple[float, float]]:
    """engine → (median µs, max abs difference from onnxruntime)."""
    model = conv_model(**shape)
    x = np.random.default_rng(1).standard_normal((1, shape["cin"], shape["h"], shape["h"])) \
        .astype(np.float32)
    ort_run = ort_runner(model.SerializeToString(), {"x": x}, args.threads)
    want = ort_run()[0]
    calls, errors = {}, {}
    for name, on in (() if args.no_before else (("before", False),)) + (("after", True),):
        gm = _kiln(model, args.target, folder / f"{name}.so", on)
        gm.set_input("x", x)
        gm.run()
        errors[name] = float(np.abs(gm.get_output(0).numpy() - want).max())
        calls[name] = gm.run
    calls["onnxruntime"] = ort_run
    errors["onnxruntime"] = 0.0
    medians = alternating_medians(calls, args.rounds, args.repeat, warmup=1)
    return {name: (us, errors[name]) for name, us in medians.items()}


def _cg_run(args) -> None:
    """Under valgrind: ``--repeat`` calls of one engine inside functools.reduce."""
    engine, path, inp = args.cg_run
    x = np.load(inp)
    if engine == "onnxruntime":
        call = ort_runner(path, {"x": x}, args.threads)
    else:
        import kiln

        gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(path)["default"](
            kiln.cpu()))
        gm.set_input("x", x)
        call = gm.run
    call()  # first-call work (allocation, ORT's prepacking) is not counted
    functools.reduce(lambda acc, _: (call(), acc)[1], range(args.repeat), 0)


def callgrind(shape: dict, args, folder: Path) -> dict[str, float]:
    """engine → instructions per call (callgrind), each engine in its own valgrind."""
    model = conv_model(**shape)
    onnx_path = folder / "model.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(1).standard_normal((1, shape["cin"], shape["h"], shape["h"])) \
        .astype(np.float32)
    np.save(folder / "x.npy", x)
    paths = {}
    for name, on in (() if args.no_before else (("before", False),)) + (("after", True),):
        paths[name] = folder / f"{name}.so"
        _kiln(model, args.target, paths[name], on)
    paths["onnxruntime"] = onnx_path
    counts = {}
    for name, path in paths.items():
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--toggle-collect=functools_reduce",
             f"--callgrind-out-file={folder / 'cg.out'}", sys.executable, __file__,
             "--threads", str(args.threads), "--repeat", str(args.repeat),
             "--cg-run", "kiln" if name != "onnxruntime" else name, str(path),
             str(folder / "x.npy")], capture_output=True, text=True, check=True)
        collected = re.search(r"Collected : (\d+)", proc.stderr)
        counts[name] = int(collected.group(1)) / args.repeat
    return counts


def main() -> None:
    args = _args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    if args.cg_run:
        _cg_run(args)
        return
    if args.callgrind:
        print(f"threads {args.threads}, target {args.target!r}, callgrind instructions per "
              f"call ({args.repeat} calls)")
        with tempfile.TemporaryDirectory() as tmp:
            for shape in shapes(args):
                counts = callgrind(shape, args, Path(tmp))
                for name, n in counts.items():
                    print(f"{shape['name']:>22} {name:>12} {n / 1e6:10.2f} M "
                          f"{n / counts['onnxruntime']:6.2f}", flush=True)
        return
    print(f"threads {args.threads}, target {args.target!r}, {args.rounds} rounds x "
          f"{args.repeat} calls, thread CPU time, median of round means; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'conv':>22} {'engine':>12} {'us':>10} {'GFLOP/s':>8} {'x ORT':>6} {'max err':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes(args):
            rows = bench(shape, args, Path(tmp))
            ort_us = rows["onnxruntime"][0]
            for name, (us, err) in rows.items():
                gflops = 2 * macs(**shape) / us / 1e3
                print(f"{shape['name']:>22} {name:>12} {us:10.1f} {gflops:8.1f} "
                      f"{us / ort_us:6.2f} {err:8.1e}", flush=True)


if __name__ == "__main__":
    main()
