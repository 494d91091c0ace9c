"""FastExp: float32 ``exp`` as straight-line loop-IR arithmetic that vectorizes (TVM's
``topi.fast_exp``, applied by relay's ``FastMath`` pass; here always on for float32, see
docs/decisions/017-fast-exp.md). The same pass expands float32 ``sigmoid`` and ``tanh``
(:mod:`kiln.tir.transform.fast_activations`, decision 060).

``exp`` left as an intrinsic is one libm call per element: LLVM has no vector ``llvm.exp`` without
a vector math library, and GCC calls ``expf`` per element. Expanded into multiplies, adds,
compares, selects, casts and bit operations it vectorizes like any arithmetic (the explicit
vectors of :mod:`kiln.codegen.llvm.vector`, LLVM's loop vectorizer, GCC's).

The algorithm is Cephes' ``expf`` (Stephen L. Moshier, Cephes Math Library 2.2, ``expf.c``; the
same as TVM's ``topi/include/tvm/topi/elemwise.h`` ``fast_exp_float32`` and Julien Pommier's
sse_mathfun ``exp_ps``), written here over loop-IR nodes:

1. clamp ``x`` to ``[-104, 89]``: exp(-104) ≈ 6.8e-46 is below half the smallest subnormal
   (1.4e-45) and rounds to 0, exp(89) overflows to +inf — so -inf → 0 and +inf → +inf fall out
   of the arithmetic. The clamp is an integer ``min`` of the bit pattern (see :func:`fast_exp`);
2. ``n = round(x · log2(e))`` by adding and subtracting 1.5 · 2^23;
3. ``r = x - n · C1 - n · C2`` with ``C1 + C2 = ln 2`` (Cody–Waite: ``C1 = 0.693359375`` has few
   significant bits, so ``n · C1`` is exact), ``|r| ≤ ln(2)/2``;
4. ``e^r ≈ 1 + r + r² · P(r)``, ``P`` Cephes' degree-5 minimax polynomial;
5. ``2^n`` from exponent bits: ``reinterpret((n + 127) << 23)`` as float32. To reach the
   subnormal results (x < -87.34, n < -126) the scale is applied as two factors ``2^(n >> 1)``
   and ``2^(n - (n >> 1))``, both normal for n in [-150, 128]: the first product is exact, the
   second rounds once, so subnormal results are correctly rounded up to the polynomial's error
   (results between 1.4e-45 and 1.2e-38 are the correct subnormals, not flushed to 0);
6. NaN in → NaN out: the quiet-NaN bits are or-ed into the result of a NaN input.

An argument clamped by the kernel itself, ``min(max(a, lo), hi)`` (either nesting) with constant
bounds inside [NORMAL_LOW, NORMAL_HIGH] — ``nn.attention``'s ``exp(x - max)``, kiln.topi.attention —
has every result a normal float with ``n`` in [-126, 127]: no clamp (step 1), ``2^n`` as one
factor taken from the bits of step 2's sum (``1.5 · 2^23 + n`` holds ``n`` in its low mantissa
bits: plus 127, shifted into the exponent field, the bits above wrap away; MLAS's exp kernel does
the same), and no NaN step (a NaN that survives the clamp flows through the arithmetic): about
half the instructions and constants (the constants alone outgrew AVX2's 16 registers).

Every value used more than once is bound by a ``LetStmt`` around the store that computes the
``exp`` (the loop IR has no expression-level let): computed once in C, LLVM and the interpreter.
No float compare or float select remains: GCC (``-ftrapping-math``, its default) keeps those as
branches and then does not vectorize the loop.

Measured against float64 exp over a dense sweep of [-104, 89] and the special values
(tests/backend/tir/test_fast_exp_compiled.py, docs/decisions/017-fast-exp.md): at most 1 ulp
(relative
error
≤ 8.4e-8) for normal results, 1 ulp of the subnormals below, specials exact — C and LLVM, with
or without FMA contraction.
"""

from __future__ import annotations

import numpy as np

from kiln.tir import loop as L
from kiln.tir.speculation import eager_loads, may_trap
from kiln.tir.transform.fast_activations import fast_sigmoid, fast_tanh
from kiln.tir.transform.float_bits import Binding, Lets, clamp_bits, or_nan

F32, I32, U32 = "float32", "int32", "uint32"
#: below this exp(x) rounds to 0 in float32; above the upper bound it overflows to +inf
LOW, HIGH = -104.0, 89.0
LOG2E = 1.44269504088896341
#: 1.5 * 2^23: t + ROUNDER - ROUNDER is t rounded to an integer (round half to even)
ROUNDER = 12582912.0
#: Cody–Waite split of ln 2 (Cephes expf.c)
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
#: exp(x) is a normal float32 with ``round(x · log2 e)`` in [-126, 127] for x in this range
#: (ln 2^-126 = -87.3365447; round(88.37 · log2 e) = 127)
NORMAL_LOW, NORMAL_HIGH = -87.33654, 88.37
#: Cephes expf.c's polynomial P(r), highest degree first: e^r ≈ 1 + r + r² · P(r)
POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
        5.0000001201e-1)


def _f(value: float) -> L.PrimExpr:
    return L.FloatImm(value, F32)


def _i(value: int) -> L.PrimExpr:
    return L.IntImm(value, I32)


def _pow2(n: L.PrimExpr) -> L.PrimExpr:
    """2^n as float32 for int32 ``n`` in [-126, 127]: the biased exponent in bits 23..30."""
    return L.reinterpret(L.Binary("<<", n + _i(127), _i(23)), F32)


def _poly(r: L.PrimExpr) -> L.PrimExpr:
    """e^r for ``|r| ≤ ln(2)/2``: 1 + r + r² · P(r), P by Horner's rule."""
    p = _f(POLY[0])
    for c in POLY[1:]:
        p = p * r + _f(c)
    return p * (r * r) + r + _f(1.0)


def _clamp_parts(x: L.PrimExpr) -> tuple[L.PrimExpr, L.PrimExpr] | None:
    """``(bound, operand)`` of a min or max with one constant operand (on either side)."""
    if not (isinstance(x, L.Binary) and x.op in ("min", "max")):
        return None
    if isinstance(x.a, L.FloatImm):
        return x.a, x.b
    if isinstance(x.b, L.FloatImm):
        return x.b, x.a
    return None


def _within_normal(x: L.PrimExpr) -> bool:
    """Whether ``x`` is ``min(max(a, lo), hi)`` or ``max(min(a, hi), lo)`` (each constant on
    either side of its min or max) with the bounds in [NORMAL_LOW, NORMAL_HIGH]."""
    outer = _clamp_parts(x)
    inner = outer and _clamp_parts(outer[1])
    if not inner or {x.op, outer[1].op} != {"min", "max"}:
        return False
    return all(np.float32(NORMAL_LOW) <= np.float32(b.value) <= np.float32(NORMAL_HIGH)
               for b in (outer[0], inner[0]))


def fast_exp(x: L.PrimExpr) -> tuple[list[Binding], L.PrimExpr]:
    """e^x for a float32 expression ``x`` (the algorithm: the module docstring; the shorter
    one when ``x`` is clamped inside the normal results).

    Returns the values to bind first (``LetStmt``s, in order: each is used several times and
    must be computed once) and the result over them.
    """
    assert x.dtype == F32, f"fast_exp: float32 only, got {x.dtype}"
    let = Lets("exp")
    lets = let.bindings

    if _within_normal(x):
        xv = let("x", x)
        t = let("t", xv * _f(LOG2E) + _f(ROUNDER))
        nf = let("nf", t - _f(ROUNDER))
        r = let("r", xv - nf * _f(LN2_HI) - nf * _f(LN2_LO))
        biased = L.reinterpret(t, U32) + L.IntImm(127, U32)
        return lets, _poly(r) * L.reinterpret(L.Binary("<<", biased, L.IntImm(23, U32)), F32)

    xi = let("xi", L.reinterpret(let("x", x), I32))
    xc = let("xc", clamp_bits(xi, LOW, HIGH))
    # n = round(x log2 e): adding and removing 1.5 * 2^23 rounds to an integer (|t| < 2^22);
    # no compiler folds it, nothing here allows reassociation.
    nf = let("nf", (xc * _f(LOG2E) + _f(ROUNDER)) - _f(ROUNDER))
    r = let("r", xc - nf * _f(LN2_HI) - nf * _f(LN2_LO))
    n = let("n", L.Cast(I32, nf))
    half = let("h", L.Binary(">>", n, _i(1)))
    return lets, or_nan(xi, L.reinterpret(_poly(r) * _pow2(half) * _pow2(n - half), I32))


#: the float32 calls expanded, each to ``(bindings, result)``
EXPANSIONS = {"exp": fast_exp, "sigmoid": fast_sigmoid, "tanh": fast_tanh}


def lower_fast_exp(func: L.PrimFunc) -> L.PrimFunc:
    """``func`` with the float32 ``exp``, ``sigmoid`` and ``tanh`` calls of its stores computed
    by :func:`fast_exp` and :mod:`kiln.tir.transform.fast_activations`, in ``LetStmt``s around
    the store. Other dtypes keep the intrinsic (float64 needs more terms, float16 computes
    through float32 libm; topi writes no ``sigmoid`` call for them), and so does a call whose
    argument could fault where the store would not evaluate it
    (:func:`kiln.tir.speculation.may_trap`): the code generators compute ``sigmoid`` as
    ``1 / (1 + exp(-x))``."""
    body = L.map_stmt(func.body, lambda e: e, _store_rewriter())
    return L.PrimFunc(func.name, func.params, body, dict(func.attrs))


def fences_under_adds(e: L.PrimExpr) -> L.PrimExpr:
    """``e`` with each ``fence`` kept only where a float add or subtract takes it (where an FMA
    could form; elsewhere it only stands in LLVM's way: fenced arguments of FastExp's
    polynomials lost their FMAs to the SLP vectorizer)."""
    def mark(x: L.PrimExpr) -> L.PrimExpr:
        if not (isinstance(x, L.Binary) and x.op in ("+", "-") and L.is_float(x.dtype)):
            return x
        a, b = (L.Call(_KEPT, o.args, o.dtype) if isinstance(o, L.Call) and o.name == "fence"
                else o for o in (x.a, x.b))
        return x if (a is x.a and b is x.b) else L.Binary(x.op, a, b)

    def strip(x: L.PrimExpr) -> L.PrimExpr:
        if isinstance(x, L.Call) and x.name == "fence":
            return x.args[0]
        return L.Call("fence", x.args, x.dtype) if isinstance(x, L.Call) and x.name == _KEPT \
            else x

    return L.map_expr(L.map_expr(e, mark), strip)


_KEPT = "kiln.fence_kept"  # a marker between the two rewrites of fences_under_adds


def _store_rewriter():
    def rewrite(s: L.Stmt) -> L.Stmt:
        if not isinstance(s, L.BufferStore):
            return s
        fenced = fences_under_adds(s.value)
        if fenced is not s.value:
            s = L.BufferStore(s.buffer, fenced, s.indices)
        eager = eager_loads(s.value)
        lets: list[Binding] = []

        def visit(e: L.PrimExpr) -> L.PrimExpr:
            if (not (isinstance(e, L.Call) and e.name in EXPANSIONS and e.dtype == F32)
                    or may_trap(e.args[0], eager)):
                return e
            bindings, result = EXPANSIONS[e.name](e.args[0])
            lets.extend(bindings)
            return result

        value = L.map_expr(s.value, visit)
        if value is s.value:
            return s
        out: L.Stmt = L.BufferStore(s.buffer, value, s.indices)
        for var, bound in reversed(lets):
            out = L.LetStmt(var, bound, out)
        return out

    return rewrite
