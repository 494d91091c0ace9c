"""A VM artifact whose kernels run on a riscv64 RVV device under qemu-user: the ``jit`` target
keeps the symbolic kernels as C source, compiled by clang for riscv64 on first call and run in
Kiln's device server, while the VM (on the host) decides shapes and the run-time If."""

from __future__ import annotations

import numpy as np
import pytest
from device_helpers import use_riscv_device
from onnx.reference import ReferenceEvaluator
from test_vm_control_flow import _cases, _if_model

import kiln
from kiln.frontend import from_onnx
from kiln.vm import VirtualMachine


@pytest.mark.slow
def test_symbolic_if_model_on_riscv64_rvv_under_qemu(tmp_path, monkeypatch):
    use_riscv_device(monkeypatch, tmp_path / "cache")
    model = _if_model()
    mod, params = from_onnx(model)
    kiln.build(mod, target="jit", params=params).export_library(str(tmp_path / "if.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "if.so")), kiln.cpu())
    ref = ReferenceEvaluator(model)
    for x in _cases():  # both branches, three lengths
        got = [o.numpy() for o in vm["main"](x)]
        for g, w in zip(got, ref.run(None, {"x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-6)
