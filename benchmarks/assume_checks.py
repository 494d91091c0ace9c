"""Assume-then-check: a VM compiled with no flags vs the same VM with the relations declared.

With no flags, the importer assumes what a model needs (MiniLM: ``sequence_length <= 512``;
PP-OCRv4 det: sizes multiples of 32) and the VM checks it on every call (decision 044). The
same relations given as ``dim_bounds`` (``--dim``) are declarations: bounds the VM checks too,
and divisors the kernels may use to drop tails. For each model, both VM libraries are built from
one ONNX file and timed at each shape in alternating blocks in one process, by the calling
thread's CPU time (at one thread the kernels run on it; other processes on a shared machine
disturb it least). The issue's bar is no-flags / declared <= 1.05 (a benchmark, not a test).

    .venv/bin/python benchmarks/assume_checks.py [--threads 1] [--repeat 20] [--models a,b]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_timing import alternating_medians  # noqa: E402

#: model -> shapes to time: MiniLM's (batch, sequence), PP-OCRv4's NCHW input
SHAPES = {
    "minilm_l3": [(1, 7), (1, 128), (4, 33)],
    "ppocrv4_rec": [(1, 3, 48, 100), (1, 3, 48, 320), (3, 3, 48, 320)],
    "ppocrv4_det": [(1, 3, 320, 320), (1, 3, 480, 640)],
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=10, help="timed runs per build and block")
    p.add_argument("--rounds", type=int, default=5, help="alternating blocks per build")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return p.parse_args(argv)


def declared_bounds(assumptions) -> dict[str, tuple]:
    """The importer's assumptions as ``dim_bounds`` declarations (what ``--dim`` would say).

    Raises
    ------
    SystemExit
        For a symbol equality, which ``dim_bounds`` cannot declare (``shape=`` names would)."""
    bounds = {}
    for a in assumptions:
        if a.equal is not None:
            raise SystemExit(f"cannot declare {a.relation()} as a dim bound")
        bounds[a.symbol] = (a.lo, a.hi, a.divisor)
    return bounds


def build_vm(model, target: str, out: Path, dim_bounds=None):
    """(VirtualMachine, assumptions) for ``model`` compiled with ``dim_bounds`` (None: no
    flags)."""
    import kiln
    from kiln.frontend import from_onnx
    from kiln.vm import VirtualMachine

    mod, params = from_onnx(model, dim_bounds=dim_bounds)
    kiln.build(mod, target=target, params=params).export_library(str(out))
    vm = VirtualMachine(kiln.runtime.load_module(str(out)), kiln.cpu())
    return vm, mod["main"].attrs["assumptions"]


def feeds(name: str, shape, rng) -> list[np.ndarray]:
    """The model's inputs at ``shape``: token ids and mask for MiniLM, an image otherwise."""
    if name == "minilm_l3":
        return [rng.integers(1000, 30000, shape).astype("int64"), np.ones(shape, "int64")]
    return [rng.standard_normal(shape, dtype=np.float32)]


def _first(result) -> np.ndarray:
    """The first output of a VM call (one NDArray, or a tuple of them) as numpy."""
    return (result[0] if isinstance(result, (tuple, list)) else result).numpy()


def bench_model(name: str, args, workdir: Path) -> list[dict]:
    import onnx

    from kiln.models import wheel_file_path

    model = onnx.load(wheel_file_path(name))
    free, assumptions = build_vm(model, args.target, workdir / f"{name}_free.so")
    bounds = declared_bounds(assumptions)
    declared, _ = build_vm(model, args.target, workdir / f"{name}_declared.so", bounds)
    print(f"{name}: assumed {[a.relation() for a in assumptions]}", file=sys.stderr)
    rng = np.random.default_rng(0)
    rows = []
    for shape in SHAPES[name]:
        inputs = feeds(name, shape, rng)
        np.testing.assert_allclose(_first(free["main"](*inputs)),
                                   _first(declared["main"](*inputs)), rtol=1e-4, atol=1e-4)
        us = alternating_medians({"no_flags": lambda i=inputs: free["main"](*i),
                                  "declared": lambda i=inputs: declared["main"](*i)},
                                 args.rounds, args.repeat)
        times = {k: v / 1e3 for k, v in us.items()}
        ratio = times["no_flags"] / times["declared"]
        rows.append({"model": name, "shape": list(shape),
                     "assumed": [a.relation() for a in assumptions],
                     "no_flags_ms": times["no_flags"], "declared_ms": times["declared"],
                     "ratio": ratio})
        print(f"  {shape}: no flags {times['no_flags']:.3f} ms, declared "
              f"{times['declared']:.3f} ms, ratio {ratio:.3f}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["KILN_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-assume-") as tmp:
        for name in args.models.split(","):
            rows += bench_model(name, args, Path(tmp))
    geomean = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    worst = max(r["ratio"] for r in rows)
    print(f"no flags / declared: geomean {geomean:.3f}, worst {worst:.3f} (bar: <= 1.05)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "assume_checks.json").write_text(json.dumps(
        {"threads": args.threads, "rows": rows, "geomean": geomean, "worst": worst}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
