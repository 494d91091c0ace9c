"""Data-dependent output shapes (decision 016) without a toolchain: the numpy definitions
against ONNX's reference evaluator, the ``dyn.*`` type relations, the graph interpreter
binding late symbols, and the bytecode's placement of bindings, inline shape programs and
late-sized storage."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from kiln.arith import SymVar
from kiln.backend.vm_codegen import compile_vm
from kiln.backend.vm_shape_heap import ShapeHeap
from kiln.driver.build_module import choose_executor, optimize
from kiln.errors import CompileError, ShapeError
from kiln.relay.graph import Call, Constant, Function, PrimitiveCall, TensorType, Var, post_order
from kiln.relay.interpreter import evaluate
from kiln.runtime import dynamic_ops as D
from kiln.runtime.vm.bytecode import HEAP, OP_CALL, DecodeContext, decode_function

RNG = np.random.default_rng(1)


def _reference(op: str, inputs: list[np.ndarray], n_out: int = 1, **attrs):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, [f"o{k}" for k in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info(f"o{k}", 0, None) for k in range(n_out)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def _same(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_nonzero_matches_the_reference(p):
    x = (RNG.random((3, 4, 2)) < p).astype(np.int32)
    _same([D.nonzero(x)], _reference("NonZero", [x]))


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_unique_sorted_matches_the_reference(axis):
    x = RNG.integers(0, 3, (5, 2)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    _same(D.unique(x, axis, True), _reference("Unique", [x], 4, **attrs))


def test_unique_unsorted_keeps_first_occurrence_order():
    y, idx, inv, counts = D.unique(np.array([2, 1, 1, 3, 4, 3], np.float32), None, False)
    _same([y, idx, inv, counts], [np.array([2, 1, 3, 4], np.float32), np.array([0, 1, 3, 4]),
                                  np.array([0, 1, 1, 2, 3, 2]), np.array([1, 2, 2, 1])])


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_matches_the_reference_with_ties(largest):
    x = RNG.integers(0, 3, (4, 6)).astype(np.float32)
    k = np.array([3], np.int64)
    _same(D.topk(x, k, 1, bool(largest)), _reference("TopK", [x, k], 2, axis=1,
                                                      largest=largest))
    with pytest.raises(ShapeError, match=r"TopK: k = 7 is outside \[0, 6\]"):
        D.topk(x, np.array([7]), 1, True)


@pytest.mark.parametrize("center", [0, 1])
def test_nms_matches_the_reference(center):
    xy = RNG.random((1, 8, 2)).astype(np.float32) * 3
    wh = RNG.random((1, 8, 2)).astype(np.float32) + 0.5
    boxes = np.concatenate([xy, wh] if center else [xy, xy + wh], axis=2)
    scores = RNG.random((1, 3, 8)).astype(np.float32)
    extra = [np.array([4], np.int64), np.array([0.2], np.float32),
             np.array([0.3], np.float32)]
    want = _reference("NonMaxSuppression", [boxes, scores, *extra], center_point_box=center)
    _same([D.non_max_suppression(boxes, scores, *extra, center_point_box=center)], want)


def test_slice_and_reshape_follow_onnx_clamping_and_zeros():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    args = [np.array(v, np.int64) for v in ([5, -1], [-9, 0], [0, 1], [-2, -2])]
    _same([D.slice_(x, *args)], _reference("Slice", [x, *args]))
    assert D.reshape(x, np.array([0, -1, 3]), False).shape == (4, 2, 3)
    with pytest.raises(ShapeError, match="Reshape: cannot infer -1"):
        D.reshape(x, np.array([0, -1, 5]), False)


def _nonzero_chain(hi=None):
    """NonZero(x) + 1 over a [3, 4] input, as graph IR."""
    x = Var("x", TensorType((3, 4), "float32"))
    nz = Call("dyn.nonzero", [x], {"shape": (2, ("nonzero_count_y", 0, hi))}, span="nz")
    return x, nz, Function([x], [Call("add", [nz, Constant(np.array(1, np.int64))])])


def test_type_relation_makes_the_same_late_symbol_every_time():
    x, nz, func = _nonzero_chain(12)
    again = Call("dyn.nonzero", [x], nz.attrs)
    assert nz.checked_type == again.checked_type == TensorType(
        (2, SymVar("nonzero_count_y", 0, 12)), "int64")
    assert func.outputs[0].checked_type.shape[1] == SymVar("nonzero_count_y", 0, 12)


def test_graph_interpreter_binds_late_symbols():
    x = (RNG.random((3, 4)) < 0.5).astype(np.float32)
    _, _, func = _nonzero_chain()
    (out,) = evaluate(func, {"x": x})
    _same([out], [np.vstack(np.nonzero(x)).astype(np.int64) + 1])


def test_choose_executor_picks_the_vm_for_runtime_ops():
    _, _, func = _nonzero_chain()
    assert choose_executor(func, None) == "vm"
    with pytest.raises(CompileError, match="dyn.nonzero"):
        choose_executor(func, "aot")


def test_shape_heap_computes_late_dims_inline_and_forgets_them_out_of_scope():
    n = SymVar("n")
    late = SymVar("count", 0, None)
    heap = ShapeHeap([n, late], [late])
    early = heap.slot(n * 4)
    assert len(heap.program) == 6 and not heap.inline
    heap.push()
    inner = heap.slot(late * 8 + n * 4)
    assert heap.slot(late * 8 + n * 4) == inner  # shared inside the scope
    assert len(heap.program) == 6, "a late dim never goes to the head program"
    assert heap.take_inline() and not heap.inline
    heap.pop()
    assert heap.slot(late * 8 + n * 4) != inner, "recomputed where the scope has not run"
    assert heap.slot(n * 4) == early


def test_bytecode_binds_then_computes_then_allocates_late_storage():
    _, _, func = _nonzero_chain(12)
    fused = optimize(func, {})
    calls = [c for c in post_order(fused.outputs) if isinstance(c, PrimitiveCall)]
    prog = compile_vm(fused, {c.uid: c.name for c in calls}, {})
    assert [(s.name, s.lo, s.hi) for s in prog.symbols] == [("nonzero_count_y", 0, 12)]
    main = prog.functions[-1]
    ctx = DecodeContext("main", main.num_regs, main.heap_size, len(prog.functions),
                        len(prog.constants))
    instrs = decode_function(ctx, prog.code, main.start, main.end)
    order = [prog.functions[i.func_idx].name for i in instrs if i.op == OP_CALL]
    assert order == ["vm.builtin.match_shape", "vm.builtin.nonzero", "vm.builtin.bind_shape",
                     "vm.builtin.shape_compute", "vm.builtin.alloc_storage",
                     "vm.builtin.alloc_tensor", calls[0].name], order
    # the late-sized output has storage of its own, sized by the slot the inline program
    # (after the binding) computes: 8 * nonzero_count_y rounded up to 64
    compute, alloc = instrs[3], instrs[4]
    program = prog.constants[compute.args[0][1]].tolist()
    assert alloc.args[1] == (HEAP, program[-5])
    steps = [program[k:k + 6] for k in range(0, len(program), 6)]
    assert steps[0][2:4] == [0, 0], "the first step reads the late symbol's slot (0)"
