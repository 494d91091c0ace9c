"""Cross compilation with the llvm target: one kernel library per foreign ISA (aarch64 NEON,
riscv64 with the V extension), linked by the cross GCC through
``export_library(fcompile=cross_compiler(...))``, driven by a small C harness
(``cross_harness.c``) under qemu-user, outputs checked against the loop-IR interpreter.

Needs the Debian cross toolchains and qemu-user (``make toolchain`` installs them as root);
each ISA skips with the missing tool named when they are absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import HELPERS
from test_codegen import _kernel, k_parallel_alloc
from test_llvm import binary_kernel

import kiln.runtime as rt
from kiln.backend.te_compiler import lower_primitive, to_te
from kiln.codegen.llvm.build import build_llvm
from kiln.relay.graph import Call, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.relay.op.integer import pack_quads, pack_tap_pairs
from kiln.relay.op_registry import get_op
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.runtime.toolchain import compiler as toolchain
from kiln.schedules import schedule_loops, schedule_te
from kiln.target import Target
from kiln.tir import interpreter as loop_interp
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.make_packed_api import dl_dtype, make_packed_api
from kiln.tir.transform.simplify import simplify

HARNESS = HELPERS / "cross_harness.c"
CROSS = {
    "aarch64": {"target": "llvm -mtriple=aarch64-linux-gnu", "cc": "aarch64-linux-gnu-gcc",
                "qemu": ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]},
    "riscv64": {"target": "llvm -mtriple=riscv64-linux-gnu -mattr=+v",
                "cc": "riscv64-linux-gnu-gcc",
                "qemu": ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu",
                         "rv64,v=true,vlen=128"]},
}


def _missing(isa: str) -> str | None:
    cfg = CROSS[isa]
    for tool in (cfg["cc"], cfg["qemu"][0]):
        if shutil.which(tool) is None:
            return tool
    return None if os.path.isdir(cfg["qemu"][2]) else cfg["qemu"][2]


def _cases():
    """(packed func, inputs, oracle outputs) for a few kernels: conv with workspace, parallel
    dense + sigmoid (exp), a vectorized add, a parallel kernel with scratch buffers and an
    int8 convolution on quads (``dot_u8i8x4``: plain integer vectors off x86)."""
    cases = []
    for name in ("conv_bias_relu", "dense_sigmoid"):
        call, arrays = _kernel(name)
        ins, out = to_te(call.body)
        oracle = schedule_loops(simplify(lower(schedule_te(Schedule(out)), ins, name)))
        want = np.zeros(call.checked_type.shape, call.checked_type.dtype)
        loop_interp.run(oracle, *arrays, want)
        cases.append((lower_primitive(call, name), arrays, [want]))
    rng = np.random.default_rng(11)
    vadd = binary_kernel("vadd", [1000], lambda x, y: x * 2.0 + y)
    a, b = (rng.standard_normal(1000).astype("float32") for _ in range(2))
    cases.append((vadd, [a, b], [a * 2 + b]))
    func, inputs, out, _ = k_parallel_alloc()
    want = out.copy()
    loop_interp.run(func, *inputs, want)
    cases.append((make_packed_api(func), inputs, [want]))
    cases.append(_qnn_conv_case())
    cases.append(_qnn_depthwise_case())
    # a grouped conv (8 channels a group, two groups a 16-channel data block) and a region of
    # a clipped dilated conv (unpadded, 2×1 taps at dilation 3): issue 32's kernels
    cases.append(_float_conv_case("grouped_conv", (1, 2, 6, 5, 16), (4, 1, 3, 3, 8, 8),
                                  {"strides": (1, 1), "padding": (1, 1, 1, 1),
                                   "dilation": (1, 1), "groups": 4}))
    cases.append(_float_conv_case("dilated_region_conv", (1, 1, 9, 7, 8), (1, 1, 2, 1, 8, 8),
                                  {"strides": (1, 1), "padding": (0, 0, 0, 0),
                                   "dilation": (3, 3)}))
    cases += _depth_gather_cases()
    # Winograd F(2x2, 3x3) and F(4x4, 3x3) on an odd plane (partial tiles), transformed
    # weights [O/ob, α², C/ib, ib, ob] (docs/decisions/050)
    for tile in (2, 4):
        cases.append(_float_conv_case(f"winograd_f{tile}_conv", (1, 2, 7, 5, 8),
                                      (2, (tile + 2) ** 2, 2, 8, 8),
                                      {"padding": (1, 1, 1, 1), "tile_size": tile},
                                      "nn.conv2d_winograd_NCHWc"))
    return cases


def _depth_gather_cases():
    """The input kernels of a 3-D conv (docs/decisions/048): ``x[1, 8, 5, 5, 5]`` (depth padded
    already), its 3 depth taps at stride 2 as strided slices moved to ``[2, 8, 5, 5]``,
    concatenated into ``[2, 24, 5, 5]`` and blocked as NCHW8c; FuseOps makes one kernel of
    the concatenation with its first slice and one of each other slice. Each kernel's inputs
    and outputs from the graph interpreter."""
    x = np.random.default_rng(24).standard_normal((1, 8, 5, 5, 5)).astype(np.float32)
    var = Var("x", TensorType(x.shape, "float32"))
    pieces = []
    for first in (0, 1, 2):
        piece = Call("strided_slice", [var], {"begin": (0, 0, first, 0, 0),
                                              "end": (1, 8, first + 3, 5, 5),
                                              "strides": (1, 1, 2, 1, 1)})
        piece = Call("transpose", [piece], {"axes": (0, 2, 1, 3, 4)})
        pieces.append(Call("reshape", [piece], {"newshape": (2, 1, 8, 5, 5)}))
    y = Call("concatenate", pieces, {"axis": 2})
    y = Call("reshape", [y], {"newshape": (2, 24, 5, 5)})
    y = Call("layout_transform", [y], {"src_layout": "NCHW", "dst_layout": "NCHW8c"})
    values = {var.uid: x}
    cases = []
    for node in post_order(fuse_ops(Function([var], [y])).outputs):
        if isinstance(node, PrimitiveCall):
            args = [values[a.uid] for a in node.args]
            (out,) = evaluate(node.body, {p.name: a for p, a in zip(node.body.params, args)})
            values[node.uid] = out
            cases.append((lower_primitive(node, f"conv3d_depth_gather{len(cases)}"), args,
                          [out]))
    assert len(cases) == 3
    return cases


def _float_conv_case(name: str, data_shape, weight_shape, attrs: dict,
                     op: str = "nn.conv2d_NCHWc"):
    """A float blocked conv kernel (``op``), its output from the op's numpy reference."""
    rng = np.random.default_rng(23)
    arrays = [rng.standard_normal(data_shape).astype(np.float32),
              # weights scaled by the fan-in: outputs about 1, within the harness's atol 1e-6
              (rng.standard_normal(weight_shape) / np.sqrt(np.prod(weight_shape[1:5])))
              .astype(np.float32)]
    params = [Var(f"x{i}", TensorType(a.shape, str(a.dtype))) for i, a in enumerate(arrays)]
    fused = fuse_ops(Function(params, [Call(op, params, attrs)]))
    (call,) = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    want = get_op(op).ref(*arrays, **attrs)
    return lower_primitive(call, name), arrays, [want.astype(np.float32)]


def _qnn_depthwise_case():
    """An int8 ``qnn.depthwise_conv2d_NCHWc`` on int16 tap pairs (``dot_i16x2``: plain integer
    vectors off x86), stride 2, zero-point padding, -128/127 operands included; its exact
    int32 output from the op's numpy reference."""
    rng = np.random.default_rng(22)
    w = rng.integers(-128, 128, (3, 1, 3, 3, 1, 8)).astype(np.int8)
    w[0, 0, 0, :, 0, :] = -128
    x = rng.integers(-128, 128, (1, 3, 7, 7, 8)).astype(np.int8)
    x[0, 0, :2] = 127
    arrays = [x, pack_tap_pairs(w)]
    attrs = {"strides": (2, 2), "padding": (1, 1, 1, 1), "dilation": (1, 1),
             "input_zero_point": -128, "kernel_size": (3, 3)}
    params = [Var(f"x{i}", TensorType(a.shape, str(a.dtype))) for i, a in enumerate(arrays)]
    fused = fuse_ops(Function(params, [Call("qnn.depthwise_conv2d_NCHWc", params, attrs)]))
    (call,) = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    want = get_op("qnn.depthwise_conv2d_NCHWc").ref(*arrays, **attrs)
    return lower_primitive(call, "qnn_depthwise_int8"), arrays, [want]


def _qnn_conv_case(extreme: bool = False):
    """An int8 ``qnn.conv2d_NCHWc`` (int8 data, quad-packed int8 weights, 3x3, zero-point
    padding), its exact int32 output from the op's numpy reference (docs/decisions/021);
    ``extreme``: data and weights only -128 and 127."""
    rng = np.random.default_rng(21)

    def ints(shape):
        if extreme:
            return rng.choice(np.array([-128, 127], np.int8), shape)
        return rng.integers(-128, 128, shape).astype(np.int8)

    arrays = [ints((1, 2, 5, 5, 8)), pack_quads(ints((2, 2, 3, 3, 8, 8)), 4),
              rng.integers(-1000, 1000, (2, 8)).astype(np.int32)]
    attrs = {"strides": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1),
             "input_zero_point": -3}
    params = [Var(f"x{i}", TensorType(a.shape, str(a.dtype))) for i, a in enumerate(arrays)]
    fused = fuse_ops(Function(params, [Call("qnn.conv2d_NCHWc", params, attrs)]))
    (call,) = [n for n in post_order(fused.outputs) if isinstance(n, PrimitiveCall)]
    want = get_op("qnn.conv2d_NCHWc").ref(*arrays, **attrs)
    name = "qnn_conv_int8_extreme" if extreme else "qnn_conv_int8"
    return lower_primitive(call, name), arrays, [want]


def _spec_line(kind: str, path: Path, arr: np.ndarray) -> str:
    code, bits = dl_dtype(str(arr.dtype))
    return " ".join([kind, str(path), str(code), str(bits), str(arr.ndim),
                     *map(str, arr.shape)])


@pytest.mark.parametrize("isa", list(CROSS))
def test_cross_compiled_kernels_run_under_qemu(isa, tmp_path):
    missing = _missing(isa)
    if missing:
        pytest.skip(f"{isa} cross test needs {missing} (make toolchain installs it)")
    cfg = CROSS[isa]
    cases = _cases()
    lib = build_llvm([c[0] for c in cases], cfg["target"])
    assert not lib.is_host_object and Target(cfg["target"]).arch == isa
    asm = lib.get_source("asm")
    if isa == "riscv64":
        assert "vsetvli" in asm and re.search(r"\bvle32\.v\b", asm), "no RVV code"
    else:
        assert re.search(r"\bv\d+\.4s\b", asm), "no NEON code"
    _run_under_qemu(lib, cases, cfg, isa, tmp_path)


def _run_under_qemu(lib, cases, cfg: dict, isa: str, tmp_path: Path) -> None:
    """Export ``lib`` with the cross compiler, run each case's function under qemu-user through
    the C harness, compare with its wanted outputs (integers exactly)."""
    so = tmp_path / f"kernels_{isa}.so"
    lib.export_library(str(so), fcompile=rt.cross_compiler(cfg["cc"]))
    harness = tmp_path / "harness"
    toolchain.run([cfg["cc"], "-O2", f"-I{toolchain.INCLUDE_DIR}", "-o", str(harness),
                   str(HARNESS), "-ldl"])
    env = dict(os.environ, KILN_NUM_THREADS="2")
    for func, inputs, wants in cases:
        spec = []
        for k, arr in enumerate(inputs):
            path = tmp_path / f"{func.name}_in{k}.bin"
            path.write_bytes(np.ascontiguousarray(arr).tobytes())
            spec.append(_spec_line("in", path, arr))
        outs = [tmp_path / f"{func.name}_out{k}.bin" for k in range(len(wants))]
        spec += [_spec_line("out", p, w) for p, w in zip(outs, wants)]
        spec_path = tmp_path / f"{func.name}.spec"
        spec_path.write_text("\n".join(spec) + "\n")
        proc = subprocess.run([*cfg["qemu"], str(harness), str(so), func.name, str(spec_path)],
                              capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        assert proc.returncode == 0, f"{func.name} on {isa}: {proc.stderr or proc.stdout}"
        for p, want in zip(outs, wants):
            got = np.frombuffer(p.read_bytes(), want.dtype).reshape(want.shape)
            if want.dtype.kind == "i":  # integer kernels are exact
                np.testing.assert_array_equal(got, want, err_msg=f"{func.name} on {isa}")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{func.name} on {isa}")


def test_aarch64_i8mm_int8_conv_uses_usdot(tmp_path):
    """aarch64 with ``+i8mm``: the quads' products are NEON ``usdot`` (u8 × s8, accumulating;
    docs/decisions/021), run under ``qemu-aarch64 -cpu max`` (which has FEAT_I8MM), exact."""
    missing = _missing("aarch64")
    if missing:
        pytest.skip(f"aarch64 cross test needs {missing} (make toolchain installs it)")
    target = "llvm -mtriple=aarch64-linux-gnu -mattr=+i8mm"
    assert Target(target).int8_dot() == "i8mm"
    cases = [_qnn_conv_case()]
    lib = build_llvm([c[0] for c in cases], target)
    assert re.search(r"\busdot\s+v\d+\.4s", lib.get_source("asm")), "no usdot"
    cfg = dict(CROSS["aarch64"], qemu=[*CROSS["aarch64"]["qemu"], "-cpu", "max"])
    _run_under_qemu(lib, cases, cfg, "aarch64", tmp_path)


def test_cross_export_of_a_large_blob_uses_the_assembler(tmp_path):
    """Blobs of 1 MiB and more for a foreign triple go through devc.S (llvmlite has no
    assembler for foreign targets), assembled by the cross compiler."""
    if _missing("riscv64"):
        pytest.skip(f"needs {_missing('riscv64')}")
    from test_runtime_roundtrip import make_graph

    n = 2**19  # 2 MiB of float32
    lib = build_llvm([binary_kernel("fused_add", [n], lambda x, y: x + y),
                      binary_kernel("fused_mul", [n], lambda x, y: x * y)],
                     CROSS["riscv64"]["target"])
    fac = rt.GraphExecutorFactoryModule(make_graph(shape=[n]), lib,
                                        {"p0": np.ones(n, "float32")})
    work = tmp_path / "work"
    so = tmp_path / "big.so"
    fac.export_library(str(so), fcompile=rt.cross_compiler(CROSS["riscv64"]["cc"]),
                       workspace_dir=str(work))
    assert (work / "devc.S").exists() and not (work / "devc.o").exists()
    syms = toolchain.run(["riscv64-linux-gnu-nm", "-S", "--defined-only", str(so)])
    size = next(int(line.split()[1], 16) for line in syms.splitlines()
                if line.endswith(" __tvm_dev_mblob"))
    assert size > 4 * n


def _tiny_model(path: Path) -> Path:
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("Add", ["r", "x"], ["y"])], "g", [x], [y])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
         path)
    return path


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "cross-compiler"])
def test_cli_cross_exports_with_the_triples_gcc(explicit, tmp_path):
    """``kiln compile --target "llvm -mtriple=riscv64-linux-gnu ..."`` links with
    ``riscv64-linux-gnu-gcc``: named by ``--cross-compiler`` (tvmc's option), or found on PATH
    and announced; the library is a RISC-V ELF."""
    if shutil.which("riscv64-linux-gnu-gcc") is None:
        pytest.skip("needs riscv64-linux-gnu-gcc (make toolchain installs it)")
    from kiln.cli.main import main

    so = tmp_path / "m.so"
    extra = ["--cross-compiler", "riscv64-linux-gnu-gcc", "--cross-compiler-options=-O2"] \
        if explicit else []
    lines: list[str] = []
    from kiln.cli import compile as cli_compile

    cli_compile.compile_model(str(_tiny_model(tmp_path / "m.onnx")), str(so),
                              target="llvm -mtriple=riscv64-linux-gnu -mattr=+v",
                              echo=lines.append,
                              **({"cross_compiler": "riscv64-linux-gnu-gcc",
                                  "cross_compiler_options": "-O2"} if explicit else {}))
    assert so.read_bytes()[18:20] == (243).to_bytes(2, "little")  # e_machine EM_RISCV
    assert any("riscv64-linux-gnu-gcc" in line for line in lines) != explicit
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.so"), "-q",
                 "--target", "llvm -mtriple=riscv64-linux-gnu", *extra]) == 0


@pytest.mark.parametrize("target,cpu", [
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+dotprod", "cortex-a76"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", "neoverse-n1"),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+dotprod", "max"),
])
def test_aarch64_dotprod_int8_conv_uses_sdot(target, cpu, tmp_path):
    """aarch64 with ``+dotprod`` and no i8mm: u8 × s8 quads as ``sdot`` of the bytes offset by
    -128 minus ``sdot`` of the offset (Arm ARM SDOT (vector)); no ``usdot``. Run under qemu on
    a CPU without FEAT_I8MM (Cortex-A76, Neoverse N1: an i8mm instruction would trap) and on
    ``-cpu max``; exact, extreme operands included."""
    missing = _missing("aarch64")
    if missing:
        pytest.skip(f"aarch64 cross test needs {missing} (make toolchain installs it)")
    assert Target(target).int8_dot() == "dotprod"
    cases = [_qnn_conv_case(), _qnn_conv_case(extreme=True)]
    lib = build_llvm([c[0] for c in cases], target)
    asm = lib.get_source("asm")
    assert re.search(r"\bsdot\s+v\d+\.4s", asm), "no sdot"
    assert not re.search(r"\busdot\b", asm)
    cfg = dict(CROSS["aarch64"], qemu=[*CROSS["aarch64"]["qemu"], "-cpu", cpu])
    _run_under_qemu(lib, cases, cfg, "aarch64", tmp_path)
