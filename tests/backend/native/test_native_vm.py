"""The VM in C (libkiln_runtime's relax.VMExecutable loader and interpreter, decision 022):
paraphrase-MiniLM-L3-v2 with symbolic (batch_size, sequence_length) run by ``kiln_run`` at three
lengths vs onnxruntime and vs the Python VM on the same file; the C API's errors, results and
storage reuse under AddressSanitizer + UndefinedBehaviorSanitizer (tests/backend/
native_vm_test.c, a tiny VM library); a builtin the native VM lacks named at
vm_initialization; damaged VM executables (bit flips, overwritten fields, truncations of the
executable's bytes inside the blob) loaded and initialized under the sanitizers: an error,
never a crash.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzz_mutators import mutate_bytes
from fuzz_runtime import SoCorpus
from onnx import TensorProto, helper

import kiln
from kiln.errors import ShapeError
from kiln.vm import VirtualMachine

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]
SHAPES = [(1, 7), (1, 32), (2, 77)]
QUICK_FUZZ = 400


def tiny_model(unique: bool = False) -> onnx.ModelProto:
    """``main(x: float32[n, 4]) -> (relu(x + c), x * x)``, or ``Unique(x)`` (a builtin the
    native VM does not implement)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    if unique:  # (Unique needs a static input)
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
        nodes = [helper.make_node("Unique", ["x"], ["y"])]
        outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k"])]
        inits = []
    else:
        nodes = [helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Relu", ["a"], ["y"]),
                 helper.make_node("Mul", ["x", "x"], ["z"])]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in "yz"]
        inits = [helper.make_tensor("c", TensorProto.FLOAT, [4], [1, -2, 3, -4])]
    graph = helper.make_graph(nodes, "tiny", [x], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _export(model: onnx.ModelProto, target: str, out: Path, **kw) -> Path:
    from kiln.frontend import from_onnx

    mod, params = from_onnx(model, **kw)
    exe = kiln.build(mod, target=target, params=params)
    assert isinstance(exe, kiln.runtime.VMExecutable)
    exe.export_library(str(out))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tiny-vm")
    return (_export(tiny_model(), "c", folder / "tiny.so"),
            _export(tiny_model(True), "c", folder / "unique.so"))


def control_flow_executable():
    """A VM executable by hand, no kernels: ``main(x: float32[n, 4], flag: bool[])`` returns
    ``reshape(x, [4, n])`` (through make_tuple / tuple_get) when ``flag``, else a copy of ``x``
    in an arena tensor (alloc_storage of a shape-program size, alloc_tensor, copy, goto)."""
    from kiln.runtime.vm.executable import (
        Symbol,
        VMExecutable,
        VMFunction,
        call,
        const,
        goto,
        heap,
        if_,
        imm,
        reg,
        ret,
    )

    names = ["match_shape", "read_bool", "reshape", "make_tuple", "tuple_get", "alloc_storage",
             "alloc_tensor", "copy", "shape_compute"]
    fns = [None, *(VMFunction(0, "vm.builtin." + n) for n in names)]
    consts = [np.array([2, 32, 2, 1, 0, 0, 4]), np.array([6, 8, 0]), "float32",
              np.array([2, 1, 0, 0, 1, 16])]  # heap[1] = n * 16
    code = [*call(-1, 1, [reg(0), imm(0), const(0)]), *call(-1, 1, [reg(1), imm(1), const(1)]),
            *call(-1, 9, [const(3)]), *call(2, 2, [reg(1)])]
    at_if = len(code)
    code += [*if_(2, 0), *call(3, 3, [reg(0), imm(4), heap(0)]), *call(4, 4, [reg(3), reg(0)]),
             *call(5, 5, [reg(4), imm(0)]), *ret(5)]
    code[at_if + 2] = len(code) - at_if
    code += [*call(6, 6, [imm(0), heap(1)]), *call(7, 7, [reg(6), imm(0), const(2), heap(0),
                                                          imm(4)]),
             *call(-1, 8, [reg(0), reg(7)]), *goto(2), *ret(7)]
    fns[0] = VMFunction(1, "main", 0, len(code), 8, 2,
                        params=[("x", "float32", ["n", 4]), ("flag", "bool", [])])
    return VMExecutable([Symbol("n", 1, 100)], fns, consts, code)


@pytest.fixture(scope="module")
def hand_so(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hand-vm") / "hand.so"
    control_flow_executable().export_library(str(out))
    return out


@pytest.fixture(scope="module")
def minilm_so(wheel_file, tmp_path_factory) -> Path:
    """The MiniLM VM library (compiled once for this module, as benchmarks/dynamic.py does)."""
    path = wheel_file("minilm_l3")
    return _export(onnx.load(path), "llvm", tmp_path_factory.mktemp("vm") / "minilm.so",
                   dim_bounds={"sequence_length": (1, 512)})


@pytest.fixture(scope="module")
def minilm_py(minilm_so) -> VirtualMachine:
    """The same file through the Python runtime's VM."""
    return VirtualMachine(kiln.runtime.load_module(str(minilm_so)), kiln.cpu())


def _env() -> dict[str, str]:
    return {**os.environ, "ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=1",
            "UBSAN_OPTIONS": "print_stacktrace=1", "KILN_NUM_THREADS": "1"}


def minilm_inputs(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(1000, 30000, (batch, seq)).astype("int64")
    mask = np.ones((batch, seq), "int64")
    mask[-1, seq // 2 + 1:] = 0  # a padded row: the mask matters
    return {"input_ids": ids, "attention_mask": mask}


def kiln_run_vm(kiln_run: Path, so: Path, inputs: dict[str, np.ndarray], outputs: list,
                folder: Path, repeat: int = 2, env: dict | None = None) -> tuple[list, str]:
    """``kiln_run so --shape NAME=AxB... IN... OUT...``; returns the outputs and stdout."""
    cmd = [str(kiln_run), str(so), "--repeat", str(repeat)]
    files = []
    for name, x in inputs.items():
        cmd += ["--shape", f"{name}={'x'.join(map(str, x.shape))}"]
        files.append(folder / f"{name}.bin")
        np.ascontiguousarray(x).tofile(files[-1])
    outs = [folder / f"out{k}.bin" for k in range(len(outputs))]
    proc = subprocess.run([*cmd, *map(str, files), *map(str, outs)], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr or proc.stdout
    return [np.fromfile(p, w.dtype).reshape(w.shape) for p, w in zip(outs, outputs)], proc.stdout


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{s}" for b, s in SHAPES])
def test_minilm_kiln_run_matches_onnxruntime_and_python(shape, minilm_so, minilm_py, native_rt,
                                                        wheel_file, reference, tmp_path):
    inputs = minilm_inputs(*shape)
    want = reference(wheel_file("minilm_l3"), inputs)
    py = [t.numpy() for t in minilm_py["main"](*inputs.values())]
    got, out = kiln_run_vm(native_rt / "kiln_run", minilm_so, inputs, py, tmp_path, repeat=1)
    assert "cpu median" in out
    assert len(got) == len(want) == 4
    for g, p, w in zip(got, py, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(g, p, rtol=1e-6, atol=1e-7)  # the same kernels


def test_c_api_under_sanitizers(native_vm_drivers, tiny):
    proc = subprocess.run([str(native_vm_drivers / "native_vm_test"), *map(str, tiny)],
                          capture_output=True, text=True, timeout=300, env=_env(), check=False)
    print(proc.stdout)
    assert proc.returncode == 0 and proc.stdout.endswith("ok\n"), proc.stdout + proc.stderr


def test_tiny_kiln_run_under_sanitizers(native_rt_asan, tiny, tmp_path):
    x = np.random.default_rng(0).standard_normal((9, 4)).astype("float32")
    want = [np.maximum(x + np.array([1, -2, 3, -4], "float32"), 0), x * x]
    got, _ = kiln_run_vm(native_rt_asan / "kiln_run", tiny[0], {"x": x}, want, tmp_path, env=_env())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


CPP_SOURCE = r"""
#include <kiln/runtime.hpp>
#include <cstdio>
int main(int argc, char** argv) {
  kiln::Module exe = kiln::Module::LoadFromFile(argv[1]);
  kiln::Module vm = exe["vm_load_executable"]().AsModule();
  vm["vm_initialization"](int64_t(kDLCPU), int64_t(0), int64_t(2));
  kiln::NDArray x = kiln::NDArray::Empty({3, 4}, kiln::Float(32));
  float* p = static_cast<float*>(x->data);
  for (int i = 0; i < 12; ++i) p[i] = float(i) - 5;
  kiln::RetValue r = vm["main"](x);
  for (int k = 0; k < r.TupleSize(); ++k) {
    DLTensor* y = r.TupleItem(k).AsTensor();
    for (int i = 0; i < 12; ++i) std::printf("%g ", static_cast<float*>(y->data)[i]);
  }
  try {
    vm["main"]();
  } catch (const kiln::Error& e) {
    std::printf("| %s", e.what());
  }
  return 0;
}
"""


def test_cpp_wrapper_tuple(native_rt, tiny, tmp_path):
    """The header-only C++ wrapper: a VM's tuple result through RetValue::TupleItem."""
    if shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler")
    src = tmp_path / "vm.cc"
    src.write_text(CPP_SOURCE)
    subprocess.run(["c++", "-std=c++17", f"-I{native_rt / 'include'}", "-o",
                    str(tmp_path / "vm"), str(src), str(native_rt / "libkiln_runtime.a"),
                    "-ldl", "-lpthread"], check=True, capture_output=True, timeout=300)
    out = subprocess.run([str(tmp_path / "vm"), str(tiny[0])], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    values, error = out.split("|")
    x = np.arange(12, dtype="float32").reshape(3, 4) - 5
    want = np.concatenate([np.maximum(x + np.array([1, -2, 3, -4], "float32"), 0), x * x])
    np.testing.assert_allclose(np.array(values.split(), "float32"), want.reshape(-1))
    assert "takes 1 inputs (x), got 0" in error


@pytest.mark.parametrize("flag", [True, False])
def test_control_flow_and_builtins_under_sanitizers(native_rt_asan, hand_so, flag, tmp_path):
    """If / Goto, read_bool, reshape, make_tuple / tuple_get, shape_compute, alloc_storage /
    alloc_tensor and copy: the C VM under the sanitizers gives what the Python VM gives."""
    x = np.arange(12, dtype="float32").reshape(3, 4)
    want = VirtualMachine(kiln.runtime.load_module(str(hand_so)), kiln.cpu())["main"](
        x, np.array(flag)).numpy()
    assert want.shape == ((4, 3) if flag else (3, 4))
    got, _ = kiln_run_vm(native_rt_asan / "kiln_run", hand_so, {"x": x, "flag": np.array(flag)},
                         [want], tmp_path, env=_env())
    np.testing.assert_array_equal(got[0], want)


def test_jit_device_vm(native_rt, tmp_path):
    """A VM library whose kernels are the source-embedded ``jit`` device's: compiled by the C
    runtime at the first call (into ``$KILN_CACHE_DIR``), then run by the C VM."""
    from kiln.frontend import from_onnx

    mod, params = from_onnx(tiny_model())
    so = tmp_path / "tiny_jit.so"
    kiln.build(mod, target="jit", params=params).export_library(str(so))
    x = np.random.default_rng(2).standard_normal((6, 4)).astype("float32")
    want = [np.maximum(x + np.array([1, -2, 3, -4], "float32"), 0), x * x]
    got, _ = kiln_run_vm(native_rt / "kiln_run", so, {"x": x}, want, tmp_path, repeat=1,
                         env={**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert list((tmp_path / "cache" / "device").glob("device-*.so"))


def test_unsupported_builtin_is_named(native_rt, tiny, tmp_path):
    proc = subprocess.run([str(native_rt / "kiln_run"), str(tiny[1]), "--shape", "x=2x4",
                           "--random"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "builtin 'vm.builtin.unique'" in proc.stderr and "Python runtime" in proc.stderr


def test_shape_to_tensor(native_rt_asan, tmp_path):
    """``shape_to_tensor`` (a shape used as data, e.g. an If on ``Shape(x)[0] == 1``): the C VM
    under the sanitizers gives what the Python VM gives."""
    from kiln.runtime.vm.executable import (
        Symbol,
        VMExecutable,
        VMFunction,
        call,
        const,
        heap,
        imm,
        reg,
        ret,
    )

    code = [*call(-1, 1, [reg(0), imm(0), const(0)]),
            *call(1, 2, [const(1), const(2), heap(0), imm(4)]), *ret(1)]
    exe = VMExecutable([Symbol("n", 1, 100)],
                       [VMFunction(1, "main", 0, len(code), 2, 1,
                                   params=[("x", "float32", ["n", 4])]),
                        VMFunction(0, "vm.builtin.match_shape"),
                        VMFunction(0, "vm.builtin.shape_to_tensor")],
                       [np.array([2, 32, 2, 1, 0, 0, 4]), "int32", np.array([2])], code)
    so = tmp_path / "shape.so"
    exe.export_library(str(so))
    x = np.zeros((7, 4), "float32")
    want = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())["main"](x).numpy()
    np.testing.assert_array_equal(want, np.array([7, 4], "int32"))
    got, _ = kiln_run_vm(native_rt_asan / "kiln_run", so, {"x": x}, [want], tmp_path, env=_env())
    np.testing.assert_array_equal(got[0], want)


def test_kiln_run_vm_usage_errors(native_rt, tiny):
    proc = subprocess.run([str(native_rt / "kiln_run"), str(tiny[0]), "--random"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "give --input-shape x:DIMxDIM..." in proc.stderr


@pytest.mark.slow
def test_minilm_under_sanitizers(native_rt_asan, minilm_so, wheel_file, reference, tmp_path):
    inputs = minilm_inputs(1, 7)
    want = reference(wheel_file("minilm_l3"), inputs)
    got, _ = kiln_run_vm(native_rt_asan / "kiln_run", minilm_so, inputs, want, tmp_path, repeat=1,
                         env=_env())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


# ---------------------------------------------------------------- damaged VM executables
_INTERESTING = [0, 1, -1, 2, 7, 63, 64, 65, 1 << 20, 1 << 31, (1 << 55) - 1, 1 << 56,
                (1 << 63) - 1, -(1 << 63)]


def damaged_payloads(payload: bytes, count: int, seed: int) -> list[bytes]:
    """The payload with its VM executable's bytes damaged: in place (bit flips, bytes and
    i64 words overwritten: the blob's other lengths still hold, so the VM parser sees the
    damage), or cut or extended with its length prefix fixed."""
    start = payload.index(b"KILNVMEX")
    (length,) = struct.unpack_from("<Q", payload, start - 8)
    end = start + length
    out = []
    for i in range(count):
        rng = random.Random(f"native_vm:{seed}:{i}")
        kind = rng.random()
        if kind < 0.45:
            data, _ = mutate_bytes(rng, payload, start, end, resize=False)
        elif kind < 0.8:
            buf = bytearray(payload)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(start, end - 8)
                at -= (at - start) % 8 if rng.random() < 0.7 else 0
                value = (rng.choice(_INTERESTING) + rng.choice([0, 0, 1])) & ((1 << 64) - 1)
                struct.pack_into("<Q", buf, at, value)
            data = bytes(buf)
        else:
            new_len = rng.randrange(0, length + 64)
            exe = payload[start:end][:new_len] + bytes(rng.getrandbits(8)
                                                       for _ in range(max(0, new_len - length)))
            data = (payload[:start - 8] + struct.pack("<Q", len(exe)) + exe + payload[end:])
        out.append(data)
    return out


def run_vm_fuzz(drivers: Path, so: Path, folder: Path, count: int) -> str:
    payload = SoCorpus(str(so)).payload
    cases = [payload, *damaged_payloads(payload, count, int(os.environ.get("KILN_FUZZ_SEED",
                                                                             "0")))]
    corpus = folder / "vm.corpus"
    corpus.write_bytes(b"".join(struct.pack("<Q", len(c)) + c for c in cases))
    proc = subprocess.run([str(drivers / "native_fuzz_driver"), "blob", str(so), str(corpus)],
                          capture_output=True, text=True, timeout=3600, env=_env(), check=False)
    assert proc.returncode == 0, (proc.stderr or proc.stdout)[-4000:]
    assert proc.stdout.startswith(f"cases {count + 1} "), proc.stdout
    errors = int(proc.stdout.split()[3])
    assert 0 < errors <= count  # the good payload loads; most damage is an error
    print(f"native VM fuzz: {proc.stdout.strip()}, 0 crashes")
    return proc.stdout


def test_damaged_vm_executables_under_sanitizers(native_vm_drivers, tiny, hand_so, tmp_path):
    run_vm_fuzz(native_vm_drivers, tiny[0], tmp_path, QUICK_FUZZ)
    run_vm_fuzz(native_vm_drivers, hand_so, tmp_path, QUICK_FUZZ // 2)


@pytest.mark.fuzz
def test_damaged_vm_executables_large(native_vm_drivers, tiny, hand_so, tmp_path):
    count = int(os.environ.get("KILN_FUZZ_CASES", "5000"))
    run_vm_fuzz(native_vm_drivers, tiny[0], tmp_path, 2 * count)
    run_vm_fuzz(native_vm_drivers, hand_so, tmp_path, count)


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["aarch64", "riscv64"])
def test_vm_cross_under_qemu(isa, tmp_path, build_once):
    """The C VM on other machines: the tiny VM library exported with ``llvm -mtriple=...``
    (riscv64 with RVV) and the runtime built by the cross GCC, run by kiln_run under qemu-user
    at a shape chosen at run time."""
    from test_native_cross import cross_runtime

    import kiln.runtime as rt

    cfg, runtime = cross_runtime(isa, build_once)
    from kiln.frontend import from_onnx

    mod, params = from_onnx(tiny_model())
    so = tmp_path / "tiny.so"
    kiln.build(mod, target=cfg["target"], params=params).export_library(
        str(so), fcompile=rt.cross_compiler(cfg["cc"]))
    x = np.random.default_rng(1).standard_normal((5, 4)).astype("float32")
    want = [np.maximum(x + np.array([1, -2, 3, -4], "float32"), 0), x * x]
    files = [tmp_path / f"{n}.bin" for n in ("x", "y", "z")]
    x.tofile(files[0])
    proc = subprocess.run([*cfg["qemu"], str(runtime / "kiln_run"), str(so), "--repeat", "1",
                           "--shape", "x=5x4", *map(str, files)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    for f, w in zip(files[1:], want):
        np.testing.assert_allclose(np.fromfile(f, "float32").reshape(w.shape), w, rtol=1e-6)


@pytest.mark.parametrize(("rows", "relation"), [(66, "n <= 64"), (3, "n % 2 == 0"),
                                                (0, "n >= 2")])
def test_bound_errors_name_the_relation_in_c_and_python(native_rt, tmp_path, rows, relation):
    """A symbol's bounds (declared, or assumed by the importer, decision 044) broken at run
    time: the C VM and the Python VM name the input, the dim, the symbol and the relation."""
    from kiln.runtime.vm.executable import (
        Symbol,
        VMExecutable,
        VMFunction,
        call,
        const,
        imm,
        reg,
        ret,
    )

    code = [*call(-1, 1, [reg(0), imm(0), const(0)]), *ret(0)]
    exe = VMExecutable([Symbol("n", 2, 64, 2)],
                       [VMFunction(1, "main", 0, len(code), 1, 1,
                                   params=[("x", "float32", ["n", 4])]),
                        VMFunction(0, "vm.builtin.match_shape")],
                       [np.array([2, 32, 2, 1, 0, 0, 4])], code)
    so = tmp_path / "bounds.so"
    exe.export_library(str(so))
    with pytest.raises(ShapeError, match=rf"input 'x' dim 0: symbol n = {rows} .*\(needs "
                                         rf"{relation}\)"):
        VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())["main"](
            np.zeros((rows, 4), "float32"))
    np.zeros((rows, 4), "float32").tofile(tmp_path / "x.bin")
    proc = subprocess.run([str(native_rt / "kiln_run"), str(so), "--shape", f"x={rows}x4",
                           str(tmp_path / "x.bin"), str(tmp_path / "out.bin")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    assert f"dim 0: symbol n = {rows}" in proc.stderr and f"(needs {relation})" in proc.stderr, \
        proc.stderr
