"""Whole-model test helpers: compile with Kiln through the public API, compare with onnxruntime.

Imported by the tests of this folder (pytest puts the folder on ``sys.path``).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Compiled:
    """A model compiled, exported and loaded back: the loaded root and an executor over it."""

    path: Path
    loaded: object
    gmod: object


def compile_to_library(model, shapes: dict[str, tuple[int, ...]], path: Path,
                       target: str = "c", byoc: tuple[str, ...] = ()) -> Compiled:
    """from_onnx → kiln.build(target, byoc) → export_library(path) → load_module →
    GraphModule."""
    import kiln
    from kiln.frontend import from_onnx

    mod, params = from_onnx(model, shape=shapes)
    lib = kiln.build(mod, target=target, params=params, byoc=list(byoc))
    lib.export_library(str(path))
    loaded = kiln.runtime.load_module(str(path))
    gmod = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))
    return Compiled(path, loaded, gmod)


def run_compiled(compiled: Compiled, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Set inputs, run once, return every output as numpy."""
    gmod = compiled.gmod
    for name, value in inputs.items():
        gmod.set_input(name, value)
    gmod.run()
    return [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]


def assert_matches_reference(got: list[np.ndarray], want: list[np.ndarray],
                             rtol: float = 1e-4) -> None:
    """Kiln vs onnxruntime: max abs error ≤ rtol·max|ref| + 1e-5, and the same top-1 class.

    The top-1 check is skipped where the reference's best two scores are closer than the error
    bound (e.g. the uniform softmax of the light models' constant weights): there the argmax is
    decided by rounding, not by the model.
    """
    assert len(got) == len(want), f"{len(got)} outputs, reference has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"output {k}: shape {g.shape} != reference {w.shape}"
        assert g.dtype == w.dtype, f"output {k}: dtype {g.dtype} != reference {w.dtype}"
        assert np.all(np.isfinite(w)), f"output {k}: reference has non-finite values"
        err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
        bound = rtol * float(np.max(np.abs(w))) + 1e-5
        assert err <= bound, f"output {k}: max abs error {err:.3g} > {bound:.3g}"
        flat_g = g.reshape(g.shape[0], -1)
        flat_w = w.reshape(w.shape[0], -1)
        for row_g, row_w in zip(flat_g, flat_w):
            if row_w.size < 2:
                continue
            top2 = np.sort(row_w)[-2:]
            if top2[1] - top2[0] > 2 * bound:
                assert int(np.argmax(row_g)) == int(np.argmax(row_w)), f"output {k}: argmax"



def with_symbolic_batch(model, name: str = "N"):
    """A copy of ``model`` whose batch (dim 0 of every real input and output) is the symbolic
    ``dim_param`` ``name``.

    The ONNX-zoo light models fix batch 1, and some also bake it into a Reshape's constant
    target shape (resnet50's ``(1, 2048)`` before its classifier): such a leading 1 becomes 0,
    ONNX's "copy this dim from the input", so that the model is batch-generic for onnxruntime
    and Kiln alike.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for value_info in [*(v for v in graph.input if v.name not in inits), *graph.output]:
        dim = value_info.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = name
    for node in graph.node:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in inits:
            target = numpy_helper.to_array(inits[node.input[1]]).copy()
            if target.ndim == 1 and target.size and target[0] == 1:
                target[0] = 0
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(target, node.input[1]))
    return model


def run_vm(vm, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``vm["main"]`` on the inputs (in the model's input order), every output as numpy."""
    out = vm["main"](*inputs.values())
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


def kiln_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m kiln.cli.main ARGS`` and return the finished process (text output)."""
    proc = subprocess.run([sys.executable, "-m", "kiln.cli.main", *args], capture_output=True,
                          text=True, check=False, timeout=900)
    if check:
        assert proc.returncode == 0, f"kiln {' '.join(args)} failed:\n{proc.stderr}"
    return proc
