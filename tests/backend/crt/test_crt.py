"""The C runtime and the AOT executor on small graphs, through the real C compiler: the runtime
sources are strict C99; a system library refuses modules that cannot link statically; two
graph-executor models (symbol prefixes; c and llvm codegen) and an AOT model live in one C
program, each matching the graph interpreter; the graph executor reports a params blob of
another model, and every truncated graph JSON or params blob, as an error (also built with ASan
and UBSan); the CLI's static libraries and C project. Whole models:
tests/models/crt/test_deploy_c.py.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import numpy as np
import pytest

import kiln
from kiln.crt import CRT_DIR, GRAPH_SOURCES
from kiln.crt.project import graph_project, write_project
from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Function, TensorType, Var
from kiln.relay.interpreter import evaluate
from kiln.runtime.toolchain import compiler as toolchain

RNG = np.random.default_rng(7)


def _const(*shape):
    return Constant(RNG.standard_normal(shape).astype("float32"))


def _conv_relu(cout: int = 8) -> Function:
    x = Var("x", TensorType((1, 4, 8, 8), "float32"))
    conv = Call("nn.conv2d", [x, _const(cout, 4, 3, 3)],
                {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1})
    y = Call("nn.relu", [Call("nn.bias_add", [conv, _const(cout)], {"axis": 1})])
    return Function([x], [Call("nn.max_pool2d", [y], {
        "pool_size": (2, 2), "strides": (2, 2), "padding": (0, 0, 0, 0), "dilation": (1, 1),
        "ceil_mode": False})])


def _dense_sigmoid() -> Function:
    x = Var("x", TensorType((1, 4, 8, 8), "float32"))
    flat = Call("reshape", [x], {"newshape": (1, 256)})
    return Function([x], [Call("sigmoid", [Call("nn.dense", [flat, _const(10, 256)])])])


def test_crt_sources_are_strict_c99(tmp_path):
    cc = toolchain.find_cc()
    for name in GRAPH_SOURCES:
        if name.endswith(".c"):
            toolchain.run([*cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror",
                           f"-I{toolchain.INCLUDE_DIR}", "-c", str(CRT_DIR / name), "-o",
                           str(tmp_path / f"{name}.o")])


@pytest.mark.parametrize("options", [{"runtime": "crt"}, {"executor": "aot"}])
def test_modules_needing_constants_cannot_join(options):
    with pytest.raises(CompileError, match=r"cannot join: 'const_loader' \(not DSO-export"
                                            r"able\); 'kiln_json' \(not DSO-exportable\)"):
        kiln.build(_conv_relu(), "c", byoc=["kiln_json"], **options)
    with pytest.raises(CompileError, match=r"cannot join: 'kiln_jit' \(not DSO-exportable\)"):
        kiln.build(_conv_relu(), "jit", **options)  # kernels compiled at run time: no


MAIN_C = r"""
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include "kiln_crt.h"
#include "kiln_third.h"

const TVMModule* a_TVMSystemLibEntryPoint(void);
const TVMModule* b_TVMSystemLibEntryPoint(void);

static void* load(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  void* p = NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  if (posix_memalign(&p, 64, *n + 64) != 0 || fread(p, 1, *n, f) != *n) exit(3);
  fclose(f);
  return p;
}

static void save(const char* path, const DLTensor* t) {
  FILE* f = fopen(path, "wb");
  fwrite(t->data, 1, KilnTensor_NumBytes(t), f);
  fclose(f);
}

static KilnGraphExecutor* create(const char* dir, const TVMModule* mod, KilnArena* arena,
                                 void* input, size_t input_len) {
  char path[512];
  size_t n;
  void *graph, *params;
  KilnGraphExecutor* ge;
  snprintf(path, sizeof(path), "%s/model/graph.json", dir);
  graph = load(path, &n);
  if (KilnGraphExecutor_Create((const char*)graph, n, mod, arena, &ge) != 0) return NULL;
  snprintf(path, sizeof(path), "%s/model/params.bin", dir);
  params = load(path, &n);
  if (KilnGraphExecutor_LoadParams(ge, params, n) != 0 ||
      KilnGraphExecutor_SetInput(ge, "x", input, input_len) != 0 || KilnGraphExecutor_Run(ge))
    return NULL;
  return ge;
}

int main(int argc, char** argv) {
  static unsigned char memory[1 << 20];
  KilnArena arena;
  KilnGraphExecutor *a, *b;
  size_t n, pn;
  void* x = load(argv[1], &n);
  void* params_a = load(argv[5], &pn);
  void* out = NULL;
  struct kiln_third_inputs in = {x};
  struct kiln_third_outputs outs;
  KilnArena_Init(&arena, memory, sizeof(memory));
  a = create(argv[2], a_TVMSystemLibEntryPoint(), &arena, x, n);
  b = a ? create(argv[3], b_TVMSystemLibEntryPoint(), &arena, x, n) : NULL;
  if (b == NULL) {
    fprintf(stderr, "%s\n", TVMGetLastError());
    return 1;
  }
  if (KilnGraphExecutor_LoadParams(b, params_a, pn) == 0) return 4;
  printf("%s\n", TVMGetLastError());
  { /* every truncation of the graph JSON and of the params blob is an error, not a crash */
    static unsigned char scratch_memory[1 << 20];
    KilnArena scratch;
    KilnGraphExecutor* ge;
    char path[512];
    size_t gn, cut;
    void* graph;
    snprintf(path, sizeof(path), "%s/model/graph.json", argv[2]);
    graph = load(path, &gn);
    for (cut = 0; cut < gn; cut += 7) {
      KilnArena_Init(&scratch, scratch_memory, sizeof(scratch_memory));
      if (KilnGraphExecutor_Create((const char*)graph, cut, a_TVMSystemLibEntryPoint(), &scratch,
                                   &ge) == 0)
        return 5;
    }
    for (cut = 0; cut < pn; cut += 13) {
      if (KilnGraphExecutor_LoadParams(a, params_a, cut) == 0) return 6;
    }
    if (KilnGraphExecutor_LoadParams(a, params_a, pn) != 0) return 7;
  }
  if (posix_memalign(&out, 64, KILN_THIRD_OUTPUT_0_NBYTES) != 0) return 3;
  outs.@OUT@ = out;
  if (kiln_third_run(&in, &outs) != 0) {
    fprintf(stderr, "%s\n", TVMGetLastError());
    return 1;
  }
  save("a.bin", KilnGraphExecutor_GetOutput(a, 0));
  save("b.bin", KilnGraphExecutor_GetOutput(b, 0));
  {
    FILE* f = fopen("c.bin", "wb");
    fwrite(out, 1, KILN_THIRD_OUTPUT_0_NBYTES, f);
    fclose(f);
  }
  return 0;
}
"""


@pytest.mark.parametrize("b_target", [
    "llvm",
    # kernels for three x86-64 levels behind ifuncs, linked statically into the program
    pytest.param("llvm -mcpu=portable", marks=pytest.mark.skipif(
        platform.machine() not in ("x86_64", "AMD64"), reason="multi-level is x86-64 only")),
])
def test_two_graph_models_and_an_aot_model_in_one_program(tmp_path, b_target):
    """Prefixed system libraries (a_ from C, b_ from LLVM objects) and an AOT model share one
    program and one CRT; kernels of the same name in the three do not collide."""
    fa, fb, fc = _conv_relu(), _dense_sigmoid(), _conv_relu()
    x = RNG.standard_normal((1, 4, 8, 8)).astype("float32")
    a = kiln.build(fa, "c", runtime="crt", system_lib_prefix="a_")
    b = kiln.build(fb, b_target, runtime="crt", system_lib_prefix="b_")  # LLVM objects
    c = kiln.build(fc, "c", executor="aot", mod_name="third")
    dirs = [write_project(graph_project(a), tmp_path / "a"),
            write_project(graph_project(b), tmp_path / "b"), c.emit_c_project(tmp_path / "c")]
    (tmp_path / "main.c").write_text(MAIN_C.replace(
        "@OUT@", c.sources.outputs[0].c_name))
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    sources = [str(p) for d in dirs for p in sorted((d / "model").glob("*.[cSo]"))]
    sources += [str(dirs[0] / "crt" / n) for n in GRAPH_SOURCES if n.endswith(".c")]
    # once plainly, once with ASan + UBSan (leaks are the test program's own: not checked)
    for flags in (["-O2"], ["-O1", "-g", "-fsanitize=address,undefined",
                            "-fno-sanitize-recover=undefined"]):
        toolchain.run([*toolchain.find_cc(), *flags, "-std=gnu99", f"-I{dirs[0] / 'include'}",
                       f"-I{dirs[0] / 'crt'}", f"-I{dirs[2] / 'model'}",
                       f"-Wa,-I{dirs[2] / 'model'}", "-o", str(tmp_path / "prog"),
                       str(tmp_path / "main.c"), *sources, "-lm"])
        proc = subprocess.run([str(tmp_path / "prog"), "x.bin", str(dirs[0]), str(dirs[1]), "",
                               str(dirs[0] / "model" / "params.bin")], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False,
                              env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
        assert proc.returncode == 0, proc.stderr
        assert "params blob: a param's" in proc.stdout  # a's params do not fit b's graph
        for name, func in (("a", fa), ("b", fb), ("c", fc)):
            (want,) = evaluate(func, {"x": x})
            got = np.fromfile(tmp_path / f"{name}.bin", "float32").reshape(want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cli_system_lib_static_library_and_project(tmp_path, capsys):
    """kiln compile --system-lib -o m.a writes the library, m.json and m.params; the project's
    Makefile builds a program that runs them; --executor aot -o aot.a holds kiln_tiny_run."""
    if shutil.which("make") is None or shutil.which("nm") is None:
        pytest.skip("needs make and nm (binutils)")
    import onnx
    from onnx import TensorProto, helper

    w = RNG.standard_normal((6, 3, 3, 3)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.reshape(-1))])
    model = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), model)
    from kiln.cli.main import main

    assert main(["compile", str(model), "--system-lib", "-o", str(tmp_path / "m.a"),
                 "--emit-c-project", str(tmp_path / "proj"), "-q"]) == 0
    assert (tmp_path / "m.json").read_text().startswith("{")
    syms = toolchain.run(["nm", str(tmp_path / "m.a")])
    assert " T TVMSystemLibEntryPoint" in syms and " T KilnGraphExecutor_Run" in syms
    toolchain.run(["make", "-s", "-C", str(tmp_path / "proj")])
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    proc = subprocess.run([str(tmp_path / "proj" / "kiln_default_main"), str(tmp_path / "m.json"),
                           str(tmp_path / "m.params"), "x.bin", "y.bin"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    import onnxruntime as ort

    (want,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    got = np.fromfile(tmp_path / "y.bin", "float32").reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert main(["compile", str(model), "--emit-c-project", str(tmp_path / "p2"), "-q"]) == 2
    assert main(["compile", str(model), "--executor", "aot", "-o", str(tmp_path / "aot.a"),
                 "-q"]) == 0
    syms = toolchain.run(["nm", str(tmp_path / "aot.a")])
    assert " T kiln_tiny_run" in syms and " R kiln_tiny_params" in syms
    if platform.machine() == "x86_64":  # foreign kernels with the host's cc: say to set $CC
        capsys.readouterr()
        assert main(["compile", str(model), "--executor", "aot", "--target",
                     "llvm -mtriple=aarch64-linux-gnu", "-o", str(tmp_path / "arm.a"),
                     "-q"]) == 2
        assert "set $CC to the target's cross compiler" in capsys.readouterr().err
        assert not (tmp_path / "arm.a").exists()
