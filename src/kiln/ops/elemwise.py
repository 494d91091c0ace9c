"""Elementwise and broadcast computes: unary math, activations, cast, binary arithmetic, where."""

from __future__ import annotations

from collections.abc import Callable

from kiln.errors import CompileError
from kiln.ir import loop as L
from kiln.ir import te
from kiln.ir.op_registry import register_compute
from kiln.ops.broadcast import broadcast_load


def _unary(op: str, fn: Callable[[L.PrimExpr, dict], L.PrimExpr]) -> None:
    tag = op.replace("nn.", "")

    @register_compute(op)
    def _compute(inputs, attrs, out_type):
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
_unary("sigmoid", _float_only("sigmoid", lambda v: 1.0 / (1.0 + L.call("exp", -v))))
_unary("cast", _cast)
_unary("reinterpret", lambda v, a: L.reinterpret(v, a["dtype"]))
for _name in ("exp", "log", "sqrt", "tanh", "erf", "floor", "ceil", "sin", "cos", "tan", "asin",
              "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    _unary(_name, _float_only(_name, lambda v, n=_name: L.call(n, v)))
_unary("round", _float_only("round", lambda v: L.call("rint", v)))
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


_BINARY: dict[str, Callable[[L.PrimExpr, L.PrimExpr], L.PrimExpr]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
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
        a, b = inputs
        return te.compute(out_type.shape,
                          lambda *i: fn(broadcast_load(a, i), broadcast_load(b, i)),
                          name=op, tag="broadcast")


for _name, _fn in _BINARY.items():
    _binary(_name, _fn)


@register_compute("nn.bias_add")
def bias_add(inputs, attrs, out_type):
    x, b = inputs
    axis = attrs["axis"] % len(x.shape)
    return te.compute(x.shape, lambda *i: x[i] + b[i[axis]], name="bias_add", tag="broadcast")


@register_compute("where")
def where(inputs, attrs, out_type):
    cond, x, y = inputs

    def body(*i):
        c = broadcast_load(cond, i)
        return L.Select(L.ne(c, L.const(0, c.dtype)), broadcast_load(x, i), broadcast_load(y, i))

    return te.compute(out_type.shape, body, name="where", tag="broadcast")
