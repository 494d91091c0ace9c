"""Kernels over symbolic extents (no toolchain): lowering on the loop-IR interpreter,
MakePackedAPI's binding of shape symbols, and the VM bytecode compiler's shape heap and arena."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import arith
from kiln.arith import SymVar
from kiln.backend.te_compiler import lower_primitive
from kiln.backend.vm_arena import plan_arena
from kiln.backend.vm_codegen import compile_vm
from kiln.backend.vm_shape_heap import ShapeHeap
from kiln.driver.build_module import optimize
from kiln.errors import CompileError
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.tir import loop as L
from kiln.tir.interpreter import run
from kiln.tir.text import astext
from kiln.tir.transform.make_packed_api import make_packed_api

N = SymVar("n")
S = SymVar("s", 1, 64)


def _fused_calls(func: Function) -> list[PrimitiveCall]:
    fused = optimize(func, {})
    return [c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]


def _model() -> Function:
    x = Var("x", TensorType((N, S, 8), "float32"))
    w = Constant(np.linspace(-1, 1, 8).astype("float32"))
    y = Call("nn.softmax", [Call("add", [x, w])], {"axis": 2})
    z = Call("reshape", [y], {"newshape": (N * S, 8)})
    # dense over N*S rows: packed, with register blocks of rows and a partial last block
    weight = Constant(np.random.default_rng(1).standard_normal((24, 8)).astype("float32"))
    return Function([x], [Call("nn.relu", [Call("nn.dense", [z, weight])])])


@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (3, 17)])
def test_symbolic_kernels_match_the_graph_evaluator(shape):
    func = _model()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((*shape, 8)).astype("float32")
    values = {"x": x}
    for call in _fused_calls(func):
        prim = lower_primitive(call, call.name)  # packed: run the body before MakePackedAPI
        assert prim.attrs["packed"]
    # The interpreter runs the unpacked kernels: lower again without MakePackedAPI.
    want = evaluate(func, values)[0]
    got = _interpret(func, values)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _interpret(func: Function, values: dict) -> np.ndarray:
    from kiln.backend.te_compiler import to_te
    from kiln.schedules import schedule_loops, schedule_te
    from kiln.tir.lower import Schedule, lower
    from kiln.tir.transform.simplify import simplify

    env = {p.uid: values[p.name] for p in func.params}
    fused = optimize(func, {})
    for node in post_order(fused.outputs):
        if not isinstance(node, PrimitiveCall):
            continue
        inputs, output = to_te(node.body)
        prim = schedule_loops(simplify(lower(schedule_te(Schedule(output)), inputs, "k")))
        args = [a.data if isinstance(a, Constant) else env[a.uid] for a in node.args]
        shape = tuple(arith.evaluate(d, _bindings(func, values)) for d in node.checked_type.shape)
        out = np.zeros(shape, node.checked_type.dtype)
        run(prim, *args, out, symbols=_bindings(func, values))
        env[node.uid] = out
    return env[fused.outputs[0].uid]


def _bindings(func: Function, values: dict) -> dict[str, int]:
    env = {}
    for p in func.params:
        for d, n in zip(p.checked_type.shape, values[p.name].shape):
            if isinstance(d, SymVar):
                env[d.name] = int(n)
    return env


def test_symbolic_rows_of_a_dense_split_with_a_tail():
    (call,) = [c for c in _fused_calls(_model()) if "dense" in c.name]
    text = astext(lower_primitive(call, "k"))
    assert "min(" in text and "if (" in text  # clamped reads, guarded stores


def test_make_packed_api_binds_symbols_then_checks_derived_dims():
    n = L.Var("n")
    x = L.Buffer("x", (n * 8,), "float32")  # a derived dim first: n is bound by the later y
    y = L.Buffer("y", (n, 8), "float32")
    i = L.Var("i")
    body = L.For(i, L.IntImm(0), n * 8, "serial", L.BufferStore(x, L.FloatImm(0.0), [i]))
    text = astext(make_packed_api(L.PrimFunc("k", [x, y], body)))
    let_at = text.index("let n = kiln.arg_shape(1, 0)")
    check_at = text.index("kiln.arg_shape(0, 0) == (n * 8)")
    assert let_at < check_at
    assert "(n from argument 1 (y) shape[0])" in text


def test_symbols_only_inside_expressions_become_scalar_arguments():
    n = L.Var("n")
    x = L.Buffer("x", (n * 2,), "float32")
    i = L.Var("i")
    body = L.For(i, L.IntImm(0), n * 2, "serial", L.BufferStore(x, L.FloatImm(1.0), [i]))
    packed = make_packed_api(L.PrimFunc("k", [x], body))
    assert packed.attrs["symbol_args"] == ["n"]
    assert "let n = kiln.arg_int(1)" in astext(packed)


def test_shape_heap_shares_subexpressions():
    heap = ShapeHeap([N, S])
    a = heap.slot(N * S * 4 + 64)
    b = heap.slot(N * S * 4 + 64)
    c = heap.slot(N * S * 4)
    assert a == b and c != a and heap.size == 2 + len(heap.program) // 6
    assert heap.operand(7) == (1, 7)


def test_arena_reuses_slots_of_dead_tensors():
    # t0 dies at t1, t1 dies at t2: t2 reuses t0's slot; sizes are symbolic
    sizes = [N * 16, N * 16, N * 8]
    offsets, total = plan_arena(sizes, [[], [0], [1]])
    assert offsets[2] == offsets[0] and offsets[1] != offsets[0]
    assert arith.evaluate(total, {"n": 4}) == 2 * 64  # two 64-byte aligned slots of 64 bytes


def test_vm_program_of_a_symbolic_model():
    func = _model()
    fused = optimize(func, {})
    calls = [c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]
    prog = compile_vm(fused, {c.uid: c.name for c in calls}, {})
    names = [f.name for f in prog.functions]
    assert "vm.builtin.match_shape" in names and "main" in names
    assert [s.name for s in prog.symbols] == ["n", "s"]


def test_graph_executor_refuses_symbolic_models():
    from kiln.driver.build_module import choose_executor

    with pytest.raises(CompileError, match=r"x\[n, s, 8\]"):
        choose_executor(_model(), "graph")
    assert choose_executor(_model(), None) == "vm"


def test_simplify_folds_symbolic_reshape_indices():
    """(b*S + s) // S -> b and % S -> s for loop variables of extent S; a flat index read in
    rows of 384 = 12 * 32 splits back into its parts."""
    from kiln.tir.transform.simplify import simplify

    seq = L.Var("S")
    x = L.Buffer("x", (seq * 4, 384), "float32")
    y = L.Buffer("y", (4, 12, seq, 32), "float32")
    b, h, s, d = (L.Var(n) for n in "bhsd")
    flat = ((b * seq + s) * 12 + h) * 32 + d
    load = x[flat // (seq * 384) * seq + (flat // 384) % seq, flat % 384]
    body = L.BufferStore(y, load, [b, h, s, d])
    for var, extent in reversed([(b, L.IntImm(4)), (h, L.IntImm(12)), (s, seq),
                                 (d, L.IntImm(32))]):
        body = L.For(var, L.IntImm(0), extent, "serial", body)
    text = astext(simplify(L.PrimFunc("k", [x, y], body)))
    assert "x[((b * S) + s), ((h * 32) + d)]" in text, text


def _matmuls() -> Function:
    """Attention's two batched matmuls over a symbolic sequence ``s``: scores [2, s, s] of
    q [2, s, 8] · kᵀ [2, 8, s], then scores · v [2, s, 8]."""
    q = Var("q", TensorType((2, S, 8), "float32"))
    kt = Var("kt", TensorType((2, 8, S), "float32"))
    v = Var("v", TensorType((2, S, 8), "float32"))
    scores = Call("nn.matmul", [q, kt])
    return Function([q, kt, v], [Call("nn.matmul", [Call("nn.relu", [scores]), v])])


def _interpret_versions(func: Function, values: dict, **options) -> np.ndarray:
    """As :func:`_interpret`, with each kernel's version for extents below its blocks
    (``te_compiler``), as compiled kernels have it; ``options`` go to ``optimize``
    (``quantize_weights=``)."""
    from kiln.backend.te_compiler import _small_extent_version, to_te
    from kiln.schedules import schedule_loops, schedule_te
    from kiln.tir.lower import Schedule, lower
    from kiln.tir.transform.simplify import simplify

    env = {p.uid: values[p.name] for p in func.params}
    symbols = _bindings(func, values)
    fused = optimize(func, {}, **options)
    for node in post_order(fused.outputs):
        if not isinstance(node, PrimitiveCall):
            continue
        inputs, output = to_te(node.body)
        sch = schedule_te(Schedule(output))
        prim = _small_extent_version(node, lower(sch, inputs, "k"), sch)
        prim = schedule_loops(simplify(prim))
        args = [a.data if isinstance(a, Constant) else env[a.uid] for a in node.args]
        shape = tuple(arith.evaluate(d, symbols) for d in node.checked_type.shape)
        out = np.zeros(shape, node.checked_type.dtype)
        run(prim, *args, out, symbols=symbols)
        env[node.uid] = out
    return env[fused.outputs[0].uid]


@pytest.mark.parametrize("s", [3, 16, 21])
def test_matmul_blocks_over_symbolic_rows_and_columns(s):
    """Register blocks of rows (a tail block) and of columns (the last block moved back to
    end at the row's end, ``split(tail="shift")``), and the version for s below a block."""
    func = _matmuls()
    rng = np.random.default_rng(s)
    values = {"q": rng.standard_normal((2, s, 8)).astype("float32"),
              "kt": rng.standard_normal((2, 8, s)).astype("float32"),
              "v": rng.standard_normal((2, s, 8)).astype("float32")}
    np.testing.assert_allclose(_interpret_versions(func, values), evaluate(func, values)[0],
                               rtol=1e-5, atol=1e-5)
    (scores,) = [c for c in _fused_calls(func) if c.name.endswith("matmul_nn_relu") or
                 c.name == "fused_nn_matmul_nn_relu"]
    text = astext(lower_primitive(scores, "k"))
    assert "(s - 16)" in text and "if ((s < 2) or (s < 16))" in text


def _channel_shuffle() -> Function:
    """ShuffleNet's channel shuffle over symbolic batch and plane: [n, 48, h, w] → reshape
    [n, 2, 24, h, w] → transpose (0, 2, 1, 3, 4) → reshape [n, 48, h, w]."""
    h, w = SymVar("h"), SymVar("w")
    x = Var("x", TensorType((N, 48, h, w), "float32"))
    split = Call("reshape", [Call("nn.relu", [x])], {"newshape": (N, 2, 24, h, w)})
    swapped = Call("transpose", [split], {"axes": (0, 2, 1, 3, 4)})
    return Function([x], [Call("reshape", [swapped], {"newshape": (N, 48, h, w)})])


def test_a_reshape_over_symbolic_planes_divides_only_its_own_axes():
    """A reshape cuts its axes where both shapes' products align (kiln.topi.transform
    .aligned_groups): the channel shuffle's index divides by 24 and 2 only, never by the
    symbolic h or w in its load (a division per element made the shuffle 14 ns an element; the
    parallel loop's split of its fused rows is per row); the values equal numpy's."""
    from kiln.topi.transform import aligned_groups

    h, w = SymVar("h"), SymVar("w")
    assert aligned_groups((N, 2, 24, h, w), (N, 48, h, w)) == [
        ((0, 1), (0, 1)), ((1, 3), (1, 2)), ((3, 4), (2, 3)), ((4, 5), (3, 4))]
    assert aligned_groups((N, h * w), (N, h, w)) == [((0, 1), (0, 1)), ((1, 2), (1, 3))]
    assert aligned_groups((w, h), (h, w)) == [((0, 2), (0, 2))]  # not aligned: one group
    assert aligned_groups((1, N, 48), (N, 48)) == [((0, 2), (0, 1)), ((2, 3), (1, 2))]
    func = _channel_shuffle()
    for call in _fused_calls(func):
        text = astext(lower_primitive(call, call.name))
        loads = [line for line in text.splitlines() if " = " in line and "p0[" in line]
        assert loads and all("24" in load for load in loads), text
        assert not any(f"{op} {d}" in load or f"{op} ({d}" in load for load in loads
                       for op in ("//", "%") for d in "hw"), loads
    x = np.random.default_rng(2).standard_normal((2, 48, 3, 5)).astype("float32")
    want = np.maximum(x, 0).reshape(2, 2, 24, 3, 5).transpose(0, 2, 1, 3, 4).reshape(2, 48, 3, 5)
    np.testing.assert_array_equal(_interpret(func, {"x": x}), want)
