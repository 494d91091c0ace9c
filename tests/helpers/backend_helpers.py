"""Backend test helpers: compile an ONNX model with Kiln, run it, and run onnxruntime beside it;
the project's tolerance; kernels built for a target; an integer convolution reference.

``tests/backend/conftest.py`` builds its fixtures (``target``, ``check_model``) on these; test
modules import them from here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import kiln
from kiln.frontend import from_onnx

#: this folder, which also holds the C harnesses and drivers of the backend tests
HELPERS = Path(__file__).resolve().parent


def run_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def compile_and_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray], tmp_path,
                    target: str = "c") -> list[np.ndarray]:
    """from_onnx → build → export_library → load_module → GraphModule.run; returns outputs."""
    shapes = {k: v.shape for k, v in inputs.items()}
    mod, params = from_onnx(model, shape=shapes)
    return run_exported(kiln.build(mod, target=target, params=params), tmp_path / "model.so",
                        inputs)


def run_exported(lib, path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """export_library(path) → load_module → GraphModule: set the inputs, run once, return
    every output."""
    lib.export_library(str(path))
    loaded = kiln.runtime.load_module(str(path))
    gmod = kiln.graph_executor.GraphModule(loaded["default"](kiln.cpu()))
    for name, value in inputs.items():
        gmod.set_input(name, value)
    gmod.run()
    return [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]


def cpu_flags() -> set[str]:
    """This CPU's feature flags as the kernel lists them in /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return {w for line in f if line.startswith("flags") for w in line.split()[2:]}
    except OSError:
        return set()


def assert_close_to_reference(got: list[np.ndarray], want: list[np.ndarray],
                              rtol: float = 1e-4) -> None:
    """The project's model tolerance: max abs error ≤ rtol × max|reference| + 1e-5."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w)
            continue
        err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        bound = rtol * float(np.max(np.abs(w))) + 1e-5 if w.size else 0.0
        assert err <= bound, f"max abs error {err:.3g} > {bound:.3g}"


TARGETS = ["c", "llvm"]


def build_kernels(funcs, target: str):
    """A runtime module holding the packed PrimFuncs ``funcs``, for ``target``."""
    if target == "c":
        from kiln.codegen.c.source import build_c_source
        from kiln.runtime import CSourceModule

        return CSourceModule(build_c_source(funcs), [f.name for f in funcs])
    from kiln.codegen.llvm.build import build_llvm

    return build_llvm(funcs, target)


def int_conv_reference(x: np.ndarray, w: np.ndarray, zx: int, stride: int, pad: int) -> np.ndarray:
    """``Σ (x - zx) · w`` over NCHW / OIHW windows, padding contributing 0 (int64 loops)."""
    xs = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, _, kh, kw = w.shape
    oh = (xs.shape[2] - kh) // stride + 1
    ow = (xs.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            win = xs[:, :, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, ky, kx].astype(np.int64))
    return out
