"""FastExp (kiln.tir.transform.fast_exp) on the loop-IR interpreter: accuracy against float64 exp
on a sweep of [-104, 89] and the special values, and where the pass leaves ``exp`` alone. The
dense sweep through compiled C and LLVM code is tests/backend/tir/test_fast_exp_compiled.py."""

from __future__ import annotations

import numpy as np
import pytest
from fast_exp_helpers import (
    SPECIALS,
    check_clamped_exp,
    check_exp,
    clamped_exp_kernel,
    count_calls,
    exp_kernel,
)

from kiln.tir import loop as L
from kiln.tir.interpreter import run
from kiln.tir.transform.fast_exp import lower_fast_exp


def test_fast_exp_on_the_interpreter_matches_float64_exp():
    sweep = np.linspace(-104.0, 89.0, 1200, dtype=np.float32)
    x = np.concatenate([np.array(SPECIALS, np.float32), sweep])
    func = lower_fast_exp(exp_kernel(len(x)))
    assert count_calls(func, "exp") == 0
    got = np.zeros_like(x)
    run(func, x, got)
    check_exp(x, got)


@pytest.mark.parametrize("constants_first", [False, True])
@pytest.mark.parametrize("lo,hi", [(-87.33654, 0.0), (-80.0, 88.37), (-87.33654, 88.37)])
def test_exp_of_a_clamped_argument_is_one_scale_factor(lo, hi, constants_first):
    """``exp(min(max(a, lo), hi))`` with the range inside the normal results: no clamp of its
    own, one power-of-two factor (no ``>>`` splitting the exponent), still within 1 ulp."""
    x = np.concatenate([np.linspace(-120.0, 100.0, 1500, dtype=np.float32),
                        np.array([lo, hi, -0.0, 1e-8, -1e-8, -np.inf, np.inf], np.float32)])
    func = lower_fast_exp(clamped_exp_kernel(len(x), lo, hi, constants_first))
    ops = [e.op for s in L.walk_stmts(func.body) for e in L.walk_exprs(L.stmt_exprs(s))
           if isinstance(e, L.Binary)]
    assert ">>" not in ops and count_calls(func, "exp") == 0
    got = np.zeros_like(x)
    run(func, x, got)
    check_clamped_exp(x, got, lo, hi)


def test_exp_of_a_clamped_nan_is_nan_with_the_constants_first():
    """min/max select their second operand for a NaN: ``min(0, max(lo, nan))`` is NaN, and the
    one-scale-factor exp keeps it NaN (nn.attention relies on it for NaN scores)."""
    x = np.array([np.nan, -1.0, 0.0, np.nan], np.float32)
    got = np.zeros_like(x)
    run(lower_fast_exp(clamped_exp_kernel(len(x), -87.33654, 0.0, constants_first=True)), x, got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))


def test_a_range_past_the_normal_results_keeps_the_general_exp():
    func = lower_fast_exp(clamped_exp_kernel(8, -100.0, 0.0))
    ops = [e.op for s in L.walk_stmts(func.body) for e in L.walk_exprs(L.stmt_exprs(s))
           if isinstance(e, L.Binary)]
    assert ">>" in ops


def test_other_dtypes_keep_the_intrinsic():
    assert count_calls(lower_fast_exp(exp_kernel(8, "float64")), "exp") == 1
    assert count_calls(lower_fast_exp(exp_kernel(8, "float16")), "exp") == 1


def test_exp_of_a_guarded_load_is_not_speculated():
    """``inside ? exp(a[i - 1]) : 0`` must not load a[-1]: the intrinsic stays; an exp whose
    loads the condition makes anyway (ELU's ``x > 0 ? x : exp(x) - 1``) is expanded."""
    a, o = L.Buffer("a", (8,), "float32"), L.Buffer("o", (8,), "float32")
    i = L.Var("i")
    zero = L.FloatImm(0.0)
    guarded = L.Select(i >= 1, L.call("exp", a[i - 1]), zero)
    elu = L.Select(a[i] > zero, a[i], L.call("exp", a[i]) - L.FloatImm(1.0))
    for value, expanded in ((guarded, False), (elu, True)):
        func = L.PrimFunc("f", [a, o], L.For(i, L.IntImm(0), L.IntImm(8), "serial",
                                             L.BufferStore(o, value, [i])))
        lowered = lower_fast_exp(func)
        assert (count_calls(lowered, "exp") == 0) == expanded
        x = np.linspace(-3, 3, 8, dtype=np.float32)
        want, got = np.zeros_like(x), np.zeros_like(x)
        run(func, x, want)
        run(lowered, x, got)
        np.testing.assert_allclose(got, want, rtol=3e-7)


def test_exp_of_a_load_at_a_fused_index_is_expanded():
    """Parallel loops are fused before FastExp runs, so row-wise loads index with ``f // 128``
    and ``f % 128``: a division by a constant cannot fault, and a load the store makes anyway
    evaluates its index anyway (softmax over [1, 12, 128, 128] kept libm's exp: 7x onnxruntime's
    time)."""
    a, o = L.Buffer("a", (32,), "float32"), L.Buffer("o", (32,), "float32")
    f = L.Var("f")
    idx = L.Binary("//", f, L.IntImm(4)) * L.IntImm(4) + L.Binary("%", f, L.IntImm(4))
    func = L.PrimFunc("f", [a, o], L.For(f, L.IntImm(0), L.IntImm(32), "serial",
                                         L.BufferStore(o, L.call("exp", a[idx]), [f])))
    lowered = lower_fast_exp(func)
    assert count_calls(lowered, "exp") == 0
    x = np.linspace(-3, 3, 32, dtype=np.float32)
    want, got = np.zeros_like(x), np.zeros_like(x)
    run(func, x, want)
    run(lowered, x, got)
    np.testing.assert_allclose(got, want, rtol=3e-7)
    # a division by a variable that is not inside a load the store makes may still fault
    d = L.Var("d")
    guarded = L.Select(d > L.IntImm(0), L.call("exp", a[L.Binary("//", f, d)]), L.FloatImm(0.0))
    func = L.PrimFunc("g", [a, o], L.For(f, L.IntImm(0), L.IntImm(32), "serial",
                                         L.BufferStore(o, guarded, [f])))
    assert count_calls(lower_fast_exp(func), "exp") == 1
