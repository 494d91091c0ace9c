"""ONNX Loop with scan outputs over a run-time iteration count, without a toolchain: the
LoopCall's types (a late count symbol), the graph interpreter against ONNX's reference
evaluator, the import's routing and errors, and the bytecode's list builtins."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_loops import (
    check_references,
    constant_empty_model,
    downstream_feeds,
    downstream_model,
    ragged_model,
    threshold_feeds,
    threshold_model,
    trip_count_feeds,
    trip_count_model,
)

from kiln.arith import SymVar
from kiln.backend.vm_codegen import compile_vm
from kiln.driver.build_module import optimize, primitive_calls
from kiln.errors import ShapeError, UnsupportedOpError
from kiln.frontend import from_onnx
from kiln.frontend.onnx.context import NotConstantError, static_values_only
from kiln.relay.graph import Constant, Function, LoopCall, TensorType, Var, post_order, with_args
from kiln.relay.interpreter import evaluate
from kiln.runtime.vm.bytecode import OP_CALL, DecodeContext, decode_function


def _loop_of(func: Function) -> LoopCall:
    (node,) = [n for n in post_order(func.outputs) if isinstance(n, LoopCall)]
    return node


def test_scan_outputs_are_stacked_over_a_late_count_symbol():
    mod, _ = from_onnx(trip_count_model())
    loop = _loop_of(mod["main"])
    count = loop.count
    assert isinstance(count, SymVar) and count.lo == 0 and count.name == "loop_count_ss"
    n = mod["main"].params[0].checked_type.shape[0]
    assert loop.num_carried == 1 and loop.num_scan == 2
    assert [t.shape for t in loop.output_types] == [(n,), (count,), (count, n)]
    # a rebuild over new arguments keeps the same symbol (consumers keep their types)
    again = with_args(loop, [Constant(np.array(7, np.int64)), *loop.args[1:]])
    assert again is not loop and again.output_types == loop.output_types


def test_loop_call_checks_its_count_symbol():
    mod, _ = from_onnx(trip_count_model())
    loop = _loop_of(mod["main"])
    n = 2 + loop.num_carried
    with pytest.raises(ShapeError, match="need exactly one count symbol"):
        LoopCall(*loop.args[:2], loop.args[2:n], loop.args[n:], loop.step, loop.body)
    body = Function(loop.body.params, loop.body.outputs[:2])
    with pytest.raises(ShapeError, match="need exactly one count symbol"):
        LoopCall(*loop.args[:2], loop.args[2:n], loop.args[n:], loop.step, body,
                 SymVar("c", 0))


@pytest.mark.parametrize("make, feeds", [(trip_count_model, trip_count_feeds),
                                         (threshold_model, threshold_feeds),
                                         (downstream_model, downstream_feeds)])
def test_graph_interpreter_stacks_like_the_references(make, feeds):
    model = make()
    mod, params = from_onnx(model)
    for feed in feeds():
        check_references(model, feed, evaluate(mod["main"], {**feed, **params}))


def test_no_iteration_gives_empty_outputs_of_the_element_shape():
    mod, params = from_onnx(trip_count_model())
    x = np.arange(5, dtype=np.float32)
    y, ss, vs = evaluate(mod["main"], {"x": x, "M": np.array(0, np.int64), **params})
    np.testing.assert_array_equal(y, x)
    assert ss.shape == (0,) and vs.shape == (0, 5) and vs.dtype == np.float32
    mod, params = from_onnx(threshold_model())
    feed = {"x": np.ones((3, 2), np.float32), "c0": np.array(False), "limit": np.array(1.0)}
    outs = evaluate(mod["main"], {**feed, **params})
    assert [o.shape for o in outs] == [(3, 2), (0,), (0, 3, 2), (0,)]
    assert outs[3].dtype == np.int64


def test_fused_loop_keeps_its_scan_outputs():
    model = downstream_model()
    mod, params = from_onnx(model)
    fused = optimize(mod["main"], params)
    loop = _loop_of(fused)
    assert loop.count.name == "loop_count_ss" and loop.num_scan == 2
    for feed in downstream_feeds():
        check_references(model, feed, evaluate(fused, feed))
    total, sq = evaluate(fused, {"x": np.ones(4, np.float32), "M": np.array(0, np.int64)})
    np.testing.assert_array_equal(total, np.zeros(4, np.float32))  # a sum over no row
    assert sq.shape == (0,)


def test_constant_zero_trip_count_gives_empty_constants():
    mod, params = from_onnx(constant_empty_model())
    assert not any(isinstance(n, LoopCall) for n in post_order(mod["main"].outputs))
    x = np.arange(3, dtype=np.float32)
    got = evaluate(mod["main"], {"x": x, **params})
    np.testing.assert_array_equal(got[0], x)
    assert got[1].shape == (0,) and got[2].shape == (0, 3)


def test_scan_element_shaped_by_body_data_is_refused():
    with pytest.raises(UnsupportedOpError, match="scan output 'nz'.*change between iterations"):
        from_onnx(ragged_model())


def test_bytecode_collects_copies_and_binds_the_count_after_the_loop():
    mod, params = from_onnx(trip_count_model())
    fused = optimize(mod["main"], params)
    prog = compile_vm(fused, {c.uid: c.name for c in primitive_calls(fused)}, {})
    assert [s.name for s in prog.symbols] == ["n", "loop_count_ss"]
    main = prog.functions[-1]
    ctx = DecodeContext("main", main.num_regs, main.heap_size, len(prog.functions),
                        len(prog.constants))
    called = [prog.functions[i.func_idx].name.removeprefix("vm.builtin.")
              for i in decode_function(ctx, prog.code, main.start, main.end) if i.op == OP_CALL]
    first_append = called.index("list_append")
    assert called.count("list_new") == 2 and called.index("list_new") < called.index("read_bool")
    # appended (copied) before the carried state is overwritten, stacked after the loop
    assert called[first_append + 1:first_append + 3] == ["list_append", "copy"]
    assert called[-5:] == ["list_stack", "bind_shape", "list_stack", "bind_shape",
                           "make_tuple"]


def test_loop_without_trip_count_or_carried_values_still_needs_an_output():
    # a body with neither carried values nor scan outputs is refused by the IR
    step = Function([Var("i", TensorType((), "int64"))], [Constant(np.array(True))])
    body = Function([Var("i", TensorType((), "int64")), Var("c", TensorType((), "bool"))],
                    [Constant(np.array(True))])
    with pytest.raises(ShapeError, match="neither carried values nor scan outputs"):
        LoopCall(Constant(np.array(1, np.int64)), Constant(np.array(True)), [], [], step, body)


def test_static_values_only_asks_for_the_trip_count():
    # the ONNX backend's fallback import: the count is data, so the trip count must be bound
    # (then the loop unrolls) rather than the outputs getting a data-dependent shape
    with static_values_only(), pytest.raises(NotConstantError, match="Loop trip count"):
        from_onnx(trip_count_model())


@pytest.mark.parametrize("trips, hi", [(2**63 - 1, None), (6, 6)])
def test_constant_trip_count_with_a_data_condition(trips, hi):
    # a huge sentinel (loop until the condition fails) bounds nothing; a small one bounds
    # the count symbol
    model = threshold_model(trips)
    mod, params = from_onnx(model)
    loop = _loop_of(mod["main"])
    assert loop.count.hi == hi and loop.count.lo == 0
    for feed in threshold_feeds():
        check_references(model, feed, evaluate(mod["main"], {**feed, **params}))
