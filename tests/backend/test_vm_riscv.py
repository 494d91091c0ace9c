"""A VM artifact whose kernels run on a riscv64 RVV device under qemu-user: the ``jit`` target
keeps the symbolic kernels as C source, compiled by clang for riscv64 on first call and run in
Kiln's device server, while the VM (on the host) decides shapes and the run-time If."""

from __future__ import annotations

import numpy as np
import pytest
from device_helpers import RISCV_CC, riscv_missing
from onnx.reference import ReferenceEvaluator
from test_vm_control_flow import _cases, _if_model

import kiln
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine


@pytest.mark.slow
def test_symbolic_if_model_on_riscv64_rvv_under_qemu(tmp_path, monkeypatch):
    missing = riscv_missing()
    if missing:
        pytest.skip(f"the riscv64 device path needs {missing} (make test installs it)")
    for var in ("KILN_DEVICE_CFLAGS", "KILN_DEVICE_LAUNCHER", "KILN_NO_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_DEVICE_CC", RISCV_CC)
    model = _if_model()
    mod, params = from_onnx(model)
    kiln.build(mod, target="jit", params=params).export_library(str(tmp_path / "if.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "if.so")), kiln.cpu())
    ref = ReferenceEvaluator(model)
    for x in _cases():  # both branches, three lengths
        got = [o.numpy() for o in vm["main"](x)]
        for g, w in zip(got, ref.run(None, {"x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-6)
