"""What the straight-line expansions of :mod:`kiln.tir.transform.fast_exp` and
:mod:`kiln.tir.transform.fast_activations` share: float32 clamps and NaN tests on the bit
pattern, and the ``LetStmt`` bindings of their values used more than once.

A float compare and select would do for LLVM, but GCC at its default ``-ftrapping-math`` keeps
those as branches and then does not vectorize the loop; integer min, and, or and compares
vectorize in both (docs/decisions/017-fast-exp.md).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.tir import loop as L

F32, I32, U32 = "float32", "int32", "uint32"

Binding = tuple[L.Var, L.PrimExpr]


class Lets:
    """The bindings of one expansion, in order: ``lets(name, value)`` binds ``value`` to a new
    variable ``<prefix>_<name>`` and returns it (each value is computed once)."""

    def __init__(self, prefix: str):
        self.prefix, self.bindings = prefix, []

    def __call__(self, name: str, value: L.PrimExpr) -> L.Var:
        var = L.Var(f"{self.prefix}_{name}", value.dtype)
        self.bindings.append((var, value))
        return var


def f32_bits(value: float) -> int:
    """The IEEE 754 bits of float32 ``value`` as an unsigned integer."""
    return int(np.array(value, np.float32).view(np.uint32))


def clamp_bits(xi: L.PrimExpr, lo: float, hi: float) -> L.PrimExpr:
    """float32 ``min(max(x, lo), hi)`` for the int32 bits ``xi`` of ``x``, ``lo < 0 < hi``: a
    signed min of the bits for the upper bound (a float above ``hi`` has a larger signed
    pattern), an unsigned one for the lower (a float below ``lo`` has a larger unsigned one).
    A NaN lands on either bound: restore it with :func:`or_nan`."""
    assert lo < 0 < hi, (lo, hi)
    upper = L.minimum(xi, L.IntImm(f32_bits(hi), I32))
    return L.reinterpret(L.minimum(L.reinterpret(upper, U32), L.IntImm(f32_bits(lo), U32)), F32)


def or_nan(xi: L.PrimExpr, value_bits: L.PrimExpr) -> L.PrimExpr:
    """``value_bits`` (int32) as float32, with the quiet-NaN bits or-ed in where the input bits
    ``xi`` are a NaN (over any value the arithmetic made of the clamped NaN)."""
    is_nan = L.Binary("&", xi, L.IntImm(0x7FFFFFFF, I32)) > L.IntImm(f32_bits(math.inf), I32)
    quiet = L.Select(is_nan, L.IntImm(f32_bits(math.nan), I32), L.IntImm(0, I32))
    return L.reinterpret(L.Binary("|", value_bits, quiet), F32)
