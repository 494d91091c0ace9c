"""FastExp compiled (C and LLVM; LLVM's explicit vector path and its loop vectorizer): a dense
sweep of [-104, 89] against float64 exp, with the bounds of the interpreter's test
(tests/unit/tir/test_fast_exp.py: 1 ulp for normal results, specials exact)."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import TARGETS, build_kernels
from fast_exp_helpers import SPECIALS, check_clamped_exp, check_exp, clamped_exp_kernel, exp_kernel

import kiln
from kiln.tir.transform.fast_exp import lower_fast_exp
from kiln.tir.transform.make_packed_api import make_packed_api

N = 1 << 21


@pytest.mark.parametrize("target", [*TARGETS, "llvm -mcpu=native"])
@pytest.mark.parametrize("kind", ["vectorized", "serial"])
def test_compiled_fast_exp_matches_float64_exp(target, kind):
    func = make_packed_api(lower_fast_exp(exp_kernel(N, kind=kind)))
    lib = build_kernels([func], target)
    x = np.linspace(-104.0, 89.0, N, dtype=np.float32)
    x[:len(SPECIALS)] = SPECIALS
    out = kiln.runtime.empty((N,), "float32")
    lib.get_function("exp_kernel")(kiln.runtime.array(x), out)
    check_exp(x, out.numpy())


@pytest.mark.parametrize("target", [*TARGETS, "llvm -mcpu=native"])
def test_compiled_exp_of_a_clamped_argument(target):
    """``nn.attention``'s ``exp(min(max(x, ln 2^-126), 0))``: one scale factor, 1 ulp."""
    lo, hi, n = -87.33654, 0.0, 1 << 16
    func = make_packed_api(lower_fast_exp(clamped_exp_kernel(n, lo, hi)))
    lib = build_kernels([func], target)
    x = np.linspace(-100.0, 5.0, n, dtype=np.float32)
    out = kiln.runtime.empty((n,), "float32")
    lib.get_function("exp_kernel")(kiln.runtime.array(x), out)
    check_clamped_exp(x, out.numpy(), lo, hi)
