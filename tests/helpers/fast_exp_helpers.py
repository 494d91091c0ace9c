"""FastExp test helpers shared by tests/unit/tir/test_fast_exp.py (interpreter) and
tests/backend/tir/test_fast_exp_compiled.py (C and LLVM): the kernel, the special inputs, and the
accuracy check against float64 exp."""

from __future__ import annotations

import numpy as np

from kiln.tir import loop as L

TINY = np.finfo(np.float32).tiny
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.7229, 89.0, 1e30,
            -87.33654, -87.5, -100.0, -103.97, -103.98, -104.0, -1e30]


def exp_kernel(n: int, dtype: str = "float32", kind: str = "vectorized") -> L.PrimFunc:
    """``o[i] = exp(a[i])`` over ``n`` elements, the loop of ``kind``."""
    a, o = L.Buffer("a", (n,), dtype), L.Buffer("o", (n,), dtype)
    i = L.Var("i")
    store = L.BufferStore(o, L.call("exp", a[i]), [i])
    return L.PrimFunc("exp_kernel", [a, o], L.For(i, L.IntImm(0), L.IntImm(n), kind, store))


def clamped_exp_kernel(n: int, lo: float, hi: float, constants_first: bool = False
                       ) -> L.PrimFunc:
    """``o[i] = exp(min(max(a[i], lo), hi))`` over ``n`` elements, or with
    ``constants_first`` ``exp(min(hi, max(lo, a[i])))`` (``nn.attention``'s clamp, which lets
    NaN through; FastExp reads either as the argument's range)."""
    a, o = L.Buffer("a", (n,), "float32"), L.Buffer("o", (n,), "float32")
    i = L.Var("i")
    lo_imm, hi_imm = L.FloatImm(lo, "float32"), L.FloatImm(hi, "float32")
    arg = (L.minimum(hi_imm, L.maximum(lo_imm, a[i])) if constants_first
           else L.minimum(L.maximum(a[i], lo_imm), hi_imm))
    store = L.BufferStore(o, L.call("exp", arg), [i])
    return L.PrimFunc("exp_kernel", [a, o], L.For(i, L.IntImm(0), L.IntImm(n), "vectorized",
                                                  store))


def check_clamped_exp(x: np.ndarray, got: np.ndarray, lo: float, hi: float) -> None:
    """``got`` is exp of ``x`` clamped to [lo, hi] within 3e-7 relative and 1 ulp."""
    ref = np.exp(np.clip(x.astype(np.float64), np.float32(lo), np.float32(hi)))
    rel = np.abs(got - ref) / ref
    assert rel.max() <= 3e-7, f"max relative error {rel.max():.3g} at x={x[rel.argmax()]}"
    assert ulp_distance(got, ref.astype(np.float32)).max() <= 1


def count_calls(func: L.PrimFunc, name: str) -> int:
    """How many intrinsic calls ``name`` ``func`` holds."""
    return sum(isinstance(x, L.Call) and x.name == name
               for s in L.walk_stmts(func.body) for x in L.walk_exprs(L.stmt_exprs(s)))


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 units in the last place (both finite, same sign)."""
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


def check_exp(x: np.ndarray, got: np.ndarray) -> None:
    """Normal results within 3e-7 relative (and 1 ulp), subnormals within 1 ulp, specials
    (NaN, ±inf, overflow to inf, underflow to 0) exact."""
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
        want = ref.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    normal = finite & (want >= TINY)
    rel = np.abs(got[normal] - ref[normal]) / ref[normal]
    assert rel.max() <= 3e-7, f"max relative error {rel.max():.3g} at x={x[normal][rel.argmax()]}"
    assert ulp_distance(got[normal], want[normal]).max() <= 1
    small = finite & (want < TINY)
    assert ulp_distance(got[small], want[small]).max(initial=0) <= 1
    np.testing.assert_array_equal(got[x <= -104.0], 0.0)
