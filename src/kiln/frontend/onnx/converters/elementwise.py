"""Converters of elementwise ONNX ops: activations (Gelu as erf/tanh arithmetic), unary math,
binary and variadic arithmetic, Clip, Cast, Equal, Where."""

from __future__ import annotations

import numpy as np

from kiln.arith import SymExpr
from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.context import ConvertContext, onnx_dtype
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr

_UNARY = {
    "Relu": "nn.relu",
    "Sigmoid": "sigmoid",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Tanh": "tanh",
    "Erf": "erf",
    "Neg": "negative",
    "Abs": "abs",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "HardSwish": "hardswish",
}


def _unary(op: str):
    def convert(ctx: ConvertContext) -> Expr:
        return ctx.call(op, [ctx.input(0)])

    return convert


for _onnx, _op in _UNARY.items():
    onnx_op(_onnx, since={"HardSwish": 14, "Round": 11}.get(_onnx, 1))(_unary(_op))


@onnx_op("LeakyRelu", since=1)
def leaky_relu(ctx: ConvertContext) -> Expr:
    return ctx.call("leaky_relu", [ctx.input(0)], alpha=float(ctx.attr("alpha", 0.01)))


@onnx_op("Gelu", since=20)
def gelu(ctx: ConvertContext) -> Expr:
    """``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"``
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` (the ONNX Gelu-20 definitions)."""
    x = ctx.input(0)
    dtype = x.checked_type.dtype
    approximate = ctx.attr("approximate", "none")
    if approximate == "none":
        inner = ctx.call("erf", [ctx.call("multiply", [x, ctx.scalar(1 / np.sqrt(2), dtype)])])
    elif approximate == "tanh":
        cube = ctx.call("multiply", [ctx.call("multiply", [x, x]), x])
        poly = ctx.call("add", [x, ctx.call("multiply", [cube, ctx.scalar(0.044715, dtype)])])
        inner = ctx.call("tanh", [ctx.call("multiply",
                                           [poly, ctx.scalar(np.sqrt(2 / np.pi), dtype)])])
    else:
        raise ctx.unsupported(f"approximate={approximate!r}")
    half_x = ctx.call("multiply", [x, ctx.scalar(0.5, dtype)])
    return ctx.call("multiply", [half_x, ctx.call("add", [inner, ctx.scalar(1.0, dtype)])])


@onnx_op("HardSigmoid", since=1)
def hard_sigmoid(ctx: ConvertContext) -> Expr:
    return ctx.call("hardsigmoid", [ctx.input(0)], alpha=float(ctx.attr("alpha", 0.2)),
                    beta=float(ctx.attr("beta", 0.5)))


def _dtype_bounds(dtype: str) -> tuple[float, float]:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return -np.inf, np.inf
    info = np.iinfo(dt)
    return float(info.min), float(info.max)


@onnx_op("Clip", since=1)
def clip_v1(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    lo, hi = _dtype_bounds(x.checked_type.dtype)
    return ctx.call("clip", [x], a_min=float(ctx.attr("min", lo)), a_max=float(ctx.attr("max", hi)))


@onnx_op("Clip", since=11)
def clip_v11(ctx: ConvertContext) -> Expr:
    """Clip-11+: min and max are optional inputs; non-constant bounds become maximum/minimum."""
    x = ctx.input(0)
    lo, hi = _dtype_bounds(x.checked_type.dtype)
    bounds: list[float] = [lo, hi]
    tensor_bounds: list[tuple[str, Expr]] = []
    for k, op in ((1, "maximum"), (2, "minimum")):
        b = ctx.optional_input(k)
        if b is None:
            continue
        if ctx.is_constant(b) and b.checked_type.size == 1:
            bounds[k - 1] = float(ctx.const_value(b, "Clip bound").reshape(()))
        else:
            tensor_bounds.append((op, b))
    out = ctx.call("clip", [x], a_min=bounds[0], a_max=bounds[1])
    for op, b in tensor_bounds:
        out = ctx.call(op, [out, b])
    return out


_BINARY = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Div": "divide",
}


def binary_converter(op: str):
    """A converter of a two-input broadcasting ONNX op (opset 7+) to graph op ``op``."""

    def convert(ctx: ConvertContext) -> Expr:
        if ctx.has_attr("broadcast") or ctx.has_attr("axis"):
            raise ctx.unsupported("legacy 'broadcast'/'axis' attributes")
        return ctx.call(op, [ctx.input(0), ctx.input(1)])

    return convert


for _onnx, _op in _BINARY.items():
    onnx_op(_onnx, since=7)(binary_converter(_op))


@onnx_op("Pow", since=7)
def power(ctx: ConvertContext) -> Expr:
    """``x ** y``; a float ``x`` to a constant 2 or 3 is ``x * x`` or ``(x * x) * x``, as
    onnxruntime computes it (its Pow kernel squares and cubes those; bit for bit, and a
    vectorized product instead of a libm ``powf`` per element: GELU's tanh form cubes every
    activation)."""
    base, exponent = ctx.input(0), ctx.input(1)
    dtype = base.checked_type.dtype
    times = _square_or_cube(ctx, base, exponent)
    if times:
        square = ctx.call("multiply", [base, base])
        return square if times == 2 else ctx.call("multiply", [square, base])
    if exponent.checked_type.dtype != dtype:  # Pow-12+: the exponent may have another type
        exponent = ctx.call("cast", [exponent], dtype=dtype)
    return ctx.call("power", [base, exponent])


def _square_or_cube(ctx: ConvertContext, base: Expr, exponent: Expr) -> int:
    """2 or 3 for a float ``base`` and a constant one-element ``exponent`` of that value that
    broadcasts to ``base``'s shape, else 0."""
    t = exponent.checked_type
    if (np.dtype(base.checked_type.dtype).kind != "f" or t.size != 1
            or t.ndim > base.checked_type.ndim or not ctx.folds_to_constant(exponent)):
        return 0
    value = np.asarray(ctx.const_value(exponent, "Pow exponent")).reshape(-1)[0]
    if isinstance(value, SymExpr) or float(value) not in (2.0, 3.0):  # (a shape value)
        return 0
    return int(value)


def _variadic(op: str):
    def convert(ctx: ConvertContext) -> Expr:
        args = [ctx.input(k) for k in range(len(ctx.inputs))]
        if not args:
            raise ctx.unsupported("needs at least one input")
        return ctx.fold(lambda a, b: ctx.call(op, [a, b]), args)

    return convert


onnx_op("Sum", since=6)(_variadic("add"))
onnx_op("Max", since=6)(_variadic("maximum"))
onnx_op("Min", since=6)(_variadic("minimum"))


@onnx_op("Mean", since=6)
def mean(ctx: ConvertContext) -> Expr:
    total = _variadic("add")(ctx)
    count = len(ctx.inputs)
    if count == 1:
        return total
    return ctx.call("divide", [total, ctx.scalar(count, total.checked_type.dtype)])


@onnx_op("Cast", since=6)
def cast(ctx: ConvertContext) -> Expr:
    x = ctx.input(0)
    try:
        dtype = onnx_dtype(int(ctx.attr("to")), "target")
    except UnsupportedOpError as err:
        raise ctx.unsupported(str(err)) from None
    if dtype == x.checked_type.dtype:
        return x
    return ctx.call("cast", [x], dtype=dtype)


@onnx_op("Where", since=9)
def where(ctx: ConvertContext) -> Expr:
    return ctx.call("where", [ctx.input(0), ctx.input(1), ctx.input(2)])


@onnx_op("CastLike", since=15)
def cast_like(ctx: ConvertContext) -> Expr:
    x, like = ctx.input(0), ctx.input(1)
    dtype = like.checked_type.dtype
    if dtype == x.checked_type.dtype:
        return x
    return ctx.call("cast", [x], dtype=dtype)


@onnx_op("BitCast", since=26)
def bit_cast(ctx: ConvertContext) -> Expr:
    """Reinterpret the bits; between integer types (and from bool) that is a plain cast."""
    x = ctx.input(0)
    try:
        dtype = onnx_dtype(int(ctx.attr("to")), "target")
    except UnsupportedOpError as err:
        raise ctx.unsupported(str(err)) from None
    src = np.dtype(x.checked_type.dtype)
    if src.itemsize != np.dtype(dtype).itemsize or dtype == "bool":
        raise ctx.unsupported(f"cannot reinterpret {src.name} as {dtype}")
    if dtype == src.name:
        return x
    if src.kind in "biu" and np.dtype(dtype).kind in "iu":
        return ctx.call("cast", [x], dtype=dtype)
    return ctx.call("reinterpret", [x], dtype=dtype)
