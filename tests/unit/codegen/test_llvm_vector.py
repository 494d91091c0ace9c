"""Which ``vectorized`` loops the LLVM codegen emits as explicit vectors
(:func:`kiln.codegen.llvm.vector.vector_width`); no compiler needed."""

from __future__ import annotations

from kiln.codegen.llvm.vector import flat_coefficient, lane_coefficient, vector_width
from kiln.tir import loop as L

V = L.Var("v")
I = L.Var("i")


def loop(body: L.Stmt, extent: int = 32) -> L.For:
    return L.For(V, L.IntImm(0), L.IntImm(extent), "vectorized", body)


def test_lane_coefficients():
    assert lane_coefficient(V, V) == 1
    assert lane_coefficient(I * 32 + V, V) == 1
    assert lane_coefficient(V * 2 + 1, V) == 2
    assert lane_coefficient(I * 7 + 3, V) == 0
    assert lane_coefficient(V // 2, V) is None
    assert lane_coefficient(V * I, V) is None
    buf = L.Buffer("b", (4, 3, 32), "float32")
    assert flat_coefficient(buf, [I, L.IntImm(1), V], V) == 1
    assert flat_coefficient(buf, [V, L.IntImm(1), I], V) == 96


def test_contiguous_register_block_update_is_vectorized():
    acc = L.Buffer("acc", (7, 32), "float32")
    x, w = L.Buffer("x", (7, 64), "float32"), L.Buffer("w", (64, 32), "float32")
    body = L.BufferStore(acc, acc[I, V] + x[I, L.IntImm(3)] * w[L.IntImm(3), V], [I, V])
    assert vector_width(loop(body), 512) == 16
    assert vector_width(loop(body), 256) == 8
    assert vector_width(loop(body, 24), 512) == 8  # the largest power of two dividing 24
    assert vector_width(loop(body, 6), 512) == 0  # under 4 lanes: left to LLVM
    assert vector_width(loop(body), 0) == 0


def test_what_stays_scalar():
    a, b = L.Buffer("a", (64,), "float32"), L.Buffer("b", (64,), "float32")
    strided_store = L.BufferStore(b, a[V], [V * 2])
    value_of_v = L.BufferStore(a, L.Cast("float32", V), [V])
    lane_cond = L.BufferStore(a, L.Select(V < 3, b[V], L.FloatImm(0.0)), [V])
    ints = L.Buffer("n", (32,), "int32")
    int_div = L.BufferStore(ints, ints[V] // L.IntImm(3, "int32"), [V])
    flags = L.Buffer("f", (32,), "bool")
    bools = L.BufferStore(flags, flags[V], [V])
    # a lane mask selecting a load: both sides would run, the load out of its guard
    guarded_load = L.BufferStore(a, L.Select(b[V] > 0.0, b[V * 2], L.FloatImm(0.0)), [V])
    longs = L.Buffer("l", (64,), "int64")
    widening = L.BufferStore(longs, L.Cast("int64", a[V]), [V])  # float32 lanes → int64
    for body in (strided_store, value_of_v, lane_cond, int_div, bools, guarded_load, widening):
        assert vector_width(loop(body), 512) == 0, body


def test_strided_loads_become_lane_by_lane_gathers():
    """A load that does not move contiguously with the lanes (attention's keys read one
    sequence position per lane) is loaded lane by lane into a vector; the store stays
    contiguous."""
    a, b = L.Buffer("a", (64,), "float32"), L.Buffer("b", (128,), "float32")
    assert vector_width(loop(L.BufferStore(a, b[V * 2] * 2.0, [V])), 512) == 16


def test_fast_exp_lane_vocabulary_is_vectorized():
    """Integer arithmetic and shifts, float↔int casts, reinterpret, lane masks and selects
    on them (FastExp's expansion of exp)."""
    from kiln.tir.transform.fast_exp import lower_fast_exp

    a, b = L.Buffer("a", (64,), "float32"), L.Buffer("b", (64,), "float32")
    ints = L.Buffer("n", (32,), "int32")
    int_math = L.BufferStore(
        ints, L.Binary("<<", ints[V] + L.IntImm(1, "int32"), L.IntImm(2, "int32")), [V])
    mask = L.BufferStore(a, L.Select(b[V] > 0.0, b[V], L.FloatImm(0.0)), [V])
    shifted = L.Binary(">>", L.Cast("int32", b[V]), L.IntImm(1, "int32"))
    bits = L.BufferStore(a, L.reinterpret(shifted, "float32"), [V])
    for body in (int_math, mask, bits):
        assert vector_width(loop(body), 512) == 16, body
    func = L.PrimFunc("f", [a, b], loop(L.BufferStore(a, L.call("exp", b[V] - b[L.IntImm(0)]),
                                                      [V])))
    expanded = lower_fast_exp(func).body
    assert isinstance(expanded.body, L.LetStmt)  # the bindings of FastExp
    assert vector_width(expanded, 512) == 16


def test_lane_dependent_binding_is_a_value_not_an_address():
    a, b = L.Buffer("a", (64,), "float32"), L.Buffer("b", (64,), "float32")
    k = L.Var("k")
    as_index = L.LetStmt(k, V * 1, L.BufferStore(a, b[k], [V]))
    as_value = L.LetStmt(L.Var("y", "float32"), b[V], L.BufferStore(a, b[V] * 2.0, [V]))
    assert vector_width(loop(as_index), 512) == 0
    assert vector_width(loop(as_value), 512) == 16


def test_invariant_condition_and_copies_are_vectorized():
    a, b = L.Buffer("a", (4, 32), "float32"), L.Buffer("b", (4, 32), "float32")
    guarded = L.BufferStore(a, L.Select(I >= 1, b[I - 1, V], L.FloatImm(0.0)), [I, V])
    ints = L.Buffer("n", (32,), "int32")
    copy = L.BufferStore(ints, ints[V], [V])
    assert vector_width(loop(guarded), 512) == 16
    assert vector_width(loop(copy), 512) == 16


def test_narrow_loads_widen_to_float_lanes_where_no_store_reads_its_buffer():
    """The quantized dense's panel (docs/decisions/053): float16 scales and int8 weights
    loaded 8 / 16 at a time and cast to float32 lanes. An accumulation reading its own buffer
    (the one-row GEMVs) keeps LLVM's vectorizer, and so does a widening to integer lanes."""
    panel, acc = L.Buffer("p", (64,), "float32"), L.Buffer("acc", (32,), "float32")
    d, q = L.Buffer("d", (32,), "float16"), L.Buffer("q", (32,), "int8")
    dequant = L.BufferStore(panel, L.Cast("float32", d[V]) * L.Cast("float32", q[V]), [V])
    assert vector_width(loop(dequant), 256) == 8
    assert vector_width(loop(dequant), 512) == 16
    accumulate = L.BufferStore(acc, acc[V] + L.Cast("float32", q[V]), [V])
    assert vector_width(loop(accumulate), 256) == 0
    ints = L.Buffer("n", (32,), "int32")
    assert vector_width(loop(L.BufferStore(ints, L.Cast("int32", q[V]), [V])), 256) == 0
