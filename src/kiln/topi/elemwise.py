"""Elementwise and broadcast computes: unary math, activations, cast, reinterpret, binary
arithmetic, where (comparisons: :mod:`kiln.topi.logical`)."""

from __future__ import annotations

from collections.abc import Callable

from kiln.errors import CompileError
from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.broadcast import broadcast_load
from kiln.topi.registry import register_compute


def _unary(op: str, fn: Callable[[L.PrimExpr, dict], L.PrimExpr]) -> None:
    tag = op.replace("nn.", "")

    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """Compute of a unary graph op ``op``: ``out[i] = fn(x[i], attrs)``, one element each.

        The ops and their formulas (ONNX's operators of the same name): ``nn.relu`` max(x, 0);
        ``negative``; ``abs`` (fabs for floats); ``clip`` min(max(x, a_min), a_max); ``hardsigmoid``
        max(min(alpha·x + beta, 1), 0); ``hardswish`` x · hardsigmoid(x; 1/6, 1/2); ``leaky_relu``
        x < 0 ? alpha·x : x; ``sigmoid`` 1 / (1 + exp(-x)); ``cast``; ``round`` (nearbyint: half
        to even); ``reinterpret`` (ONNX BitCast); ``sign``; ``erf`` (float32: the rational fit
        ERF_P / ERF_Q); and the libm functions exp, log, sqrt, tanh, floor, ceil, sin ... atanh.

        Parameters
        ----------
        x : te.Tensor
            Any shape and layout; float for sigmoid, round, erf and the libm functions.
        a_min, a_max : float
            attrs of ``clip``: the bounds, in x's units.
        alpha, beta : float
            attrs of ``hardsigmoid`` (slope, offset) and ``leaky_relu`` (``alpha``: the slope of
            negative inputs).
        dtype : str
            attrs of ``cast`` (to bool: x != 0) and ``reinterpret`` (same width as x's).

        Returns
        -------
        te.Tensor
            x's shape, x's dtype (``cast``, ``reinterpret``: ``dtype``); tag ``elemwise``.

        Raises
        ------
        CompileError
            A float-only op (sigmoid, round, erf, exp, log, ...) on a non-float tensor.
        """
        (x,) = inputs
        return te.compute(x.shape, lambda *i: fn(x[i], attrs), name=tag, tag="elemwise")


def _float_only(op: str, fn: Callable[[L.PrimExpr], L.PrimExpr]):
    def checked(v: L.PrimExpr, attrs: dict) -> L.PrimExpr:
        if not L.is_float(v.dtype):
            raise CompileError(f"{op}: needs a float tensor, got {v.dtype}")
        return fn(v)

    return checked


def _hardsigmoid(v: L.PrimExpr, alpha: float, beta: float) -> L.PrimExpr:
    return L.maximum(L.minimum(v * alpha + beta, 1.0), 0.0)


def _abs(v: L.PrimExpr, attrs: dict) -> L.PrimExpr:
    if L.is_float(v.dtype):
        return L.call("fabs", v)
    return L.Select(v < 0, -v, v)


def _cast(v: L.PrimExpr, attrs: dict) -> L.PrimExpr:
    dtype = attrs["dtype"]
    if dtype == "bool":
        return L.Select(L.ne(v, L.const(0, v.dtype)), L.IntImm(1, "bool"), L.IntImm(0, "bool"))
    if v.dtype == dtype:
        return v
    return L.Cast(dtype, v)


_unary("nn.relu", lambda v, a: L.maximum(v, L.const(0, v.dtype)))
_unary("negative", lambda v, a: -v)
_unary("abs", _abs)
_unary("clip", lambda v, a: L.minimum(L.maximum(v, L.const(a["a_min"], v.dtype)),
                                      L.const(a["a_max"], v.dtype)))
_unary("hardsigmoid", lambda v, a: _hardsigmoid(v, a["alpha"], a["beta"]))
_unary("hardswish", lambda v, a: v * _hardsigmoid(v, 1.0 / 6.0, 0.5))
_unary("leaky_relu", lambda v, a: L.Select(v < 0.0, v * a["alpha"], v))
_unary("sigmoid", _float_only("sigmoid", lambda v: L.call("sigmoid", v) if v.dtype == "float32"
                               else 1.0 / (1.0 + L.call("exp", -v))))
_unary("cast", _cast)
_unary("round", _float_only("round", lambda v: L.call("nearbyint", v)))
_unary("reinterpret", lambda v, a: L.reinterpret(v, a["dtype"]))
for _name in ("exp", "log", "sqrt", "tanh", "floor", "ceil", "sin", "cos", "tan", "asin", "acos",
              "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    _unary(_name, _float_only(_name, lambda v, n=_name: L.call(n, v)))
_unary("sign", lambda v, a: L.Select(v > L.const(0, v.dtype), L.const(1, v.dtype),
                                     L.Select(v < L.const(0, v.dtype), L.const(-1, v.dtype),
                                              L.const(0, v.dtype))))


def _trunc_mod(a: L.PrimExpr, b: L.PrimExpr) -> L.PrimExpr:
    if L.is_float(a.dtype):
        return L.call("fmod", a, b)
    return a - (a / b) * b  # "/" on integers truncates toward zero


def _floor_mod(a: L.PrimExpr, b: L.PrimExpr) -> L.PrimExpr:
    if not L.is_float(a.dtype):
        return a % b  # the loop IR's % on integers is the floor modulo
    # numpy's float mod: fmod, moved into the divisor's sign (inf and nan as numpy gives them).
    r = L.call("fmod", a, b)
    zero = L.const(0, a.dtype)
    wrong_sign = L.logical_and(L.ne(r, zero), L.ne(r < zero, b < zero))
    return L.Select(wrong_sign, r + b, r)


def _power(a: L.PrimExpr, b: L.PrimExpr) -> L.PrimExpr:
    if L.is_float(a.dtype):
        return L.call("pow", a, b)
    # Integer powers (ONNX Pow on int32/int64) through double, exact for the results that fit.
    return L.Cast(a.dtype, L.call("pow", L.Cast("float64", a), L.Cast("float64", b)))

#: erf(x) ≈ x · P(x²) / Q(x²) on [-4, 4], coefficients from lowest degree: a weighted
#: least-squares rational fit made for Kiln (numpy, float64, rounded to float32). Max abs error
#: 4e-7 over [-4.5, 4.5] evaluated in float32 (libm's erff: ~6e-8); beyond ±4, erf is 1 to
#: float32 precision and x is clamped.
ERF_P = (1.1283791065216064, 0.18576297163963318, 0.05216521397233009, 0.003578843316063285,
         0.0002827112330123782, 2.1090663722134195e-06)
ERF_Q = (1.0, 0.49796128273010254, 0.11221852898597717, 0.01458844356238842,
         0.0011213732650503516, 3.859757271129638e-05)


def _horner(coeffs: tuple[float, ...], x: L.PrimExpr) -> L.PrimExpr:
    acc: L.PrimExpr = L.const(coeffs[-1], x.dtype)
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def _erf(v: L.PrimExpr) -> L.PrimExpr:
    """float32: the rational approximation above, plain arithmetic that vectorizes (GELU runs
    it per activation; libm's erff is a scalar call, ~12 % of MiniLM-L3); float64: libm."""
    if v.dtype != "float32":
        return L.call("erf", v)
    x = L.minimum(L.maximum(v, L.const(-4.0, v.dtype)), L.const(4.0, v.dtype))
    x2 = x * x
    approx = x * _horner(ERF_P, x2) / _horner(ERF_Q, x2)
    # |erf| <= 1 (the fit overshoots by an ulp near ±4); NaN stays NaN (the clamp gives -1).
    bounded = L.minimum(L.maximum(approx, L.const(-1.0, v.dtype)), L.const(1.0, v.dtype))
    return L.Select(L.ne(v, v), v, bounded)


_unary("erf", _float_only("erf", _erf))


def _rounded_product(p: L.PrimExpr) -> L.PrimExpr:
    """A float product rounded before an add uses it (the loop IR's ``fence``; FastExp keeps
    it only where an add or subtract takes it): ONNX's Mul then Add are two roundings, and an
    FMA of them (a product by a quantization scale, then a residual add) moves the values of
    dynamically quantized models off onnxruntime's (decision 060)."""
    return L.call("fence", p) if L.is_float(p.dtype) else p


_BINARY: dict[str, Callable[[L.PrimExpr, L.PrimExpr], L.PrimExpr]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: _rounded_product(a * b),
    "divide": lambda a, b: a / b,
    "maximum": L.maximum,
    "minimum": L.minimum,
    "power": _power,
    "mod": _trunc_mod,
    "floor_mod": lambda a, b: _floor_mod(a, b),
}


def _binary(op: str, fn: Callable[[L.PrimExpr, L.PrimExpr], L.PrimExpr]) -> None:
    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """Compute of a broadcasting binary op ``op``: ``out[i] = fn(a[i], b[i])`` (numpy rule).

        add, subtract, multiply, divide (integers: truncated toward zero, as C), maximum, minimum,
        power (integers through float64 ``pow``), ``mod`` (the remainder with the dividend's sign:
        C's ``%`` / ``fmod``; ONNX Mod fmod=1) and ``floor_mod`` (the divisor's sign, as numpy's
        ``%``; ONNX Mod fmod=0).

        Parameters
        ----------
        a, b : te.Tensor
            Of one dtype, shapes broadcastable to each other (:func:`broadcast_load`).

        Returns
        -------
        te.Tensor
            ``broadcast_shapes(a.shape, b.shape)`` (``out_type.shape``), a's dtype; tag
            ``broadcast``.
        """
        a, b = inputs
        return te.compute(out_type.shape,
                          lambda *i: fn(broadcast_load(a, i), broadcast_load(b, i)),
                          name=op, tag="broadcast")


for _name, _fn in _BINARY.items():
    _binary(_name, _fn)



@register_compute("nn.bias_add")
def bias_add(inputs, attrs, out_type):
    """``nn.bias_add``: ``out[i] = x[i] + bias[i[axis]]`` (TVM's ``topi.nn.bias_add``).

    Parameters
    ----------
    x : te.Tensor
        Any rank (NCHW activations: ``axis`` 1).
    bias : te.Tensor
        1-D, ``[x.shape[axis]]``, x's dtype.
    axis : int
        attrs: the axis of x the bias runs along (negative: from the end).

    Returns
    -------
    te.Tensor
        x's shape and dtype; tag ``broadcast``.
    """
    x, b = inputs
    axis = attrs["axis"] % len(x.shape)
    return te.compute(x.shape, lambda *i: x[i] + b[i[axis]], name="bias_add", tag="broadcast")


@register_compute("where")
def where(inputs, attrs, out_type):
    """ONNX Where: ``out[i] = cond[i] ? x[i] : y[i]``, all three broadcast (numpy rule).

    Parameters
    ----------
    cond : te.Tensor
        bool, broadcastable to the output.
    x, y : te.Tensor
        Of one dtype, broadcastable to the output.

    Returns
    -------
    te.Tensor
        ``broadcast_shapes(cond.shape, x.shape, y.shape)`` (``out_type.shape``), x's dtype;
        tag ``broadcast``.
    """
    cond, x, y = inputs

    def body(*i):
        c = broadcast_load(cond, i)
        return L.Select(L.ne(c, L.const(0, c.dtype)), broadcast_load(x, i), broadcast_load(y, i))

    return te.compute(out_type.shape, body, name="where", tag="broadcast")
