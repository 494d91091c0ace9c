"""libkiln_runtime's C API in detail (tests/helpers/native_api_test.c): the factory's and the
executor's functions (inputs by name and index, params after the inputs, zero-copy binding and
its refusals, load_params, get_output into a tensor), handle errors, the import-cycle check,
global functions, and a const_loader module feeding an external kernel's ``__init_<symbol>``
— all under AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from backend_helpers import HELPERS
from fuzz_mutators import graph_docs, graph_params
from fuzz_runtime import build_so

import kiln.runtime as rt

EXT_SOURCE = r"""
#include <kiln/c_runtime_api.h>
#include <string.h>
#define EXPORT __attribute__((visibility("default")))
static float w[6];
static int ready = 0;
EXPORT int32_t __init_ext_bias(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                               int32_t* ret_code, void* h) {
  if (n != 1) { TVMAPISetLastError("__init_ext_bias: one constant"); return -1; }
  memcpy(w, ((DLTensor*)args[0].v_handle)->data, sizeof(w));
  ready = 1;
  return 0;
}
EXPORT int32_t ext_bias(TVMValue* args, int32_t* codes, int32_t n, TVMValue* ret,
                        int32_t* ret_code, void* h) {
  if (!ready) { TVMAPISetLastError("ext_bias before __init_ext_bias"); return -1; }
  float* x = (float*)((DLTensor*)args[0].v_handle)->data;
  float* y = (float*)((DLTensor*)args[1].v_handle)->data;
  for (int i = 0; i < 6; ++i) y[i] = x[i] + w[i];
  return 0;
}
"""


SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]


@pytest.fixture(scope="module")
def api_test(native_rt_asan, build_once, tmp_path_factory):
    """(a fresh folder, native_api_test.c linked with the runtime built by its Makefile under
    ASan + UBSan, leaks checked at exit); the driver is built once per session."""
    build = native_rt_asan

    def link(folder):
        subprocess.run(["cc", "-std=gnu11", "-g", "-O1", *SANITIZE, f"-I{build / 'include'}",
                        "-o", str(folder / "native_api_test"),
                        str(HELPERS / "native_api_test.c"),
                        str(build / "libkiln_runtime.a"), "-ldl", "-lpthread"],
                       check=True, capture_output=True, text=True, timeout=300)

    exe = build_once("native-api-test", link) / "native_api_test"
    return tmp_path_factory.mktemp("native-api"), exe


def _run(exe, *args) -> str:
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_graph_executor_api(api_test):
    folder, exe = api_test
    so = build_so(str(folder / "model.so"))
    params = folder / "params.bin"
    p0 = {k: np.full_like(v, 2.0) for k, v in graph_params(graph_docs()[0]).items()}
    params.write_bytes(rt.save_param_dict(p0))
    out = _run(exe, "graph", so, params)
    assert "FAIL" not in out and out.count("ok ") >= 25


def test_const_loader(api_test):
    folder, exe = api_test
    doc = {"nodes": [{"op": "null", "name": "x", "inputs": []},
                     {"op": "tvm_op", "name": "ext", "inputs": [[0, 0, 0]],
                      "attrs": {"func_name": "ext_bias", "num_inputs": "1",
                                "num_outputs": "1", "flatten_data": "0"}}],
           "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
           "attrs": {"dltype": ["list_str", ["float32"] * 2],
                     "storage_id": ["list_int", [0, 1]],
                     "shape": ["list_shape", [[2, 3]] * 2]}}
    kernels = rt.CSourceModule(EXT_SOURCE, ["ext_bias", "__init_ext_bias"])
    w = (np.arange(6, dtype="float32") + 0.5).reshape(2, 3)
    consts = rt.ConstLoaderModule({"ext_w": w, "unused": np.ones(2, "float32")},
                                  {"ext_bias": ["ext_w"]})
    consts.import_module(kernels)
    so = folder / "consts.so"
    rt.GraphExecutorFactoryModule(json.dumps(doc), consts).export_library(str(so))
    # the Python runtime agrees on the file
    gm = rt.load_module(str(so))["default"](rt.cpu())
    gm["set_input"]("x", np.arange(6, dtype="float32").reshape(2, 3))
    gm["run"]()
    np.testing.assert_array_equal(gm["get_output"](0).numpy(), np.arange(6).reshape(2, 3) + w)
    assert "FAIL" not in _run(exe, "const", so)
