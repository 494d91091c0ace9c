"""Weight-only quantized dense kernels, compiled (docs/decisions/018): ONNX MatMul with a weight
initializer (+ Add bias) built with ``kiln.build(quantize_weights=)``, run by the graph
executor (static rows) and the VM (symbolic rows), against numpy with the dequantized weights
(tight) and onnxruntime's float model (quantization error)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from backend_helpers import run_exported, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.arith import SymVar
from kiln.backend.te_compiler import lower_unpacked
from kiln.codegen.llvm.vector import vector_width
from kiln.driver.build_module import optimize
from kiln.frontend import from_onnx
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.op.weight_quant import dequantize_q4_1, quantize_int8, quantize_q4_1
from kiln.schedules import primitives as P
from kiln.schedules.cpu import MIN_PARALLEL_EXTENT
from kiln.target import Target
from kiln.tir import loop as L
from kiln.vm import VirtualMachine

RNG = np.random.default_rng(18)
MODES = ["int8", "q4"]
#: relative error of the quantized outputs against the float model (random weights, scaled
#: by 1/sqrt(K)): int8 ~1e-2, q4 ~1e-1 of the output's range
FLOAT_RTOL = {"int8": 0.03, "q4": 0.3}


def _model(k: int, n: int, rows, bias: bool = True) -> tuple[onnx.ModelProto, np.ndarray]:
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y" if not bias else "xw"])]
    inits = [numpy_helper.from_array(w, "W")]
    if bias:
        nodes.append(helper.make_node("Add", ["xw", "b"], ["y"]))
        inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "b"))
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, w


def _dequantized(w: np.ndarray, mode: str) -> np.ndarray:
    """The ``[K, N]`` weight the quantized kernel computes with."""
    if mode == "int8":
        q, scale = quantize_int8(w.T)
        return (q.astype(np.float32) * scale[:, None]).T
    return dequantize_q4_1(*quantize_q4_1(w.T)).T


def _check(got: np.ndarray, model: onnx.ModelProto, w: np.ndarray, x: np.ndarray,
           mode: str) -> None:
    b = [numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "b"]
    want = x.astype(np.float64) @ _dequantized(w, mode) + (b[0] if b else 0)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale + 1e-6
    (ort,) = run_onnxruntime(model, {"x": x})
    assert np.abs(got - ort).max() <= FLOAT_RTOL[mode] * scale


def _run_graph(model: onnx.ModelProto, x: np.ndarray, target: str, mode: str | None,
               path) -> np.ndarray:
    """Build with the graph executor, export, load, run once."""
    mod, params = from_onnx(model)
    lib = kiln.build(mod, target=target, params=params, quantize_weights=mode)
    return run_exported(lib, path, {"x": x})[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("k, n", [(576, 1536), (1536, 576)])
def test_static_rows(mode, rows, k, n, target, tmp_path):
    model, w = _model(k, n, rows)
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    _check(_run_graph(model, x, target, mode, tmp_path / "m.so"), model, w, x, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k, n", [(576, 192), (1536, 576)])
def test_symbolic_rows_on_the_vm(mode, k, n, target, tmp_path):
    model, w = _model(k, n, "M")
    mod, params = from_onnx(model)
    exe = kiln.build(mod, target=target, params=params, quantize_weights=mode)
    exe.export_library(str(tmp_path / "m.so"))
    vm = VirtualMachine(kiln.runtime.load_module(str(tmp_path / "m.so")), kiln.cpu())
    for rows in (1, 3, 7, 16, 33, 64):  # 1: the one-row version; more: the panel form
        x = RNG.standard_normal((rows, k)).astype(np.float32)
        got = vm["main"](x).numpy()
        _check(got, model, w, x, mode)


@pytest.mark.parametrize("mode", MODES)
def test_artifact_stores_quantized_weights(mode, tmp_path):
    model, _ = _model(576, 1536, 1, bias=False)
    mod, params = from_onnx(model)
    sizes = {}
    for m in (None, mode):
        lib = kiln.build(mod, target="llvm", params=params, quantize_weights=m)
        lib.export_library(str(tmp_path / f"{m}.so"))
        sizes[m] = (tmp_path / f"{m}.so").stat().st_size
    floats = 576 * 1536 * 4
    # int8: 1/4 of the float weight (+ scales); q4: 1/8 + float16 d and m per 32 (1/32 + 1/8
    # saved 27/32 = 0.84; float32 d and m saved 13/16 = 0.81)
    assert sizes[mode] - sizes[None] < -floats * (0.7 if mode == "int8" else 0.835)


def _dense(k: int, n: int) -> Function:
    x = Var("x", TensorType((SymVar("M"), k), "float32"))
    w = Constant(RNG.standard_normal((n, k)).astype(np.float32), "w")
    return Function([x], [Call("nn.dense", [x, w])])


def test_q4_scales_are_widened_by_f16c():
    """float16 d and m become float32 by ``vcvtph2ps`` inside the kernel (x86 F16C), not by a
    library call per value."""
    target = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"
    exe = kiln.build(_dense(576, 192), target=target, executor="vm", quantize_weights="q4")
    asm = "".join(m.get_source("asm") for m in exe.imported_modules if m.type_key == "llvm")
    assert re.search(r"\bvcvtph2ps\b", asm)
    assert not re.search(r"extendhfsf2|gnu_h2f_ieee", asm)


def _parallel_loops(stmt: L.Stmt) -> list[L.For]:
    found = []

    def visit(s) -> None:
        if isinstance(s, L.For) and s.kind == "parallel":
            found.append(s)
        for child in (getattr(s, "body", None), getattr(s, "then_case", None),
                      getattr(s, "else_case", None), *getattr(s, "stmts", ())):
            if isinstance(child, L.Stmt):
                visit(child)
    visit(stmt)
    return found


@pytest.mark.parametrize("mode", MODES)
def test_one_row_gemv_splits_threads_over_output_channels(mode):
    """The decode step's GEMV (the kernel's version for M < 2) gives the threads groups of
    output channels (the weight's rows), at least MIN_PARALLEL_EXTENT of them at M = 1 for a
    576 x 1536 layer: one decoded token has no other axis to split."""
    with Target("llvm -mcpu=haswell"):  # AVX2: blocks of 16 channels
        fused = optimize(_dense(576, 1536), {}, quantize_weights=mode)
        (call,) = [c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]
        func = lower_unpacked(call, "k")
    (version,) = [s for s in [P.peel_lets(func.body)[1]] if isinstance(s, L.IfThenElse)]
    loops = _parallel_loops(version.then_case)  # M < 2
    (gemv,) = [lp for lp in loops if "dense_q" in lp.var.name
               and "xsum" not in lp.var.name and "_x_" not in lp.var.name]
    # the extent is M x (column groups): rows fused outside, one group a thread's task
    extent = gemv.extent
    assert isinstance(extent, L.Binary) and extent.op == "*"
    (groups,) = [e.value for e in (extent.a, extent.b) if isinstance(e, L.IntImm)]
    assert groups >= MIN_PARALLEL_EXTENT and 1536 % groups == 0
    assert "ax1" in gemv.var.name  # the output-channel axis (j)


def _lowered(mode: str, k: int = 576, n: int = 1536) -> L.PrimFunc:
    with Target("llvm -mcpu=haswell"):  # AVX2: blocks of 16 channels
        fused = optimize(_dense(k, n), {}, quantize_weights=mode)
        (call,) = [c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]
        return lower_unpacked(call, "k")


def _loads(stmt: L.Stmt, buf: L.Buffer) -> int:
    """How many loads of ``buf`` the statements under ``stmt`` hold."""
    return sum(isinstance(x, L.BufferLoad) and x.buffer is buf
               for s in L.walk_stmts(stmt) for x in L.walk_exprs(L.stmt_exprs(s)))


@pytest.mark.parametrize("mode", MODES)
def test_several_rows_dequantize_a_panel_once_per_column_block(mode):
    """The kernel's version for M >= 2 (prefill) widens the quantized weight into a local
    float panel of one block of 16 channels over all K under the parallel loop over channel
    blocks, outside the loop over row blocks, and its register blocks read only the panel:
    each weight is dequantized once a call, not once per block of 6 rows
    (docs/decisions/053). The one-row version (decode) still reads the quantized weight in
    its reduction."""
    func = _lowered(mode)
    version = P.peel_lets(func.body)[1]
    assert isinstance(version, L.IfThenElse)
    qweight = func.params[1]
    (column_blocks,) = _parallel_loops(version.else_case)  # M >= 2
    assert column_blocks.var.name.endswith("ax1_o") and column_blocks.extent.value == 1536 // 16
    panel = column_blocks.body
    assert isinstance(panel, L.Allocate) and panel.buffer.scope == "local"
    assert panel.buffer.shape in ((576, 16), (576 // 8, 8, 16))  # int8; q4's nibble words
    produce, rows = panel.body.stmts
    assert isinstance(rows, L.For) and "ax0_o" in rows.var.name  # the blocks of rows
    assert _loads(produce, qweight) > 0 and _loads(rows, qweight) == 0
    assert _loads(rows, panel.buffer) > 0
    assert _loads(version.then_case, qweight) > 0  # M < 2: dequantized inside the reduction


@pytest.mark.parametrize("mode", MODES)
def test_panel_is_widened_by_explicit_vectors(mode):
    """The panel's loop over 16 channels becomes explicit 8-lane AVX2 vectors (its float16
    scales and int8 / nibble weights loaded 8 at a time and widened), not a scalar loop left to
    LLVM's vectorizer (which vectorized it across k, four lanes of scalar stores). The one-row
    accumulations keep LLVM's vectorizer, as before (kiln.codegen.llvm.vector._widens)."""
    func = _lowered(mode)
    version = P.peel_lets(func.body)[1]
    (column_blocks,) = _parallel_loops(version.else_case)
    produce = column_blocks.body.body.stmts[0]
    (lanes,) = [s for s in L.walk_stmts(produce) if isinstance(s, L.For) and s.kind == "vectorized"]
    assert vector_width(lanes, 256) == 8
    (gemv,) = [lp for lp in _parallel_loops(version.then_case) if "dense_q" in lp.var.name
               and "xsum" not in lp.var.name and "_x_" not in lp.var.name]
    qweight = func.params[1]
    accumulations = [s for s in L.walk_stmts(gemv) if isinstance(s, L.For)
                     and s.kind == "vectorized" and _loads(s, qweight)]
    assert accumulations and all(vector_width(s, 256) == 0 for s in accumulations)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_lm_head(mode, tmp_path):
    """SmolLM2-135M's output projection: 576 x 49152 (int8 in both modes: q4 keeps a
    vocabulary projection at 8 bits, QuantizeWeights.Q4_HEAD_CHANNELS)."""
    model, w = _model(576, 49152, 1, bias=False)
    x = RNG.standard_normal((1, 576)).astype(np.float32)
    _check(_run_graph(model, x, "llvm", mode, tmp_path / "m.so"), model, w, x, "int8")
