"""The ``jit`` device in the native runtime (src/kiln/native/src/rt_jit.c): a model exported
with ``--target jit`` keeps its kernels as C source; kiln_run compiles them on the first run
with ``$KILN_DEVICE_CC`` into ``$KILN_CACHE_DIR/device`` under the Python runtime's key, so the
Python runtime then finds the same library (and the reverse); a compiler failure is an error
carrying the compiler's stderr. The seed flow (slow): kiln_run built for riscv64 runs under
qemu-riscv64, its kernels compiled at first call by ``clang-14 --target=riscv64-linux-gnu`` (run
by the emulated process), cached, and the cached library holds RVV instructions.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import onnx
import pytest
from device_helpers import RISCV_CC, riscv_missing, vector_ops
from onnx import TensorProto, helper
from test_native_cross import cross_runtime
from test_native_runtime import assert_close, kiln_run

import kiln
from kiln.frontend import from_onnx
from kiln.runtime.jit.device_module import SourceDeviceModule
from kiln.runtime.module import modules_dfs


def small_model() -> onnx.ModelProto:
    """Conv 3x3 + bias, Relu, then Add with the input's first channels: a few fused kernels."""
    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           rng.standard_normal(108).astype("float32"))
    b = helper.make_tensor("b", TensorProto.FLOAT, [4], rng.standard_normal(4).astype("float32"))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Add", ["r", "m"], ["y"])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 16, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 16, 16])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def jit_so(tmp_path_factory):
    model = small_model()
    mod, params = from_onnx(model, shape={"x": (1, 3, 16, 16)})
    path = tmp_path_factory.mktemp("native-jit") / "small_jit.so"
    kiln.build(mod, target="jit", params=params).export_library(str(path))
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype("float32")
    return path, model, x


def _env(cache, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KILN_DEVICE_CC", "KILN_DEVICE_CFLAGS", "KILN_DEVICE_LAUNCHER")}
    return {**env, "KILN_CACHE_DIR": str(cache), **extra}


def test_jit_compiles_at_first_run_and_shares_the_cache(native_rt, jit_so, reference, tmp_path,
                                                        monkeypatch):
    so, model, x = jit_so
    cache = tmp_path / "cache"
    (want,) = reference(model, {"x": x})
    (got,), stdout = kiln_run(native_rt, so, [x], [(want.shape, want.dtype)], tmp_path,
                              env=_env(cache))
    print(stdout)
    assert_close([got], [want])
    built = sorted((cache / "device").glob("device-*.so"))
    assert len(built) == 1
    # the Python runtime finds the library the C runtime built (same key, same layout)
    for var in ("KILN_DEVICE_CC", "KILN_DEVICE_CFLAGS", "KILN_DEVICE_LAUNCHER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    lib = kiln.runtime.load_module(str(so))
    gm = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gm.run(x=x)
    np.testing.assert_array_equal(gm.get_output(0).numpy(), got)
    (dev,) = [m for m in modules_dfs(lib) if isinstance(m, SourceDeviceModule)]
    assert dev.library_path == str(built[0])
    assert sorted((cache / "device").glob("device-*.so")) == built
    # a second kiln_run reuses it: no compile (the same file), the same bits; the hit
    # refreshes its mtime (the LRU order of kiln.runtime.toolchain.cache_limit)
    os.utime(built[0], (1_000_000_000, 1_000_000_000))
    inode = built[0].stat().st_ino
    (again,), _ = kiln_run(native_rt, so, [x], [(want.shape, want.dtype)], tmp_path,
                           env=_env(cache, KILN_DEVICE_CC="cc"))
    np.testing.assert_array_equal(again, got)
    assert built[0].stat().st_ino == inode and built[0].stat().st_mtime > 1_000_000_000


def test_jit_compiler_failure_is_an_error_with_its_stderr(native_rt, jit_so, tmp_path):
    so, _, x = jit_so
    x.tofile(tmp_path / "x.bin")
    proc = subprocess.run([str(native_rt / "kiln_run"), str(so), str(tmp_path / "x.bin"),
                           str(tmp_path / "y.bin")], capture_output=True, text=True, timeout=300,
                          env=_env(tmp_path / "cache", KILN_DEVICE_CFLAGS="-fkiln-no-such-flag"),
                          check=False)
    assert proc.returncode == 1
    assert "device compiler failed" in proc.stderr and "kiln-no-such-flag" in proc.stderr
    proc = subprocess.run([str(native_rt / "kiln_run"), str(so), str(tmp_path / "x.bin"),
                           str(tmp_path / "y.bin")], capture_output=True, text=True, timeout=300,
                          env=_env(tmp_path / "cache", KILN_DEVICE_CC="kiln-no-such-cc"),
                          check=False)
    assert proc.returncode == 1 and "KILN_DEVICE_CC='kiln-no-such-cc' not found" in proc.stderr


@pytest.mark.slow
def test_jit_seed_flow_riscv64_under_qemu(jit_so, reference, tmp_path, build_once):
    """kiln_run for riscv64 under qemu compiles the kernels with the riscv64 clang at first
    call; the cached library is RVV code."""
    missing = riscv_missing()
    if missing:
        pytest.skip(f"the riscv64 device path needs {missing}")
    _, model, x = jit_so
    mod, params = from_onnx(model, shape={"x": (1, 3, 16, 16)})
    so = tmp_path / "small_jit_riscv64.so"  # the host part (blob, support) built for riscv64
    kiln.build(mod, target="jit", params=params).export_library(
        str(so), fcompile=kiln.runtime.cross_compiler("riscv64-linux-gnu-gcc"))
    _, runtime = cross_runtime("riscv64", build_once)  # the riscv64-linux-gnu-gcc build
    cache = tmp_path / "cache"
    (want,) = reference(model, {"x": x})
    qemu = ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu", "rv64,v=true,vlen=128"]
    (got,), stdout = kiln_run(runtime, so, [x], [(want.shape, want.dtype)], tmp_path,
                              prefix=qemu, repeat=0, env=_env(cache, KILN_DEVICE_CC=RISCV_CC))
    print(stdout)
    assert_close([got], [want])
    (lib,) = (cache / "device").glob("device-*.so")
    assert vector_ops(lib), "no RVV instructions in the cached kernel library"
