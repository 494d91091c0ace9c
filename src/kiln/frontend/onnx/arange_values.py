"""Shape values read out of an ``arange``: the positions a symbolic-length Range makes.

Funnel Transformer's relative positions are built as ``pos = float(arange(seq))``, then
``Range(len(pos) + pos[0] - pos[0], pos[0] - pos[-1] - 1, -1)``. The graph interpreter cannot
evaluate ``pos`` at compile time (its length is symbolic), so the outer Range's bounds looked
like data: it ran as a data-dependent op, and no relation about its count (``2·seq``) could be
proven. Its bounds are shape arithmetic all the same: element ``k`` of ``arange(start, delta)``
is ``start + k·delta``. :func:`element` evaluates one element of an expression through
``take`` at constant positions, 1-D slices and concatenations, ``cast``, ``+ - ·``,
``negative`` and ``reshape``, down to subexpressions the interpreter folds. Float values are
exact while they are integers (they are positions); an element that is not one is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import arith
from kiln.arith import Dim, SymbolicValueError, SymExpr
from kiln.relay.graph import Call, Expr

#: binary ops on two elements, by graph op name
_BINARY: dict[str, Callable[[Dim, Dim], Dim]] = {
    "add": arith.add, "subtract": arith.sub, "multiply": arith.mul}


def element(expr: Expr, k: Dim, fold: Callable[[Expr], np.ndarray]) -> Dim:
    """Element ``k`` (row-major; symbolic for a position counted from the end, ``count - 1``)
    of ``expr``, an int or a symbolic dim.

    ``fold`` evaluates a subexpression at compile time (the graph interpreter) or raises a
    ShapeError. Raises :class:`~kiln.arith.SymbolicValueError` when the element is not shape
    arithmetic of that kind (data, a division, a fraction, a position out of range)."""
    if isinstance(k, int):
        try:
            return _integral(fold(expr).reshape(-1)[k])
        except SymbolicValueError:
            pass  # (an arange over a symbolic count inside: read it element by element)
    if isinstance(expr, Call):
        read = _READERS.get(expr.op.name)
        if read is not None:
            return read(expr, k, fold)
    raise SymbolicValueError(f"element {k} of {expr.checked_type} is not shape arithmetic")


def _integral(v) -> Dim:
    if isinstance(v, SymExpr):
        return v
    if isinstance(v, (bool, np.bool_)) or not float(v).is_integer():
        raise SymbolicValueError(f"value {v!r} is not an integer position")
    return int(v)


def _cast(expr: Call, k: Dim, fold) -> Dim:
    if np.dtype(expr.checked_type.dtype).kind not in "iuf":
        raise SymbolicValueError(f"cast to {expr.checked_type.dtype}")
    return element(expr.args[0], k, fold)


def _operand_index(arg: Expr, out_shape: tuple, k: Dim) -> Dim:
    """The element of a broadcast operand that element ``k`` of the result reads: its own
    ``k`` when the shapes are equal, 0 when it has one element."""
    t = arg.checked_type
    if t.shape == out_shape:
        return k
    if t.size == 1:
        return 0
    raise SymbolicValueError(f"broadcast of {t} to {out_shape}")


def _binary(expr: Call, k: Dim, fold) -> Dim:
    a, b = (element(x, _operand_index(x, expr.checked_type.shape, k), fold) for x in expr.args)
    return _BINARY[expr.op.name](a, b)


def _negative(expr: Call, k: Dim, fold) -> Dim:
    return arith.mul(-1, element(expr.args[0], k, fold))


def _reshape(expr: Call, k: Dim, fold) -> Dim:
    return element(expr.args[0], k, fold)


def _take(expr: Call, k: Dim, fold) -> Dim:
    """``data[indices[k]]`` of a 1-D ``data``; a negative index counts from its end."""
    data, indices = expr.args
    if data.checked_type.ndim != 1 or not isinstance(k, int):
        raise SymbolicValueError(f"take from {data.checked_type}")
    extent = data.checked_type.shape[0]
    index = int(np.asarray(fold(indices)).reshape(-1)[k])
    position = arith.add(extent, index) if index < 0 else index
    if not (_provably_at_least(position, 0)
            and _provably_at_least(arith.sub(extent, position), 1)):
        raise SymbolicValueError(f"position {index} of {extent} elements may be out of range")
    return element(data, position, fold)


def _strided_slice(expr: Call, k: Dim, fold) -> Dim:
    """Element ``k`` of a 1-D slice reads ``begin + stride·k`` (normalized bounds)."""
    if expr.checked_type.ndim != 1:
        raise SymbolicValueError(f"slice of {expr.args[0].checked_type}")
    (begin,), (stride,) = expr.attrs["begin"], expr.attrs["strides"]
    return element(expr.args[0], arith.add(begin, arith.mul(stride, k)), fold)


def _concatenate(expr: Call, k: Dim, fold) -> Dim:
    """Element ``k`` of a 1-D concatenation: of the part it provably falls in."""
    if expr.checked_type.ndim != 1:
        raise SymbolicValueError(f"concatenation of {expr.checked_type}")
    for part in expr.args:
        extent = part.checked_type.shape[0]
        if _provably_at_least(arith.sub(extent, k), 1):
            return element(part, k, fold)
        if not _provably_at_least(arith.sub(k, extent), 0):
            break
        k = arith.sub(k, extent)
    raise SymbolicValueError(f"element {k} of {expr.checked_type} is in no one part")


def _provably_at_least(x: Dim, n: int) -> bool:
    lo = arith.bounds(x)[0]
    return lo is not None and lo >= n


def _arange(expr: Call, k: Dim, fold) -> Dim:
    start, delta = (element(x, 0, fold) for x in expr.args)
    return arith.add(start, arith.mul(k, delta))


_READERS = {"cast": _cast, "negative": _negative, "reshape": _reshape, "take": _take,
            "strided_slice": _strided_slice, "concatenate": _concatenate, "arange": _arange,
            **dict.fromkeys(_BINARY, _binary)}
