"""Multi-level (portable) libraries: one ``.so`` with kernels for several x86-64 levels, the
level chosen on the CPU at load time (kiln.codegen.llvm.multi_level, docs/decisions/023).

Each test builds its model once for ``llvm -mcpu=portable`` (x86-64-v2, v3, v4) and runs the
exported library in subprocesses: the level is chosen when a library is loaded, so the
``KILN_CPU_LEVEL`` override needs a fresh process per value."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from backend_helpers import assert_close_to_reference, cpu_flags, run_onnxruntime
from onnx import TensorProto, helper

import kiln
from kiln.codegen.llvm.multi_level import LEVEL_SYMBOL, variant_name
from kiln.errors import KilnError
from kiln.frontend import from_onnx
from kiln.target import Target, host_triple

pytestmark = pytest.mark.skipif(not host_triple().startswith("x86_64"),
                                reason="multi-level libraries are for x86-64 hosts")




def host_level() -> str:
    """The highest x86-64 level of this CPU, from /proc/cpuinfo (the kernel's view)."""
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags:
        return "x86-64-v4"
    if {"avx", "avx2", "bmi1", "bmi2", "fma"} <= flags:
        return "x86-64-v3"
    if {"popcnt", "pni", "ssse3", "sse4_1", "sse4_2"} <= flags:
        return "x86-64-v2"
    return "x86-64"


def conv_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A 3×3 conv (sub-blocks of two vectors below AVX-512), a depthwise 3×3 and a 1×1 conv
    (3-pixel blocks of the whole 32-channel block, the last shifted: 14 = 3 · 4 + 2), on
    NCHW32c."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 8, 3, 3)).astype("float32") * 0.2
    w2 = rng.standard_normal((32, 32, 1, 1)).astype("float32") * 0.2
    b1 = rng.standard_normal(32).astype("float32")
    wd = rng.standard_normal((32, 1, 3, 3)).astype("float32") * 0.2
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd"], ["d1"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("Conv", ["d1", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])],
        [onnx.numpy_helper.from_array(a, n)
         for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"), (wd, "wd"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": rng.standard_normal((1, 8, 14, 14)).astype("float32")}


def dense_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 80)).astype("float32") * 0.1
    b = rng.standard_normal(80).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"],
                                                                            ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 80])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": rng.standard_normal((5, 96)).astype("float32")}


RUNNER = textwrap.dedent("""
    import ctypes, json, sys
    import numpy as np
    import kiln
    path, inputs = sys.argv[1], np.load(sys.argv[2])
    gm = kiln.graph_executor.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))
    level = ctypes.CDLL(path).{sym}
    level.restype = ctypes.c_char_p
    for name in inputs.files:
        gm.set_input(name, inputs[name])
    try:
        gm.run()
    except kiln.errors.KilnError as err:
        print(json.dumps({{"level": level().decode(), "error": str(err)}}))
        sys.exit(0)
    np.save(sys.argv[3], gm.get_output(0).numpy())
    print(json.dumps({{"level": level().decode()}}))
""").format(sym=LEVEL_SYMBOL)


def run_in_process(so, inputs, tmp_path, level: str | None,
                   **extra: str) -> tuple[dict, np.ndarray | None]:
    """Load ``so`` in a fresh Python with ``KILN_CPU_LEVEL=level`` (and ``extra`` variables);
    (report, output)."""
    np.savez(tmp_path / "in.npz", **inputs)
    out = tmp_path / f"out_{level}.npy"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **extra)
    env.pop("KILN_CPU_LEVEL", None)
    if level is not None:
        env["KILN_CPU_LEVEL"] = level
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(so), str(tmp_path / "in.npz"),
                           str(out)], env=env, capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return report, (np.load(out) if out.exists() else None)


@pytest.fixture(scope="module", params=["conv", "dense"])
def portable(request, tmp_path_factory):
    model, inputs = conv_model() if request.param == "conv" else dense_model()
    mod, params = from_onnx(model, shape={k: v.shape for k, v in inputs.items()})
    lib = kiln.build(mod, target="llvm -mcpu=portable", params=params)
    so = tmp_path_factory.mktemp(request.param) / "portable.so"
    lib.export_library(str(so))
    return request.param, lib, so, run_onnxruntime(model, inputs), inputs


def test_host_level_is_picked_and_correct(portable, tmp_path):
    _, _, so, want, inputs = portable
    report, got = run_in_process(so, inputs, tmp_path, None)
    assert report == {"level": max(host_level(), "x86-64-v2")}
    assert_close_to_reference([got], want)


def test_override_forces_the_baseline_and_is_correct(portable, tmp_path):
    _, _, so, want, inputs = portable
    report, got = run_in_process(so, inputs, tmp_path, "x86-64-v2")
    assert report == {"level": "x86-64-v2"}
    assert_close_to_reference([got], want)


def test_override_needs_the_exact_name(portable, tmp_path):
    """The dispatcher parses /proc/self/environ itself (no C library in a resolver)."""
    _, _, so, _, inputs = portable
    report, _ = run_in_process(so, inputs, tmp_path, "x86-64-v2x", XKILN_CPU_LEVEL="x86-64",
                               KILN_CPU_LEVELS="x86-64")
    assert report == {"level": max(host_level(), "x86-64-v2")}


def test_override_never_raises_the_level_above_the_cpu(portable, tmp_path):
    _, _, so, _, inputs = portable
    if host_level() == "x86-64-v4":
        pytest.skip("this CPU has AVX-512: every level runs")
    report, _ = run_in_process(so, inputs, tmp_path, "x86-64-v4")
    assert report == {"level": host_level()}


def test_below_the_lowest_level_fails_with_a_message(tmp_path):
    model, inputs = dense_model()
    mod, params = from_onnx(model, shape={"x": (5, 96)})
    lib = kiln.build(mod, target="llvm -mcpu=x86-64-v3,x86-64-v4", params=params)
    so = tmp_path / "v3.so"
    lib.export_library(str(so))
    report, got = run_in_process(so, inputs, tmp_path, "x86-64-v2")
    assert report["level"] == "none" and got is None
    assert "kernels for x86-64-v3, x86-64-v4 only" in report["error"]


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not found")
def test_every_level_is_in_the_library(portable):
    _, lib, so, _, _ = portable
    kernels = lib.imported_modules[0].list_function_names()
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True,
                         text=True, check=True).stdout
    bodies = dict(re.findall(r"^[0-9a-f]+ <([^>]+)>:\n(.*?)(?=\n\n|\Z)", dis,
                             re.MULTILINE | re.DOTALL))
    # a variant and its outlined parts (``<variant>_parallel0``, ``<variant>_compute_``)
    regs = {level: "".join(body for name, body in bodies.items() for k in kernels
                           if re.fullmatch(re.escape(variant_name(k, level)) + r"(_\w+)?", name))
            for level in ("x86-64-v2", "x86-64-v3", "x86-64-v4")}
    assert all(regs.values()), [k for k, v in regs.items() if not v]
    assert "%zmm" in regs["x86-64-v4"]
    assert "%ymm" in regs["x86-64-v3"] and "%zmm" not in regs["x86-64-v3"]
    assert "%ymm" not in regs["x86-64-v2"] and "%zmm" not in regs["x86-64-v2"]
    # the public names are ifuncs, the variants are not exported
    dyn = subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True,
                         check=True).stdout
    for k in kernels:
        assert re.search(rf"\sg\s+i\w*\s.*\s{k}$", dyn, re.MULTILINE), k  # "g iD": a global ifunc
        assert variant_name(k, "x86-64-v3") not in dyn
    exported = ctypes.CDLL(str(so))
    assert getattr(exported, kernels[0]) is not None


def test_layouts_are_decided_for_the_widest_level():
    t = Target("llvm -mcpu=portable")
    assert t.levels == ("x86-64-v2", "x86-64-v3", "x86-64-v4")
    assert t.vector_bits() == 512 and t.mcpu == "x86-64-v2"
    assert t.level("x86-64-v3") == Target("llvm -mcpu=x86-64-v3")
    assert Target("llvm -mcpu=x86-64-v4,x86-64").levels == ("x86-64", "x86-64-v4")
    assert Target("llvm -mcpu=native").levels == ()


@pytest.mark.parametrize("spec, match", [
    ("c -mcpu=portable", "needs the llvm target"),
    ("llvm -mcpu=x86-64-v3,haswell", "'haswell' is not an x86-64 level"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=portable", "for x86_64"),
])
def test_bad_multi_level_targets(spec, match):
    with pytest.raises(KilnError, match=match):
        Target(spec)


def test_graph_is_shared_by_all_levels(portable):
    name, lib, _, _, _ = portable
    graph = json.loads(lib.get_graph_json())
    funcs = {n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] == "tvm_op"}
    assert funcs == set(lib.imported_modules[0].list_function_names())
    if name == "conv":  # NCHW32c: the channel block of the widest level (2 zmm vectors)
        shapes = graph["attrs"]["shape"][1]
        assert [1, 1, 14, 14, 32] in shapes, shapes


@pytest.mark.parametrize("spec, scale", [
    ("llvm -mcpu=x86-64-v4", 1), ("llvm -mcpu=x86-64-v3", 2), ("llvm -mcpu=x86-64-v2", 4),
    ("llvm -mtriple=riscv64-linux-gnu", 1),
])
def test_register_blocks_shrink_with_the_level_over_shared_layouts(spec, scale):
    from kiln.schedules.nn_cpu import wide_block_scale

    with Target(spec):
        assert wide_block_scale(32) == scale  # the AVX-512 level's 32-float channel block
        assert wide_block_scale(Target.current().vector_lanes() * 2) == 1  # its own layouts
    assert wide_block_scale(32) == 1  # no current target


def test_vm_executor_over_a_portable_library(tmp_path):
    """Symbolic rows (the VM executor, kernels with tail blocks) on the dispatched kernels."""
    model, _ = dense_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target="llvm -mcpu=portable", params=params)
    exe.export_library(str(tmp_path / "vm.so"))
    vm = kiln.vm.VirtualMachine(kiln.runtime.load_module(str(tmp_path / "vm.so")), kiln.cpu())
    rng = np.random.default_rng(2)
    for n in (1, 7):
        x = rng.standard_normal((n, 96)).astype("float32")
        out = vm["main"](x)
        got = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
        assert_close_to_reference([got], run_onnxruntime(model, {"x": x}))


def test_inspect_names_the_levels(portable):
    from kiln.cli.inspect import inspect_library

    _, _, so, _, _ = portable
    lines: list[str] = []
    inspect_library(str(so), echo=lines.append)
    level = max(host_level(), "x86-64-v2")
    assert (f"cpu dispatch: kernels for x86-64-v2, x86-64-v3, x86-64-v4; this CPU runs {level}"
            in lines)
