"""float32 ``sigmoid`` and ``tanh`` as rational functions in straight-line loop-IR arithmetic,
the ones onnxruntime's MLAS computes (docs/decisions/060).

Both are Eigen's rational approximations, which MLAS took over (onnxruntime
``core/mlas/lib/logistic.cpp`` and ``tanh.cpp`` hold the coefficients,
``lib/x86_64/LogisticKernelFma3.S`` and ``TanhKernelFma3.S`` the order of evaluation):

- ``sigmoid(x)``: ``x`` clamped to [-18, 18], ``p = x · P(x²)`` (odd, degree 9),
  ``q = Q(x²)`` (even, degree 10), ``max(p / q + 0.5, 0)``;
- ``tanh(x)``: ``x`` clamped to [-9, 9], ``(x · P(x²)) / Q(x²)``, degrees 13 and 6.

``P`` and ``Q`` by Horner's rule, each step ``acc · x² + c``: with FMA contraction (the LLVM
``contract`` flag, GCC's ``-ffp-contract=fast``) on a CPU with FMA each step is one fused
multiply-add, as in MLAS's FMA3 kernels, and the results equal onnxruntime's bit for bit
(``tests/backend/tir/test_fast_activations_compiled.py`` checks that over millions of inputs).
Without FMA they are MLAS's SSE2 kernels' multiply-then-add.

Why not ``1 / (1 + exp(-x))`` and libm's ``tanhf``: a quantized model that quantizes
activations at run time (``DynamicQuantizeLinear`` after a SiLU, ``quantize_dynamic``'s) rounds
``x / scale`` to integers, and a one-ulp difference in an activation moves the range's scale and
a rounding boundary; the difference then grows layer by layer (ddddocr's OCR model: 0.15 off in
logits of 17). ``tanhf`` is also a libm call per element that nothing vectorizes.

Accuracy: absolute error at most 2.0e-7 (sigmoid) and 3.6e-7 (tanh) over float32; the relative
error of sigmoid below x ≈ -16, where the value is under 1e-7, is large (0 at x ≤ -17), as
onnxruntime's. NaN in, NaN out; ±inf give the values at the clamp points (sigmoid 1 and 0,
tanh ±1).

The clamp is an integer min of the bit pattern and the NaN is or-ed back at the end
(:mod:`kiln.tir.transform.float_bits`), as in :mod:`kiln.tir.transform.fast_exp`.
"""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir.transform.float_bits import Binding, Lets, clamp_bits, or_nan

F32, I32 = "float32", "int32"

#: MLAS's MlasLogisticConstants: the clamp, P's coefficients from x^9 down, Q's from x^10 down
SIGMOID_RANGE = 18.0
SIGMOID_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
             8.51377133304701e-03, 2.48287947061529e-01)
SIGMOID_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
             1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)
#: MLAS's MlasTanhConstants: the clamp, P from x^13 down, Q from x^6 down
TANH_RANGE = 9.0
TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
          5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
          4.89352455891786e-03)
TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
          4.89352518554385e-03)

def _f(value: float) -> L.PrimExpr:
    return L.FloatImm(value, F32)


def _horner(coefficients: tuple[float, ...], x2: L.PrimExpr) -> L.PrimExpr:
    """``c0 · x2^(n-1) + ... + c(n-1)``: ``x2 · c0 + c1`` first, as MLAS's kernels start."""
    acc = x2 * _f(coefficients[0]) + _f(coefficients[1])
    for c in coefficients[2:]:
        acc = acc * x2 + _f(c)
    return acc


def _clamped(lets: Lets, x: L.PrimExpr, bound: float) -> tuple[L.Var, L.Var]:
    """``(bits of x, x clamped to [-bound, bound])``, both bound."""
    xi = lets("xi", L.reinterpret(lets("x", x), I32))
    return xi, lets("xc", clamp_bits(xi, -bound, bound))


def fast_sigmoid(x: L.PrimExpr) -> tuple[list[Binding], L.PrimExpr]:
    """``1 / (1 + e^-x)`` for float32 ``x`` as MLAS computes it (module doc); the bindings to
    make first (``LetStmt``s, in order) and the result over them."""
    assert x.dtype == F32, f"fast_sigmoid: float32 only, got {x.dtype}"
    lets = Lets("sigmoid")
    xi, xc = _clamped(lets, x, SIGMOID_RANGE)
    x2 = lets("x2", xc * xc)
    r = lets("r", xc * _horner(SIGMOID_P, x2) / _horner(SIGMOID_Q, x2) + _f(0.5))
    # max(r, 0) as a signed max of the bits: a negative float's pattern is a negative integer
    # (r >= -6e-8 is never a NaN here)
    return lets.bindings, or_nan(xi, L.maximum(L.reinterpret(r, I32), L.IntImm(0, I32)))


def fast_tanh(x: L.PrimExpr) -> tuple[list[Binding], L.PrimExpr]:
    """``tanh(x)`` for float32 ``x`` as MLAS computes it (module doc); the bindings to make
    first and the result over them."""
    assert x.dtype == F32, f"fast_tanh: float32 only, got {x.dtype}"
    lets = Lets("tanh")
    xi, xc = _clamped(lets, x, TANH_RANGE)
    x2 = lets("x2", xc * xc)
    t = xc * _horner(TANH_P, x2) / _horner(TANH_Q, x2)
    return lets.bindings, or_nan(xi, L.reinterpret(t, I32))
