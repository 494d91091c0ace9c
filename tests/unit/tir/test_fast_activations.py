"""float32 sigmoid and tanh expanded by FastExp (kiln.tir.transform.fast_activations) on the
loop-IR interpreter: no call is left, the values are within the rational approximations'
error of float64's, the special values, and a guarded argument. Compiled, and against
onnxruntime bit for bit: tests/backend/tir/test_fast_activations_compiled.py."""

from __future__ import annotations

import numpy as np
import pytest
from fast_exp_helpers import count_calls

from kiln.tir import loop as L
from kiln.tir.interpreter import run
from kiln.tir.transform.fast_exp import lower_fast_exp

REFERENCE = {"sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "tanh": np.tanh}
#: absolute error bound of each approximation (float32 arithmetic, with or without FMA)
BOUND = {"sigmoid": 2.5e-7, "tanh": 4e-7}
SPECIALS = {"sigmoid": {np.inf: 1.0, -np.inf: 0.0, 0.0: 0.5, -30.0: 0.0},
            "tanh": {np.inf: 1.0, -np.inf: -1.0, 0.0: 0.0, -30.0: -1.0}}


def activation_kernel(n: int, name: str, dtype: str = "float32") -> L.PrimFunc:
    """``o[i] = name(a[i])`` over ``n`` elements."""
    a, o = L.Buffer("a", (n,), dtype), L.Buffer("o", (n,), dtype)
    i = L.Var("i")
    store = L.BufferStore(o, L.call(name, a[i]), [i])
    return L.PrimFunc("act", [a, o], L.For(i, L.IntImm(0), L.IntImm(n), "vectorized", store))


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_expanded_activation_matches_float64(name):
    x = np.concatenate([np.linspace(-30.0, 30.0, 4001, dtype=np.float32),
                        np.array([*SPECIALS[name], np.nan, -0.0, 1e-30, -1e-30], np.float32)])
    func = lower_fast_exp(activation_kernel(len(x), name))
    assert count_calls(func, name) == 0 and count_calls(func, "exp") == 0
    got = np.zeros_like(x)
    run(func, x, got)
    finite = np.isfinite(x)
    err = np.abs(got[finite] - REFERENCE[name](x[finite].astype(np.float64)))
    assert err.max() <= BOUND[name], f"{name}: max error {err.max():.3g}"
    for value, want in SPECIALS[name].items():
        assert got[x == np.float32(value)][0] == np.float32(want), (name, value)
    assert np.isnan(got[np.isnan(x)]).all()
    assert np.signbit(got[np.signbit(x) & (x == 0)]).all() == (name == "tanh")


def test_other_dtypes_keep_tanh():
    assert count_calls(lower_fast_exp(activation_kernel(8, "tanh", "float64")), "tanh") == 1


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_activation_of_a_guarded_load_is_not_speculated(name):
    """``i >= 1 ? f(a[i - 1]) : 0`` must not load a[-1]: the intrinsic stays."""
    a, o = L.Buffer("a", (8,), "float32"), L.Buffer("o", (8,), "float32")
    i = L.Var("i")
    value = L.Select(i >= 1, L.call(name, a[i - 1]), L.FloatImm(0.0))
    func = L.PrimFunc("f", [a, o], L.For(i, L.IntImm(0), L.IntImm(8), "serial",
                                         L.BufferStore(o, value, [i])))
    lowered = lower_fast_exp(func)
    assert count_calls(lowered, name) == 1
    x = np.linspace(-3, 3, 8, dtype=np.float32)
    got = np.zeros_like(x)
    run(lowered, x, got)
    want = np.concatenate([[0.0], REFERENCE[name](x[:-1].astype(np.float64))])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
