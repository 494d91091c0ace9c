"""Eager PyTorch vs ``torch.compile(backend="kiln")`` at one thread, on torchvision CNNs.

For each model (random weights, eval mode, ``torch.no_grad()``): compile it with Kiln's
TorchDynamo backend (the compile time is reported), check that its output matches eager
PyTorch's, then time ``--blocks`` alternating blocks of ``--runs`` calls (eager, kiln, eager,
...) so that a change of machine load hits both alike. PyTorch runs at one thread
(``torch.set_num_threads(1)``), Kiln too (``KILN_NUM_THREADS=1``, set before Kiln loads).
Reported per model: the median latency of each, their ratio (kiln / eager: below 1 is faster),
and the fastest call of each (the least disturbed on a shared machine).

    python benchmarks/torch_compile.py [--models resnet18,mobilenet_v2,squeezenet1_0]
                                       [--size 224] [--blocks 5] [--runs 10]

Needs ``pip install -c constraints.txt -e '.[torch-test]'`` (torchvision's C extension need not
load: tests/helpers/torch_models.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("KILN_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "squeezenet1_0")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help=f"comma-separated torchvision models (default {','.join(DEFAULT_MODELS)})")
    p.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    p.add_argument("--blocks", type=int, default=5, help="alternating timed blocks (default 5)")
    p.add_argument("--runs", type=int, default=10, help="calls per block (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each (default 3)")
    return p.parse_args(argv)


def time_calls(fn, x, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - start)
    return out


def bench(name: str, args: argparse.Namespace) -> dict:
    import torch
    import torch_models

    from kiln.driver import torch_backend  # noqa: F401  (backend="kiln")

    model, (x,) = torch_models.cnn(name, args.size)
    compiled = torch.compile(model, backend="kiln")
    with torch.no_grad():
        start = time.perf_counter()
        got = compiled(x)
        compile_s = time.perf_counter() - start
        want = model(x)
        err = float((got - want).abs().max() / want.abs().max())
        for fn in (model, compiled):
            for _ in range(args.warmup):
                fn(x)
        eager, kiln = [], []
        for _ in range(args.blocks):
            eager += time_calls(model, x, args.runs)
            kiln += time_calls(compiled, x, args.runs)
    return {"model": name, "compile_s": compile_s, "rel_err": err,
            "eager_ms": statistics.median(eager) * 1e3, "kiln_ms": statistics.median(kiln) * 1e3,
            "eager_min_ms": min(eager) * 1e3, "kiln_min_ms": min(kiln) * 1e3}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    print(f"torch {torch.__version__}, 1 thread, input 1x3x{args.size}x{args.size}, "
          f"{args.blocks}x{args.runs} calls each")
    print(f"{'model':<15} {'compile s':>9} {'rel err':>8} {'eager ms':>9} {'kiln ms':>8} "
          f"{'kiln/eager':>10} {'eager min':>9} {'kiln min':>8}")
    for name in args.models.split(","):
        r = bench(name, args)
        print(f"{r['model']:<15} {r['compile_s']:9.1f} {r['rel_err']:8.1e} {r['eager_ms']:9.2f} "
              f"{r['kiln_ms']:8.2f} {r['kiln_ms'] / r['eager_ms']:10.2f} "
              f"{r['eager_min_ms']:9.2f} {r['kiln_min_ms']:8.2f}")


if __name__ == "__main__":
    main()
