"""The llvm target beyond what every target shares: CPU-specific code (AVX2 vs AVX-512), the object
module and its sources, export through an LLVM devc.o, the parallel launch under
KILN_NUM_THREADS, error paths (unaligned tensors, failing parallel tasks, unsupported dtypes,
foreign objects), large-blob export time, and ``kiln compile --target llvm``."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from test_codegen import _kernel, k_parallel_alloc
from test_ops import single_op
from test_runtime_roundtrip import make_graph

import kiln
import kiln.runtime as rt
from kiln.backend.te_compiler import lower_primitive
from kiln.codegen.llvm.build import build_llvm, codegen_ir
from kiln.codegen.llvm.machine import target_machine
from kiln.errors import CompileError, KilnError, ToolchainError
from kiln.graph_executor import GraphModule
from kiln.runtime import c_types
from kiln.runtime.object_module import object_machine
from kiln.target import Target, default_target
from kiln.tir import interpreter as loop_interp
from kiln.tir import loop as L
from kiln.tir.transform.make_packed_api import make_packed_api

HOST = Target("llvm -mcpu=native")


def binary_kernel(name: str, shape, op) -> L.PrimFunc:
    """``c = op(a, b)`` over ``shape``: outer loop parallel when large, inner vectorized."""
    a, b, c = (L.Buffer(n, tuple(shape), "float32") for n in "abc")
    idx = [L.Var(f"i{k}") for k in range(len(shape))]
    body: L.Stmt = L.BufferStore(c, op(a[tuple(idx)], b[tuple(idx)]), idx)
    for k in reversed(range(len(shape))):
        kind = ("parallel" if k == 0 and shape[0] >= 4096 else
                "vectorized" if k == len(shape) - 1 else "serial")
        body = L.For(idx[k], L.IntImm(0), L.IntImm(shape[k]), kind, body)
    return make_packed_api(L.PrimFunc(name, [a, b, c], body))


def add_mul_library(shape, target="llvm"):
    return build_llvm([binary_kernel("fused_add", shape, lambda x, y: x + y),
                       binary_kernel("fused_mul", shape, lambda x, y: x * y)], target)


def sample_kernels():
    """A conv (workspace, guarded loads) and a parallel kernel with scratch buffers."""
    call, arrays = _kernel("conv_bias_relu")
    par, par_inputs, par_out, _ = k_parallel_alloc()
    return [lower_primitive(call, "conv"), make_packed_api(par)], (call, arrays), (
        par, par_inputs, par_out)


def check_sample_kernels(lib, conv, par):
    (call, arrays), (func, inputs, out) = conv, par
    from kiln.backend.te_compiler import to_te
    from kiln.schedules import schedule_loops, schedule_te
    from kiln.tir.lower import Schedule, lower
    from kiln.tir.transform.simplify import simplify

    ins, o = to_te(call.body)
    oracle = schedule_loops(simplify(lower(schedule_te(Schedule(o)), ins, "conv")))
    want = np.zeros(call.checked_type.shape, "float32")
    loop_interp.run(oracle, *arrays, want)
    got = rt.empty(want.shape, "float32")
    lib["conv"](*[rt.array(a) for a in arrays], got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    want = out.copy()
    loop_interp.run(func, *inputs, want)
    got = rt.array(out)
    lib[func.name](*[rt.array(a) for a in inputs], got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ CPU-specific code
def test_avx2_target_emits_no_avx512():
    funcs, conv, par = sample_kernels()
    lib = build_llvm(funcs, "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell")
    asm = lib.get_source("asm")
    assert "ymm" in asm, "the haswell build should use 256-bit AVX registers"
    assert "zmm" not in asm, "an AVX2-only target must not use AVX-512 registers"
    if HOST.arch != "x86_64" or not HOST.has_feature("avx2"):
        pytest.skip("this host cannot run AVX2 code")
    check_sample_kernels(lib, conv, par)


def test_native_target_uses_the_host_width():
    funcs, conv, par = sample_kernels()
    lib = build_llvm(funcs, "llvm -mcpu=native")
    asm = lib.get_source("asm")
    if HOST.arch == "x86_64":
        reg = {512: "zmm", 256: "ymm", 128: "xmm"}[HOST.vector_bits()]
        assert reg in asm, f"expected {reg} registers for {HOST.mcpu}"
    check_sample_kernels(lib, conv, par)


# ------------------------------------------------------------------ the module
def test_sources_and_save(tmp_path):
    funcs, _conv, par = sample_kernels()
    lib = build_llvm(funcs, "llvm")
    assert lib.type_key == "llvm" and lib.is_dso_exportable and lib.export_suffix == "o"
    assert isinstance(lib, rt.ObjectModule) and lib.list_function_names() == ["conv",
                                                                               par[0].name]
    ir = lib.get_source()
    assert re.search(r"define .*i32 @conv\(ptr", ir) and "TVMBackendParallelLaunch" in ir
    assert lib.get_source("ll") == ir
    assert re.search(r"^conv:", lib.get_source("asm"), re.MULTILINE)
    lib.save(str(tmp_path / "k.o"))
    lib.save(str(tmp_path / "k.ll"))
    lib.save(str(tmp_path / "k.s"))
    obj = (tmp_path / "k.o").read_bytes()
    with open(sys.executable, "rb") as f:
        assert obj == lib.obj and object_machine(obj) == object_machine(f.read(64))
    assert (tmp_path / "k.ll").read_text() == ir
    assert "conv:" in (tmp_path / "k.s").read_text()
    with pytest.raises(KilnError, match="source format 'cuda'"):
        rt.ObjectModule(lib.obj, lib.func_names).get_source("cuda")


def test_export_links_objects_and_llvm_blob(tmp_path):
    fac = rt.GraphExecutorFactoryModule(make_graph(), add_mul_library([2, 3]),
                                        {"p0": np.arange(6, dtype="float32").reshape(2, 3)})
    work = tmp_path / "work"
    path = str(tmp_path / "m.so")
    fac.export_library(path, workspace_dir=str(work))
    files = sorted(os.listdir(work))
    assert "lib0.o" in files and "devc.o" in files and "devc.c" not in files, files
    loaded = rt.load_module(path)
    assert loaded.imported_modules[0].list_function_names() == ["fused_add", "fused_mul"]
    gm = GraphModule(loaded["default"](rt.cpu()))
    x, y = np.ones((2, 3), "float32"), np.full((2, 3), 2.0, "float32")
    gm.run(x=x, y=y)
    np.testing.assert_allclose(gm.get_output(0).numpy(),
                               (x + y) * np.arange(6).reshape(2, 3) + x)
    assert json.loads(loaded["get_graph_json"]()) == json.loads(make_graph())


_THREADS_SCRIPT = r"""
import sys, numpy as np, kiln.runtime as rt
lib = rt.load_module(sys.argv[1])
x = np.load(sys.argv[2])
out = rt.empty((x.shape[0],), "float32")
lib[sys.argv[3]](rt.array(x), out)
np.save(sys.argv[4], out.numpy())
"""


def test_parallel_launch_same_result_on_1_and_2_threads(tmp_path):
    func, inputs, out, _ = k_parallel_alloc()
    lib = build_llvm([make_packed_api(func)], "llvm")
    assert "TVMBackendParallelLaunch" in lib.get_source()
    path = str(tmp_path / "par.so")
    lib.export_library(path)
    np.save(tmp_path / "x.npy", inputs[0])
    results = []
    for threads in ("1", "2"):
        res = tmp_path / f"out{threads}.npy"
        env = dict(os.environ, KILN_NUM_THREADS=threads)
        subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, path, str(tmp_path / "x.npy"),
                        func.name, str(res)], env=env, check=True)
        results.append(np.load(res))
    want = out.copy()
    loop_interp.run(func, *inputs, want)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], want, rtol=1e-5)


# ------------------------------------------------------------------ errors
def test_failing_parallel_task_reports_its_message():
    x, out = L.Buffer("x", (64,), "float32"), L.Buffer("out", (64,), "float32")
    huge = L.Buffer("huge", (1 << 46,), "float32")  # 256 TiB: no allocator gives that
    r = L.Var("r")
    body = L.For(r, L.IntImm(0), L.IntImm(64), "parallel", L.Allocate(huge, L.seq(
        L.BufferStore(huge, x[r], [L.IntImm(0)]),
        L.BufferStore(out, huge[L.IntImm(0)], [r]))))
    lib = build_llvm([make_packed_api(L.PrimFunc("alloc_fail", [x, out], body))], "llvm")
    with pytest.raises(KilnError, match=r"alloc_fail: cannot allocate 281474976710656 bytes "
                                        r"of workspace for huge"):
        lib["alloc_fail"](rt.empty((64,), "float32"), rt.empty((64,), "float32"))


def test_unaligned_tensor_is_an_error_not_a_crash():
    lib = add_mul_library([16])
    a, b, c = (rt.empty((16,), "float32") for _ in range(3))
    bad = c_types.DLTensor.from_buffer_copy(ctypes.string_at(a.handle_address, 48))
    bad.data = a.data_ptr + 4
    with pytest.raises(KilnError, match=r"fused_add: argument 0 \(a\): data pointer is not "
                                        r"64-byte aligned"):
        lib["fused_add"](ctypes.pointer(bad), b, c)
    lib["fused_add"](a, b, c)


def test_float16_kernel_runs():
    """float16 buffers (LLVM half): a doubling kernel, libm through float."""
    a, b = L.Buffer("a", (4,), "float16"), L.Buffer("b", (4,), "float16")
    i = L.Var("i")
    body = L.BufferStore(b, L.call("exp", a[i]) + a[i], [i])
    func = make_packed_api(L.PrimFunc("half_kernel", [a, b], L.For(
        i, L.IntImm(0), L.IntImm(4), "serial", body)))
    lib = build_llvm([func], "llvm")
    x = np.array([0.5, -1.0, 2.0, 0.0], np.float16)
    out = kiln.runtime.array(np.zeros(4, np.float16))
    lib.get_function("half_kernel")(kiln.runtime.array(x), out)
    np.testing.assert_allclose(out.numpy(), (np.exp(x.astype(np.float32)) + x).astype(np.float16),
                               rtol=1e-3)


@pytest.mark.parametrize("enabled", [True, False])
def test_codegen_ir_pauses_the_garbage_collector_and_restores_it(enabled):
    """While it builds a module, codegen_ir keeps Python's cyclic collector off (its scans of
    llvmlite's objects cost more CPU than building them), then collects the youngest generation
    once; it leaves the collector as it found it, also when the codegen fails."""
    kernels = [binary_kernel(f"k{i}", (64, 64), lambda x, y: x + y) for i in range(4)]
    unpacked = L.PrimFunc("unpacked", [], L.Evaluate(L.IntImm(0)))
    target = Target("llvm")
    layout = str(target_machine(target).target_data)
    codegen_ir(kernels[:1], target, data_layout=layout)  # imports the codegen (its collections)
    started: list[int] = []

    def record(phase, info):
        if phase == "start":
            started.append(info["generation"])

    was = gc.isenabled()
    gc.callbacks.append(record)
    try:
        (gc.enable if enabled else gc.disable)()
        text = codegen_ir(kernels, target, data_layout=layout)
        assert gc.isenabled() is enabled
        assert started == ([0] if enabled else [])
        assert text.count('define i32 @"k') == 4
        with pytest.raises(CompileError, match="needs MakePackedAPI first"):
            codegen_ir([unpacked], target, data_layout=layout)
        assert gc.isenabled() is enabled
    finally:
        gc.callbacks.remove(record)
        (gc.enable if was else gc.disable)()


def test_unknown_triple():
    with pytest.raises(CompileError, match="does not support triple 'sparc9-sun-foo'"):
        build_llvm([], "llvm -mtriple=sparc9-sun-foo")


def test_foreign_object_needs_a_cross_compiler(tmp_path):
    foreign = ("llvm -mtriple=riscv64-linux-gnu -mattr=+v" if HOST.arch != "riscv64"
               else "llvm -mtriple=aarch64-linux-gnu")
    lib = add_mul_library([8], foreign)
    assert not lib.is_host_object
    with pytest.raises(KilnError, match="cannot run on this host"):
        lib.get_function("fused_add")
    with pytest.raises(ToolchainError, match=r"pass fcompile=cross_compiler"):
        lib.export_library(str(tmp_path / "x.so"))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ build, CLI, big blobs
def test_build_uses_the_current_target():
    x = {"x": np.ones((2, 3), "float32")}
    mod, params = kiln.frontend.from_onnx(single_op("Relu", x), shape={"x": (2, 3)})
    with Target("llvm"):
        lib = kiln.build(mod, params=params)
    assert [m.type_key for m in lib.imported_modules] == ["llvm"]
    gm = GraphModule(lib["default"](rt.cpu()))
    gm.run(x=-x["x"])
    np.testing.assert_array_equal(gm.get_output(0).numpy(), 0 * x["x"])
    lib = kiln.build(mod, params=params)  # no target, none current: the host's fastest
    assert [m.type_key for m in lib.imported_modules] == ["llvm"]
    assert lib.imported_modules[0].target == default_target() == "llvm -mcpu=native"


def test_cli_compile_llvm_native(tmp_path, capsys):
    import onnx

    from kiln.cli.main import main

    x = {"x": np.random.default_rng(0).standard_normal((4, 6)).astype("float32")}
    model = single_op("Tanh", x)
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(
        "y0", onnx.TensorProto.FLOAT, (4, 6)))
    onnx.save(model, str(tmp_path / "m.onnx"))
    out = tmp_path / "m.so"
    assert main(["compile", str(tmp_path / "m.onnx"), "--target", "llvm -mcpu=native",
                 "-o", str(out), "-q"]) == 0
    assert "target llvm -mcpu=native" in capsys.readouterr().out
    gm = GraphModule(rt.load_module(str(out))["default"](rt.cpu()))
    gm.run(x=x["x"])
    np.testing.assert_allclose(gm.get_output(0).numpy(), np.tanh(x["x"]), rtol=1e-6)


def test_large_params_export_through_llvm_object(tmp_path):
    n = 100 * 2**20 // 4  # 100 MiB of float32
    p0 = (np.arange(n) % 4093).astype("float32")
    fac = rt.GraphExecutorFactoryModule(make_graph(shape=[n]), add_mul_library([n]),
                                        {"p0": p0})
    work = tmp_path / "work"
    path = str(tmp_path / "big.so")
    start = time.perf_counter()
    fac.export_library(path, workspace_dir=str(work))
    elapsed = time.perf_counter() - start
    assert (work / "devc.o").exists() and not (work / "devc.S").exists()
    assert elapsed < 30, f"exporting a 100 MiB blob took {elapsed:.1f}s"
    del fac
    loaded = rt.load_module(path)
    got = loaded["get_graph_params"]()["p0"]
    assert got.shape == (n,) and np.array_equal(got.numpy(), p0)
    print(f"100 MiB params, llvm target: export {elapsed:.2f}s")


# ------------------------------------------------------------------ explicit vectors
def register_block_kernel(lanes_total: int = 32) -> L.PrimFunc:
    """A conv-like register block: ``acc[7, B] += x[i, k] * w[k, B]`` over k, then
    ``out = max(acc + res, exp(-acc))`` with a guarded (``i >= 1``) read of the previous row."""
    B = lanes_total
    x, w = L.Buffer("x", (7, 16), "float32"), L.Buffer("w", (16, B), "float32")
    res, out = L.Buffer("res", (7, B), "float32"), L.Buffer("out", (7, B), "float32")
    acc = L.Buffer("acc", (7, B), "float32", "local")
    i, k, b = L.Var("i"), L.Var("k"), L.Var("b")

    def block(body: L.Stmt) -> L.Stmt:
        return L.For(i, L.IntImm(0), L.IntImm(7), "unrolled",
                     L.For(b, L.IntImm(0), L.IntImm(B), "vectorized", body))

    init = block(L.BufferStore(acc, L.FloatImm(0.0), [i, b]))
    update = L.For(k, L.IntImm(0), L.IntImm(16), "serial",
                   block(L.BufferStore(acc, acc[i, b] + x[i, k] * w[k, b], [i, b])))
    prev = L.Select(i >= 1, res[i - 1, b], L.FloatImm(0.5))
    store = block(L.BufferStore(out, L.maximum(acc[i, b] + prev,
                                               L.call("exp", L.FloatImm(0.0) - acc[i, b])),
                                [i, b]))
    body = L.Allocate(acc, L.seq(init, update, store))
    return L.PrimFunc("block", [x, w, res, out], body)


@pytest.mark.parametrize("target,lanes", [("llvm -mcpu=native", None),
                                          ("llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64", 4)])
def test_vectorized_loops_are_explicit_vectors(target, lanes):
    """Contiguous ``vectorized`` loops become ``<W x float>`` code (16 chunks of 4 lanes on
    SSE2: the chunk loop) and compute what the loop interpreter computes."""
    if HOST.arch != "x86_64" and lanes:
        pytest.skip("x86-64 code")
    func = register_block_kernel(64 if lanes else 32)
    lib = build_llvm([make_packed_api(func)], target)
    width = lanes or Target(target).vector_bits() // 32
    ir_text = lib.get_source("ll")
    assert f"<{width} x float>" in ir_text
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(b.shape).astype("float32") for b in func.params[:3]]
    want = np.zeros(func.params[3].shape, "float32")
    loop_interp.run(func, *args, want)
    got = rt.empty(want.shape, "float32")
    lib["block"](*[rt.array(a) for a in args], got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_overlapping_builds_in_threads_keep_the_collector_paused_until_the_last_ends():
    """Two threads building at once: the collector stays off until the last build ends (found
    in review: the first build to end switched it on under the second)."""
    import threading

    from kiln.codegen.llvm.build import _collector_paused

    was = gc.isenabled()
    gc.enable()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def build_a():
        with _collector_paused():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def build_b():
        a_in.wait(10)
        with _collector_paused():
            b_in.set()
            a_out.wait(10)
            seen["during b, after a"] = gc.isenabled()

    try:
        threads = [threading.Thread(target=build_a), threading.Thread(target=build_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert seen == {"during b, after a": False}
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
