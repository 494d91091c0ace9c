"""What a converter sees of one ONNX node: its inputs as graph-IR Exprs, its attributes, the
opset, and helpers to emit calls, read compile-time-constant inputs and report errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.arith import Dim, SymbolicValueError, SymExpr, UndecidedError
from kiln.errors import ShapeError, UnsupportedOpError
from kiln.frontend.onnx.arange_values import element
from kiln.relay.graph import Call, Constant, Expr, Function, Var, post_order, symbolic_array
from kiln.relay.interpreter import evaluate

_REQUIRED = object()

#: the most elements a value read through an arange may have (a shape, a Range bound)
MAX_SHAPE_VALUE = 8


class NotConstantError(UnsupportedOpError):
    """A converter needs the value of an input at compile time (a shape, axes, pads, k) but it
    depends on graph inputs.

    Attributes
    ----------
    inputs : tuple[str, ...]
        The graph inputs the value depends on. A caller that knows their values (the ONNX
        backend, at run time) may bind them as initializers and import again.
    """

    def __init__(self, message: str, inputs: tuple[str, ...]):
        super().__init__(message)
        self.inputs = inputs


#: Whether converters that need a value at compile time (Reshape's shape, TopK's k, Range's
#: bounds...) make a data-dependent op when it is data (decision 016); False: they raise
#: NotConstantError, so the ONNX backend binds the inputs it names instead.
DATA_DEPENDENT_SHAPES: ContextVar[bool] = ContextVar("kiln_data_dependent_shapes", default=True)


@contextmanager
def static_values_only() -> Iterator[None]:
    """Within it, converters raise :class:`NotConstantError` where a value they need at
    compile time is data, instead of making the op data-dependent (NonZero, Unique and
    NonMaxSuppression, data-dependent by nature, are not affected)."""
    token = DATA_DEPENDENT_SHAPES.set(False)
    try:
        yield
    finally:
        DATA_DEPENDENT_SHAPES.reset(token)


# The element types Kiln compiles (its code generators' scalar types). ONNX's others (bfloat16,
# float8, int4, strings...) are rejected at import with an UnsupportedOpError.
SUPPORTED_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                    "uint64", "float16", "float32", "float64")


def onnx_dtype(elem_type: int, where: str) -> str:
    """The numpy dtype name of ONNX ``TensorProto`` element type ``elem_type``.

    Raises UnsupportedOpError (naming ``where``) for a type outside :data:`SUPPORTED_DTYPES`.
    """
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.name not in SUPPORTED_DTYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in \
            onnx.TensorProto.DataType.values() else str(elem_type)
        raise UnsupportedOpError(f"{where}: element type {name} is not supported")
    return dtype.name


class ConvertContext:
    """One node being converted.

    Attributes
    ----------
    node : onnx.NodeProto
    opset : int
        The model's default-domain opset.
    name : str
        The node's name (or a stand-in built from its first output when it has none).
    inputs : list[Expr | None]
        One entry per ONNX input; None for an omitted optional input ("").
    """

    def __init__(self, node: onnx.NodeProto, name: str, opset: int, inputs: list[Expr | None],
                 param_values: dict[str, np.ndarray]):
        self.node = node
        self.name = name
        self.opset = opset
        self.inputs = inputs
        self._params = param_values
        self._attrs = {a.name: a for a in node.attribute}

    # -- errors -----------------------------------------------------------------------------

    def unsupported(self, reason: str) -> UnsupportedOpError:
        """An UnsupportedOpError naming this node's op type, name and opset, with ``reason``."""
        return UnsupportedOpError(
            f"ONNX {self.node.op_type} (node '{self.name}', opset {self.opset}): {reason}")

    def axis(self, axis: int, ndim: int) -> int:
        """ONNX ``axis`` (negative counts from the end) as a non-negative int.

        Raises
        ------
        UnsupportedOpError
            If it is outside ``[-ndim, ndim)``.
        """
        if not -ndim <= axis < ndim:
            raise self.unsupported(f"axis {axis} out of range for rank {ndim}")
        return axis % ndim

    def axes(self, axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
        """ONNX ``axes`` as sorted non-negative ints.

        Raises
        ------
        UnsupportedOpError
            If one is outside ``[-ndim, ndim)`` or one repeats.
        """
        out = [self.axis(a, ndim) for a in axes]
        if len(set(out)) != len(out):
            raise self.unsupported(f"repeated axes {axes}")
        return tuple(sorted(out))

    # -- attributes -------------------------------------------------------------------------

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        """Attribute ``name`` as a Python value (str, int, float, list, or np.ndarray).

        A missing attribute returns ``default``; without a default it raises
        UnsupportedOpError.
        """
        proto = self._attrs.get(name)
        if proto is None:
            if default is _REQUIRED:
                raise self.unsupported(f"missing required attribute '{name}'")
            return default
        if proto.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(proto.t)
        if proto.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS,
                          onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.TENSORS):
            raise self.unsupported(f"attribute '{name}' of kind "
                                   f"{onnx.AttributeProto.AttributeType.Name(proto.type)}")
        value = helper.get_attribute_value(proto)
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, list):
            return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
        return value

    def ints(self, name: str, default: Sequence[int] | None = None) -> tuple[int, ...] | None:
        """An ints attribute as a tuple (``default`` if absent)."""
        value = self.attr(name, None)
        if value is None:
            return None if default is None else tuple(default)
        return tuple(int(v) for v in value)

    # -- inputs -----------------------------------------------------------------------------

    def input(self, index: int) -> Expr:
        """Required input ``index``; a missing one raises UnsupportedOpError."""
        expr = self.optional_input(index)
        if expr is None:
            raise self.unsupported(f"input {index} is required")
        return expr

    def optional_input(self, index: int) -> Expr | None:
        """Input ``index``, or None when it is omitted."""
        return self.inputs[index] if index < len(self.inputs) else None

    def const_value(self, index_or_expr: int | Expr, what: str) -> np.ndarray:
        """The value of an input that must be a compile-time constant (a shape, axes, bounds).

        The input's subexpression is evaluated with the graph interpreter when all its leaves
        are constants or initializers; otherwise :class:`NotConstantError` (an
        UnsupportedOpError) names ``what`` and the graph inputs it depends on.
        """
        expr = (self.input(index_or_expr) if isinstance(index_or_expr, int) else index_or_expr)
        try:
            return self._folded(expr, what)
        except SymbolicValueError as err:  # values over a symbolic extent (a Range's output)
            try:
                return self._arange_values(expr, what)
            except SymbolicValueError:
                raise NotConstantError(f"{self.unsupported(what)}: {err}", ()) from None
        except UndecidedError as err:  # a comparison of symbolic dims (If on Shape(x)[2] == 1)
            raise NotConstantError(f"{self.unsupported(what)}: {err}", ()) from None

    def _folded(self, expr: Expr, what: str) -> np.ndarray:
        """``expr`` evaluated by the graph interpreter; NotConstantError when it depends on
        graph inputs, the interpreter's SymbolicValueError / UndecidedError as they are."""
        if isinstance(expr, Constant):
            return expr.data
        if isinstance(expr, Var) and expr.name in self._params:
            return self._params[expr.name]
        leaves = [n for n in post_order([expr]) if isinstance(n, Var)]
        missing = tuple(leaf.name for leaf in leaves if leaf.name not in self._params)
        if missing:
            err = self.unsupported(f"{what} must be a compile-time constant, but it depends on "
                                   f"graph input(s) {', '.join(repr(m) for m in missing)}")
            raise NotConstantError(str(err), missing)
        values = {leaf.name: self._params[leaf.name] for leaf in leaves}
        return evaluate(Function(leaves, [expr]), values)[0]

    def _arange_values(self, expr: Expr, what: str) -> np.ndarray:
        """A short value read element by element through the aranges inside it
        (:mod:`kiln.frontend.onnx.arange_values`): ints and symbolic dims; SymbolicValueError
        when it is not such shape arithmetic."""
        t = expr.checked_type
        if not isinstance(t.size, int) or t.size > MAX_SHAPE_VALUE:
            raise SymbolicValueError(f"{t} is not a short shape value")
        values = [element(expr, k, lambda e: self._folded(e, what)) for k in range(t.size)]
        if any(isinstance(v, SymExpr) for v in values):
            return symbolic_array(values).reshape(t.shape)
        return np.array(values, dtype=t.dtype).reshape(t.shape)

    def const_ints(self, index: int, what: str) -> tuple[int, ...]:
        """A constant integer input as a tuple of Python ints (a scalar gives one entry).

        Raises ShapeError when the value depends on symbolic dims (fixing the input shapes
        makes it static; :meth:`const_dims` is for values where a symbolic dim makes sense, e.g.
        a shape)."""
        dims = self.const_dims(index, what)
        symbolic = [d for d in dims if not isinstance(d, int)]
        if symbolic:
            # (the importer prefixes the op, its node and the opset)
            raise ShapeError(f"{what} must be static, but it depends on symbolic dim(s) "
                             f"{', '.join(map(str, symbolic))}; fix the input shapes")
        return dims  # type: ignore[return-value]

    def const_dims(self, index: int, what: str) -> tuple[Dim, ...]:
        """A constant integer input whose entries may be symbolic dims (the result of ``Shape``
        on a symbolic input and arithmetic on it): ints and :mod:`kiln.arith` expressions."""
        value = self.const_value(index, what)
        if value.dtype == object:
            return tuple(value.reshape(-1).tolist())
        if value.dtype.kind not in "iu":
            raise self.unsupported(f"{what} must be integers, got {value.dtype}")
        return tuple(int(v) for v in value.reshape(-1))

    def is_constant(self, expr: Expr) -> bool:
        """Whether ``expr`` is a Constant or an initializer (a weight the frontend knows)."""
        return isinstance(expr, Constant) or (isinstance(expr, Var) and expr.name in self._params)

    def folds_to_constant(self, expr: Expr) -> bool:
        """Whether every leaf of ``expr`` is a Constant or an initializer, so that FoldConstant
        makes it a constant (e.g. a weight dequantized by Cast → Mul)."""
        return all(self.is_constant(n) for n in post_order([expr])
                   if isinstance(n, (Var, Constant)))

    # -- building ---------------------------------------------------------------------------

    def call(self, op: str, args: list[Expr], **attrs: Any) -> Call:
        """Emit graph op ``op`` on ``args`` (the node name is kept as the call's span)."""
        return Call(op, args, attrs, span=self.name)

    def scalar(self, value: float, dtype: str) -> Constant:
        """A rank-0 constant of ``dtype``."""
        return Constant(np.array(value, dtype=dtype))

    def reshape(self, x: Expr, newshape: Sequence[Dim]) -> Expr:
        """``reshape`` to ``newshape`` (ints or symbolic dims), or ``x`` itself when the shape
        does not change."""
        newshape = tuple(d if isinstance(d, SymExpr) else int(d) for d in newshape)
        if newshape == x.checked_type.shape:
            return x
        return self.call("reshape", [x], newshape=newshape)

    def fold(self, fn: Callable[[Expr, Expr], Expr], exprs: list[Expr]) -> Expr:
        """Left fold of a binary builder over ``exprs`` (variadic Sum, Max, Concat chains)."""
        acc = exprs[0]
        for e in exprs[1:]:
            acc = fn(acc, e)
        return acc
