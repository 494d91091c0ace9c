"""Loop IR: interpreter semantics, lowering of tensor expressions, Simplify, schedule primitives."""

import numpy as np
import pytest

from kiln.errors import ScheduleError
from kiln.schedules import primitives as P
from kiln.schedules.cpu import schedule_loops
from kiln.tir import interpreter as loop_interp
from kiln.tir import loop as L
from kiln.tir import te
from kiln.tir.lower import Schedule, lower
from kiln.tir.transform.simplify import simplify


def _run(func, *arrays):
    loop_interp.run(func, *arrays)
    return arrays[-1]


def test_interpreter_floor_division_and_modulo():
    out = L.Buffer("out", (6,), "int64")
    i = L.Var("i")
    body = L.For(i, L.IntImm(0), L.IntImm(3), "serial", L.seq(
        L.BufferStore(out, (i - 2) // 2, [i]),
        L.BufferStore(out, (i - 2) % 3, [i + 3]),
    ))
    res = _run(L.PrimFunc("f", [out], body), np.zeros(6, np.int64))
    assert res.tolist() == [-1, -1, 0, 1, 2, 0]


def _elementwise_chain():
    x = te.placeholder((4, 5), "float32", "x")
    y = te.compute(x.shape, lambda i, j: x[i, j] * 2.0, name="y")
    z = te.compute((5, 4), lambda i, j: L.maximum(y[j, i], 1.0), name="z")
    return x, z


def test_lower_inlines_injective_stages():
    x, z = _elementwise_chain()
    sch = Schedule(z).inline_injective()
    func = lower(sch, [x], "f")
    assert not any(isinstance(s, L.Allocate) for s in L.walk_stmts(func.body))
    xs = np.random.default_rng(0).standard_normal((4, 5)).astype("float32")
    res = _run(func, xs, np.zeros((5, 4), "float32"))
    np.testing.assert_allclose(res, np.maximum(xs.T * 2, 1))


def test_lower_materialized_stage_allocates():
    x, z = _elementwise_chain()
    func = lower(Schedule(z), [x], "f")
    allocs = [s for s in L.walk_stmts(func.body) if isinstance(s, L.Allocate)]
    assert len(allocs) == 1
    xs = np.ones((4, 5), "float32")
    np.testing.assert_allclose(_run(func, xs, np.zeros((5, 4), "float32")), 2.0)


def _matmul(order=None):
    a = te.placeholder((3, 4), "float32", "a")
    b = te.placeholder((4, 5), "float32", "b")
    k = te.reduce_axis(4, "k")
    c = te.compute((3, 5), lambda i, j: te.sum(a[i, k.var] * b[k.var, j], [k]), name="c")
    sch = Schedule(c)
    if order:
        i, j = c.axes
        sch[c].reorder(*order(i, j, k))
    return lower(sch, [a, b], "mm")


@pytest.mark.parametrize("order", [None, lambda i, j, k: (i, k, j), lambda i, j, k: (k, i, j)])
def test_reduction_orders_agree(order):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4)).astype("float32")
    b = rng.standard_normal((4, 5)).astype("float32")
    res = _run(_matmul(order), a, b, np.zeros((3, 5), "float32"))
    np.testing.assert_allclose(res, a @ b, rtol=1e-5, atol=1e-6)


def test_reorder_rejects_non_permutation():
    a = te.placeholder((3,), "float32", "a")
    c = te.compute((3,), lambda i: a[i], name="c")
    with pytest.raises(ScheduleError):
        Schedule(c)[c].reorder()


def test_compute_inline_rejects_reduction():
    a = te.placeholder((3,), "float32", "a")
    k = te.reduce_axis(3, "k")
    c = te.compute((1,), lambda i: te.sum(a[k.var], [k]), name="c")
    with pytest.raises(ScheduleError):
        Schedule(c)[c].compute_inline()


def test_simplify_folds_index_arithmetic_and_unit_loops():
    out = L.Buffer("out", (4,), "int64")
    i, j = L.Var("i"), L.Var("j")
    value = (i * 4 + j) // 4 + (i * 4 + j) % 4 * 0 + j % 4
    body = L.For(i, L.IntImm(0), L.IntImm(1), "serial",
                 L.For(j, L.IntImm(0), L.IntImm(4), "serial", L.BufferStore(out, value, [j])))
    func = simplify(L.PrimFunc("f", [out], body))
    assert isinstance(func.body, L.For) and func.body.var is j
    store = func.body.body
    assert repr(store.value) == "j"
    assert _run(func, np.zeros(4, np.int64)).tolist() == [0, 1, 2, 3]


def test_simplify_splits_a_flattened_index_at_a_divisor_of_its_row():
    """``(r*576 + o*64 + i) // 192 % 3 -> o // 3`` and ``(...) // 64 % 3 -> o % 3``, ``% 64 -> i``:
    a multiple of the divisor leaves ``//`` and ``%`` whatever the other terms are (floor
    division), so the [rows, 576] view of a [rows, 3, 3, 64] tensor reads it contiguously in
    ``i`` (SmolLM2's attention output before o_proj had gathered lanes: 1.5 ms a layer)."""
    src = L.Buffer("src", (4, 3, 3, 64), "float32")
    out = L.Buffer("out", (4, 576), "float32")
    r, o, i = L.Var("r"), L.Var("o"), L.Var("i")
    flat = r * 576 + (o * 64 + i)
    load = L.BufferLoad(src, [r, flat // 192 % 3, flat // 64 % 3, flat % 64])
    body = L.For(r, L.IntImm(0), L.IntImm(4), "serial",
                 L.For(o, L.IntImm(0), L.IntImm(9), "serial",
                       L.For(i, L.IntImm(0), L.IntImm(64), "serial",
                             L.BufferStore(out, load, [r, o * 64 + i]))))
    func = simplify(L.PrimFunc("f", [src, out], body))
    store = func.body.body.body.body
    assert [repr(x) for x in store.value.indices[1:]] == ["(o // 3)", "(o % 3)", "i"]
    x = np.arange(4 * 576, dtype=np.float32).reshape(4, 3, 3, 64)
    np.testing.assert_array_equal(_run(func, x, np.zeros((4, 576), np.float32)),
                                  x.reshape(4, 576))


def test_fuse_split_parallel_preserve_semantics():
    func = _matmul()
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4)).astype("float32")
    b = rng.standard_normal((4, 5)).astype("float32")
    outer = P.top_level_nests(func)[0]
    func, fused = P.fuse(func, outer)
    assert fused.extent.value == 15
    func, o, _ = P.split(func, fused, 4)
    func = P.parallel(func, o)
    res = _run(func, a, b, np.zeros((3, 5), "float32"))
    np.testing.assert_allclose(res, a @ b, rtol=1e-5, atol=1e-6)


def test_primitives_check_preconditions():
    func = _matmul()
    outer = P.top_level_nests(func)[0]
    with pytest.raises(ScheduleError):
        P.vectorize(func, outer)
    func = P.parallel(func, P.get_loop(func, outer.body.var.name))
    with pytest.raises(ScheduleError):
        P.parallel(func, P.top_level_nests(func)[0])
    with pytest.raises(ScheduleError):
        P.get_loop(func, "nope")


def test_schedule_loops_parallelizes_large_nests_only():
    big = te.placeholder((64, 128), "float32", "x")
    out = te.compute(big.shape, lambda i, j: big[i, j] + 1.0, name="y")
    func = schedule_loops(simplify(lower(Schedule(out), [big], "f")))
    kinds = [s.kind for s in L.walk_stmts(func.body) if isinstance(s, L.For)]
    assert kinds.count("parallel") == 1
    small = te.placeholder((2, 3), "float32", "x")
    out = te.compute(small.shape, lambda i, j: small[i, j] + 1.0, name="y")
    func = schedule_loops(simplify(lower(Schedule(out), [small], "f")))
    assert all(s.kind == "serial" for s in L.walk_stmts(func.body) if isinstance(s, L.For))


def test_verifier_rejects_broken_ir():
    from kiln.errors import CompileError
    from kiln.tir.verify import verify

    out = L.Buffer("out", (4,), "float32")
    stray, i = L.Var("stray"), L.Var("i")
    unbound = L.PrimFunc("f", [out], L.BufferStore(out, L.FloatImm(0.0), [stray]))
    with pytest.raises(CompileError, match="stray"):
        verify(unbound)
    other = L.Buffer("tmp", (4,), "float32")
    unallocated = L.PrimFunc("f", [out], L.For(i, L.IntImm(0), L.IntImm(4), "serial",
                                               L.BufferStore(other, L.FloatImm(0.0), [i])))
    with pytest.raises(CompileError, match="tmp"):
        verify(unallocated)
    wrong_dtype = L.PrimFunc("f", [out], L.For(i, L.IntImm(0), L.IntImm(4), "serial",
                                               L.BufferStore(out, i, [i])))
    with pytest.raises(CompileError, match="int64"):
        verify(wrong_dtype)
    verify(_matmul((lambda i, j, k: (i, k, j))))
