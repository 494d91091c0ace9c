"""Runtime round trips through the system C compiler: hand-written packed-ABI kernels →
CSourceModule → GraphExecutorFactoryModule → export_library → load_module → GraphModule.

Also every load failure a user can meet (no blob, truncated, corrupt, not ELF, other machine)
and every export failure (no compiler, bad code): each is a KilnError, never a crash, and a failed
export leaves no file behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError, ShapeError, ToolchainError
from kiln.graph_executor import GraphModule
from kiln.runtime.elf import host_elf, machine_name
from kiln.runtime.toolchain import compiler as toolchain

KERNELS = r"""
#include <kiln/c_runtime_api.h>
#include <stdio.h>
#define EXPORT __attribute__((visibility("default")))

static int check3(const char* name, int32_t num_args, int32_t* codes) {
  if (num_args != 3) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s: expected 3 arguments, got %d", name, (int)num_args);
    TVMAPISetLastError(msg);
    return -1;
  }
  for (int i = 0; i < 3; ++i)
    if (codes[i] != kTVMDLTensorHandle) { TVMAPISetLastError("not a tensor"); return -1; }
  return 0;
}

#define BINARY(NAME, OP)                                                                 \
  EXPORT int32_t NAME(TVMValue* args, int32_t* codes, int32_t num_args, TVMValue* ret,   \
                      int32_t* ret_code, void* handle) {                                 \
    if (check3(#NAME, num_args, codes)) return -1;                                       \
    DLTensor* a = (DLTensor*)args[0].v_handle;                                           \
    DLTensor* b = (DLTensor*)args[1].v_handle;                                           \
    DLTensor* c = (DLTensor*)args[2].v_handle;                                           \
    int64_t n = 1;                                                                       \
    for (int i = 0; i < a->ndim; ++i) n *= a->shape[i];                                  \
    const float* pa = (const float*)a->data;                                             \
    const float* pb = (const float*)b->data;                                             \
    float* pc = (float*)c->data;                                                         \
    for (int64_t i = 0; i < n; ++i) pc[i] = pa[i] OP pb[i];                              \
    return 0;                                                                            \
  }

BINARY(fused_add, +)
BINARY(fused_mul, *)

EXPORT int32_t fused_fail(TVMValue* args, int32_t* codes, int32_t num_args, TVMValue* ret,
                          int32_t* ret_code, void* handle) {
  TVMAPISetLastError("fused_fail: the kernel refused (test)");
  return -1;
}

/* Returns sum(type_code[i] * 100^i) and echoes int/float args: checks Python's conversion. */
EXPORT int32_t echo_codes(TVMValue* args, int32_t* codes, int32_t num_args, TVMValue* ret,
                          int32_t* ret_code, void* handle) {
  int64_t acc = 0, scale = 1;
  for (int i = 0; i < num_args; ++i, scale *= 100) acc += codes[i] * scale;
  ret->v_int64 = acc;
  *ret_code = kTVMArgInt;
  return 0;
}

EXPORT int32_t use_workspace(TVMValue* args, int32_t* codes, int32_t num_args, TVMValue* ret,
                             int32_t* ret_code, void* handle) {
  void* p = TVMBackendAllocWorkspace(kDLCPU, 0, 100000, 2, 32);
  ret->v_int64 = p != NULL && ((uintptr_t)p % 64) == 0;
  *ret_code = kTVMArgInt;
  return TVMBackendFreeWorkspace(kDLCPU, 0, p);
}

static int team_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  if (task_id == 0) *(int64_t*)cdata = penv->num_task;
  return 0;
}

/* The number of tasks a launch gets by default: the support code's team size. */
EXPORT int32_t max_threads(TVMValue* args, int32_t* codes, int32_t num_args, TVMValue* ret,
                           int32_t* ret_code, void* handle) {
  int64_t team = 0;
  if (TVMBackendParallelLaunch(team_task, &team, 0) != 0) return -1;
  ret->v_int64 = team;
  *ret_code = kTVMArgInt;
  return 0;
}
"""
FUNCS = ["fused_add", "fused_mul", "fused_fail", "echo_codes", "use_workspace", "max_threads"]
SHAPE = [2, 3]


def tvm_op(name: str, func: str, inputs: list[int]) -> dict:
    return {"op": "tvm_op", "name": name, "inputs": [[i, 0, 0] for i in inputs],
            "attrs": {"func_name": func, "num_inputs": str(len(inputs)), "num_outputs": "1",
                      "flatten_data": "0"}}


def make_graph(shape=SHAPE, last_func: str = "fused_add") -> str:
    """x, y, p0 → add1 = x + y → mul2 = add1 * p0 → out = mul2 (+) x.

    ``out`` reuses add1's storage (storage id 3)."""
    nodes = [{"op": "null", "name": n, "inputs": []} for n in ("x", "y", "p0")]
    nodes += [tvm_op("add1", "fused_add", [0, 1]), tvm_op("mul2", "fused_mul", [3, 2]),
              tvm_op("out", last_func, [4, 0])]
    n = len(nodes)
    return json.dumps({
        "nodes": nodes, "arg_nodes": [0, 1, 2], "heads": [[5, 0, 0]],
        "node_row_ptr": list(range(n + 1)),
        "attrs": {"dltype": ["list_str", ["float32"] * n],
                  "storage_id": ["list_int", [0, 1, 2, 3, 4, 3]],
                  "shape": ["list_shape", [list(shape)] * n],
                  "device_index": ["list_int", [1] * n]},
    })


P0 = np.array([[1, 2, 3], [4, 5, 6]], dtype="float32")


def make_factory(last_func: str = "fused_add") -> rt.GraphExecutorFactoryModule:
    return rt.GraphExecutorFactoryModule(make_graph(last_func=last_func),
                                         rt.CSourceModule(KERNELS, FUNCS), {"p0": P0})


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("rt") / "model.so")
    make_factory().export_library(path)
    return path


def inputs():
    rng = np.random.default_rng(1)
    return (rng.standard_normal(SHAPE).astype("float32"),
            rng.standard_normal(SHAPE).astype("float32"))


def test_round_trip_matches_numpy(exported):
    loaded = rt.load_module(exported)
    assert loaded.type_key == "GraphExecutorFactory"
    (lib,) = loaded.imported_modules
    assert isinstance(lib, rt.LibraryModule)
    assert lib.list_function_names() == FUNCS
    gm = GraphModule(loaded["default"](rt.cpu()))
    x, y = inputs()
    gm.set_input("x", x)
    gm.set_input("y", y)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + x, rtol=1e-6)
    gm.run(x=y, y=x)  # a second run reuses the prebuilt calls
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + y, rtol=1e-6)
    np.testing.assert_array_equal(loaded["get_graph_params"]()["p0"].numpy(), P0)
    assert json.loads(loaded["get_graph_json"]()) == json.loads(make_graph())


def test_reexport_to_a_loaded_path_loads_the_new_library(tmp_path):
    # glibc's dlopen returns the object already loaded under a name even after the file was
    # replaced; the second load must still see the new library (here: another params blob).
    path = str(tmp_path / "model.so")
    make_factory().export_library(path)
    first = rt.load_module(path)
    other = rt.GraphExecutorFactoryModule(make_graph(), rt.CSourceModule(KERNELS, FUNCS),
                                          {"p0": P0 * 2})
    other.export_library(path)
    second = rt.load_module(path)
    np.testing.assert_array_equal(second["get_graph_params"]()["p0"].numpy(), P0 * 2)
    np.testing.assert_array_equal(first["get_graph_params"]()["p0"].numpy(), P0)
    x, y = inputs()
    gm = GraphModule(second["default"](rt.cpu()))
    gm.run(x=x, y=y)
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 * 2 + x, rtol=1e-6)


def test_fresh_module_runs_before_export():
    gm = GraphModule(make_factory()["default"](rt.cpu()))
    x, y = inputs()
    gm.run(x=x, y=y)
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + x, rtol=1e-6)


def test_packed_arg_conversion_and_workspace(exported):
    lib = rt.load_module(exported).imported_modules[0]
    a = rt.empty((2,), "float32")
    # NDArray 7, int 0, float 2, str 11, None 4
    assert lib["echo_codes"](a, 3, 1.5, "s", None) == 7 + 0 + 2 * 10**4 + 11 * 10**6 + 4 * 10**8
    assert lib["use_workspace"]() == 1
    with pytest.raises(KilnError, match="cannot be passed"):
        lib["echo_codes"](object())
    assert lib.get_function("malloc") is None  # only the listed packed functions are served


def test_kiln_num_threads_env(exported):
    code = ("import kiln.runtime as rt, sys; "
            "print(rt.load_module(sys.argv[1]).imported_modules[0]['max_threads']())")
    env = dict(os.environ, KILN_NUM_THREADS="1", OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code, exported], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "1"


def test_kernel_error_surfaces_c_message(tmp_path):
    path = str(tmp_path / "fail.so")
    make_factory(last_func="fused_fail").export_library(path)
    gm = GraphModule(rt.load_module(path)["default"](rt.cpu()))
    x, y = inputs()
    # the three kernels run as one batch (one C call); the failure names the third
    (batch,) = gm.module._batched_ops
    assert [c.func.name for c in batch.calls] == ["fused_add", "fused_mul", "fused_fail"]
    with pytest.raises(KilnError, match=r"fused_fail failed \(status -1\): fused_fail: the "
                                        r"kernel refused \(test\)"):
        gm.run(x=x, y=y)
    lib = rt.load_module(path).imported_modules[0]
    with pytest.raises(KilnError, match="fused_add: expected 3 arguments, got 1"):
        lib["fused_add"](rt.empty((1,)))


def test_set_input_errors(exported):
    gm = GraphModule(rt.load_module(exported)["default"](rt.cpu()))
    assert gm.get_num_inputs() == 2 and gm.get_num_outputs() == 1
    with pytest.raises(KilnError, match=r"no input named 'z'; inputs: \['x', 'y'\]"):
        gm.set_input("z", np.zeros(SHAPE, "float32"))
    with pytest.raises(ShapeError, match=r"'x': expected shape \(2, 3\) dtype float32, got "
                                         r"shape \(3, 2\)"):
        gm.set_input("x", np.zeros((3, 2), "float32"))
    with pytest.raises(ShapeError, match=r"'y'.*dtype int32"):
        gm.set_input("y", np.zeros(SHAPE, "int32"))


def test_fcompile_cross_compiler(tmp_path, caplog):
    path = str(tmp_path / "cross.so")
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        make_factory().export_library(path, fcompile=rt.cross_compiler(toolchain.find_cc()))
    assert any("-shared" in r.getMessage() for r in caplog.records)  # commands are logged
    gm = GraphModule(rt.load_module(path)["default"](rt.cpu()))
    x, y = inputs()
    gm.run(x=x, y=y)
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + x, rtol=1e-6)


# ------------------------------------------------------------------------------ load failures
def test_missing_file(tmp_path):
    with pytest.raises(ModuleLoadError, match="does not exist"):
        rt.load_module(tmp_path / "nope.so")


def test_not_elf(tmp_path):
    p = tmp_path / "model.so"
    p.write_bytes(b"this is not a library\n" * 10)
    with pytest.raises(ModuleLoadError, match="not a shared library"):
        rt.load_module(p)


def test_other_machine(exported, tmp_path):
    p = tmp_path / "arm.so"
    data = bytearray(Path(exported).read_bytes())
    other = 183 if host_elf().machine != 183 else 62
    data[18:20] = struct.pack("<H", other)
    p.write_bytes(bytes(data))
    want = rf"{machine_name(other)} but this host is {machine_name(host_elf().machine)}"
    with pytest.raises(ModuleLoadError, match=want.replace("(", r"\(").replace(")", r"\)")):
        rt.load_module(p)


def test_truncated_library(exported, tmp_path):
    data = Path(exported).read_bytes()
    for frac in (0.01, 0.3, 0.6, 0.95):
        p = tmp_path / f"trunc{frac}.so"
        p.write_bytes(data[:int(len(data) * frac)])
        with pytest.raises(ModuleLoadError):
            rt.load_module(p)


def test_library_without_blob(tmp_path):
    src = tmp_path / "plain.c"
    src.write_text("int plain(void) { return 1; }\n")
    so = str(tmp_path / "plain.so")
    toolchain.run([*toolchain.find_cc(), "-shared", "-fPIC", "-o", so, str(src)])
    with pytest.raises(ModuleLoadError, match="no __tvm_dev_mblob: not a Kiln/TVM library"):
        rt.load_module(so)


def _blob_offset(data: bytes) -> int:
    # payload starts with num_entries (3) then the root's type key
    key = b"\x14" + b"\0" * 7 + b"GraphExecutorFactory"
    return data.index(struct.pack("<Q", 3) + key)


@pytest.mark.parametrize("patch, match", [
    (lambda d, o: d[:o + 16] + b"GraphExecutorFactorX" + d[o + 36:],
     (r"no loader for module type_key 'GraphExecutorFactorX' \(registered loaders: "
      r".*GraphExecutorFactory")),
    (lambda d, o: d[:o - 8] + struct.pack("<Q", 1 << 40) + d[o:], "claims"),
    (lambda d, o: d[:o + 8] + struct.pack("<Q", 1 << 40) + d[o + 16:], "truncated or corrupt"),
    (lambda d, o: d[:o + 44] + struct.pack("<Q", 1 << 50) + d[o + 52:], "corrupt|truncated"),
])
def test_corrupt_blob(exported, tmp_path, patch, match):
    data = Path(exported).read_bytes()
    p = tmp_path / "bad.so"
    p.write_bytes(patch(data, _blob_offset(data)))
    with pytest.raises(ModuleLoadError, match=match):
        rt.load_module(p)


# ------------------------------------------------------------------------------ export failures
def test_missing_compiler_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    path = tmp_path / "m.so"
    with pytest.raises(ToolchainError, match=r"/nonexistent/cc.*not found"):
        make_factory().export_library(str(path))
    assert os.listdir(tmp_path) == []


def test_failed_export_keeps_previous_file(tmp_path):
    path = tmp_path / "m.so"
    path.write_bytes(b"previous artifact")
    broken = rt.GraphExecutorFactoryModule(
        make_graph(), rt.CSourceModule(KERNELS + "\nthis is not C;\n", FUNCS), {"p0": P0})
    with pytest.raises(ToolchainError, match=r"command failed.*\n.*error"):
        broken.export_library(str(path))
    assert path.read_bytes() == b"previous artifact"
    assert os.listdir(tmp_path) == ["m.so"]


def test_large_params_export_via_incbin(tmp_path):
    n = 150 * 2**20 // 4  # 150 MiB of float32
    p0 = (np.arange(n) % 4096).astype("float32")
    fac = rt.GraphExecutorFactoryModule(make_graph(shape=[n]), rt.CSourceModule(KERNELS, FUNCS),
                                        {"p0": p0})
    work = tmp_path / "work"
    path = str(tmp_path / "big.so")
    start = time.perf_counter()
    fac.export_library(path, workspace_dir=str(work))
    elapsed = time.perf_counter() - start
    assert (work / "devc.S").exists() and b"__tvm_dev_mblob" not in (work / "devc.c").read_bytes()
    assert elapsed < 20, f"exporting a 150 MiB blob took {elapsed:.1f}s"
    shutil.rmtree(work)
    start = time.perf_counter()
    loaded = rt.load_module(path)
    got = loaded["get_graph_params"]()["p0"]
    assert got.shape == (n,) and np.array_equal(got.numpy(), p0)
    assert time.perf_counter() - start < 10
    print(f"150 MiB params: export {elapsed:.2f}s")
