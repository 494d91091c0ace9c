"""Grouped-query attention's two einsums over a sequence-major key/value cache (the decoder of
kiln.models.llama_onnx), compiled with symbolic sequence and cache lengths: register-blocked as
matrix products (schedule_einsum), checked against numpy at decode and prefill shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import compile_and_run, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import compile_vm

from kiln.backend.te_compiler import lower_unpacked
from kiln.driver.build_module import optimize
from kiln.frontend import from_onnx
from kiln.relay.graph import PrimitiveCall, post_order
from kiln.schedules import primitives as P
from kiln.target import Target
from kiln.tir import loop as L

SCORES = ("bsgrd,tbgd->bgrst", ["b", "s", 3, 3, 16], ["t", "b", 3, 16], ["b", 3, 3, "s", "t"])
CONTEXT = ("bgrst,tbgd->bsgrd", ["b", 3, 3, "s", "t"], ["t", "b", 3, 16], ["b", "s", 3, 3, 16])


def _model(equation, a, b, out):
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], "einsum",
        [helper.make_tensor_value_info("a", f, a), helper.make_tensor_value_info("b", f, b)],
        [helper.make_tensor_value_info("y", f, out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("spec", [SCORES, CONTEXT], ids=["scores", "context"])
def test_attention_einsums_at_decode_and_prefill_shapes(spec, target, tmp_path):
    equation, a, b, out = spec
    vm = compile_vm(_model(equation, a, b, out), tmp_path / "einsum.so", target)
    rng = np.random.default_rng(0)
    for batch, s, t in [(1, 1, 1), (1, 1, 37), (2, 1, 100), (1, 7, 7), (1, 30, 45), (2, 13, 64)]:
        dims = {"b": batch, "s": s, "t": t}
        x, y = (rng.standard_normal([dims.get(d, d) for d in shape]).astype(np.float32)
                for shape in (a, b))
        got = vm["main"](x, y).numpy()
        np.testing.assert_allclose(got, np.einsum(equation, x, y), rtol=1e-4, atol=1e-4)


def _kernel(spec, target: str = "llvm -mcpu=skylake-avx512") -> L.PrimFunc:
    """The one fused kernel of ``spec``'s einsum, lowered (before MakePackedAPI)."""
    mod, params = from_onnx(_model(*spec))
    with Target(target):
        fused = optimize(mod["main"], params)
        (call,) = [c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]
        return lower_unpacked(call, "k")


def _vector_loads(stmt: L.Stmt) -> list[tuple[L.For, L.BufferLoad]]:
    """(vectorized loop, load) for each buffer load inside a vectorized loop under ``stmt``."""
    return [(loop, e) for loop in L.walk_stmts(stmt)
            if isinstance(loop, L.For) and loop.kind == "vectorized"
            for s in L.walk_stmts(loop.body) for e in L.walk_exprs(L.stmt_exprs(s))
            if isinstance(e, L.BufferLoad)]


def _allocations(stmt: L.Stmt, prefix: str) -> list[L.Buffer]:
    return [s.buffer for s in L.walk_stmts(stmt)
            if isinstance(s, L.Allocate) and s.buffer.name.startswith(prefix)]


def test_prefill_scores_read_keys_packed_with_the_cache_length_last():
    """The scores' main version (s >= 2 query rows, t >= 32 cached keys) copies the keys
    ``tbgd`` once into ``einsum_pack`` with ``t`` last, and its register block loads each
    vector of columns from that copy along its vector lane: contiguous, where reading ``tbgd``
    along ``t`` gathers lanes g·d = 48 floats apart (docs/decisions/057). The version for one
    decoded token (version 1) keeps its blocked gather and copies nothing (a copy would cost as
    much as the product); version 2 (t < 16) has no blocks."""
    func = _kernel(SCORES)
    version = P.peel_lets(func.body)[1]
    assert isinstance(version, L.IfThenElse)
    keys = func.params[1]
    (pack,) = _allocations(version.else_case, "einsum_pack")
    main_loads = _vector_loads(version.else_case)
    packed = [(loop, e) for loop, e in main_loads if e.buffer is pack]
    assert packed and not any(e.buffer is keys for _, e in main_loads)
    for loop, e in packed:  # the lane varies the last index only
        assert L.uses_var(e.indices[-1], loop.var)
        assert not any(L.uses_var(i, loop.var) for i in e.indices[:-1])
    one_row = version.then_case
    assert isinstance(one_row, L.IfThenElse) and not _allocations(one_row, "einsum_pack")
    assert any(e.buffer is keys for _, e in _vector_loads(one_row.else_case))
    assert not [s for s in L.walk_stmts(one_row.then_case)
                if isinstance(s, L.For) and s.kind == "vectorized"]


STATIC = ("bik,bjk->bij", [2, 24, 40], [2, 72, 40], [2, 24, 72])


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_static_einsum_with_strided_columns_is_packed(target, tmp_path):
    """A static matmul-like einsum whose B holds its columns strided (``bjk``) and whose A has
    at least MIN_PACKED_ROWS rows packs B too, and matches onnxruntime."""
    assert _allocations(_kernel(STATIC).body, "einsum_pack")
    model = _model(*STATIC)
    rng = np.random.default_rng(1)
    inputs = {"a": rng.standard_normal(STATIC[1]).astype(np.float32),
              "b": rng.standard_normal(STATIC[2]).astype(np.float32)}
    (got,) = compile_and_run(model, inputs, tmp_path, target)
    np.testing.assert_allclose(got, run_onnxruntime(model, inputs)[0], rtol=1e-4, atol=1e-4)


def _scaled_masked_scores() -> onnx.ModelProto:
    """The decoder's scores, scaled and masked: Einsum -> Mul by 1/sqrt(d) -> Add the mask."""
    f = TensorProto.FLOAT
    equation, a, b, out = SCORES
    scale = numpy_helper.from_array(np.array(0.25, np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b"], ["scores"], equation=equation),
         helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
         helper.make_node("Add", ["scaled", "mask"], ["y"])], "scores",
        [helper.make_tensor_value_info("a", f, a), helper.make_tensor_value_info("b", f, b),
         helper.make_tensor_value_info("mask", f, ["b", 1, 1, "s", "t"])],
        [helper.make_tensor_value_info("y", f, out)], [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_scale_and_mask_are_the_scores_kernels_epilogue(target, tmp_path):
    """The scale and the mask are applied as the scores' register block is stored (einsum is
    OUT_ELEMWISE_FUSABLE, like nn.dense): one kernel, no pass over the [b, g, r, s, t] scores
    in between; equal to onnxruntime at decode and prefill shapes."""
    model = _scaled_masked_scores()
    mod, params = from_onnx(model)
    fused = optimize(mod["main"], params)
    assert len([c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]) == 1
    vm = compile_vm(model, tmp_path / "scores.so", target)
    rng = np.random.default_rng(2)
    for batch, s, t in [(1, 1, 1), (1, 1, 37), (2, 13, 64), (1, 40, 40)]:
        dims = {"b": batch, "s": s, "t": t}
        x, y = (rng.standard_normal([dims.get(d, d) for d in shape]).astype(np.float32)
                for shape in (SCORES[1], SCORES[2]))
        mask = rng.standard_normal((batch, 1, 1, s, t)).astype(np.float32)
        want = run_onnxruntime(model, {"a": x, "b": y, "mask": mask})[0]
        np.testing.assert_allclose(vm["main"](x, y, mask).numpy(), want, rtol=1e-4, atol=1e-4)


def test_decoded_context_takes_a_head_dim_of_64_in_one_register_block():
    """With 32 vector registers (AVX-512) the context einsum of one decoded token blocks its
    3 grouped heads by all 64 columns of a head (12 accumulators, four vectors a row): one pass
    over the value cache per key head, where two 32-column blocks made two (SmolLM2 q4 decode
    at past 1024: 23.7-24.5 -> 19.5-20.2 ms a token). AVX2's 16 registers keep 32 columns."""
    context = ("bgrst,tbgd->bsgrd", ["b", 3, 3, "s", "t"], ["t", "b", 3, 64], ["b", "s", 3, 3, 64])

    def one_row_block(target: str) -> tuple[int, ...]:
        version = P.peel_lets(_kernel(context, target).body)[1]
        (acc,) = _allocations(version.then_case, "einsum")
        return acc.shape

    assert one_row_block("llvm -mcpu=skylake-avx512") == (3, 64)
    assert one_row_block("llvm -mcpu=haswell") == (3, 32)
