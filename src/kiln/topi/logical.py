"""Comparison and logical computes (see :mod:`kiln.relay.op.logical`): bool results.

Float comparisons are IEEE's (ordered: false with a NaN operand, ``!=`` true); bool operands
are 0/1 bytes, so xor is ``!=`` and not is ``== 0``.
"""

from __future__ import annotations

from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.broadcast import broadcast_load
from kiln.topi.registry import register_compute

_CMP = {"equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">",
        "greater_equal": ">=", "logical_and": "and", "logical_or": "or", "logical_xor": "!="}


def _binary(op: str, cmp: str) -> None:
    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """Compute of a broadcasting comparison or logical op: ``out[i] = a[i] <cmp> b[i]``, bool.

        equal, not_equal, less, less_equal, greater, greater_equal (ONNX's comparisons, IEEE
        ordered: false with a NaN, ``!=`` true), logical_and, logical_or, logical_xor (``!=`` of
        0/1 bools).

        Parameters
        ----------
        a, b : te.Tensor
            Of one dtype (bool for the logical ops), broadcastable to each other.

        Returns
        -------
        te.Tensor
            ``broadcast_shapes(a.shape, b.shape)`` (``out_type.shape``), bool; tag ``broadcast``.
        """
        a, b = inputs
        return te.compute(out_type.shape,
                          lambda *i: L.Binary(cmp, broadcast_load(a, i), broadcast_load(b, i)),
                          name=op, tag="broadcast")


for _op, _cmp in _CMP.items():
    _binary(_op, _cmp)


@register_compute("logical_not")
def logical_not(inputs, attrs, out_type):
    """ONNX Not: ``out[i] = x[i] == 0``.

    Parameters
    ----------
    x : te.Tensor
        Any shape, bool.

    Returns
    -------
    te.Tensor
        x's shape, bool; tag ``elemwise``.
    """
    (x,) = inputs
    return te.compute(x.shape, lambda *i: L.eq(x[i], L.const(0, x.dtype)), name="logical_not",
                      tag="elemwise")


@register_compute("isnan")
def isnan(inputs, attrs, out_type):
    """ONNX IsNaN: ``out[i] = x[i] != x[i]``.

    Parameters
    ----------
    x : te.Tensor
        Any shape, float.

    Returns
    -------
    te.Tensor
        x's shape, bool; tag ``elemwise``.
    """
    (x,) = inputs
    return te.compute(x.shape, lambda *i: L.ne(x[i], x[i]), name="isnan", tag="elemwise")


@register_compute("isinf")
def isinf(inputs, attrs, out_type):
    """ONNX IsInf: ``x[i] == +inf`` and / or ``x[i] == -inf``, as the attrs select.

    Parameters
    ----------
    x : te.Tensor
        Any shape, float.
    detect_positive, detect_negative : bool
        attrs: test for +inf, for -inf (neither: all false).

    Returns
    -------
    te.Tensor
        x's shape, bool; tag ``elemwise``.
    """
    (x,) = inputs
    inf = L.const(float("inf"), x.dtype)

    def body(*i):
        tests = []
        if attrs["detect_positive"]:
            tests.append(L.eq(x[i], inf))
        if attrs["detect_negative"]:
            tests.append(L.eq(x[i], L.const(float("-inf"), x.dtype)))
        if not tests:
            return L.ne(L.IntImm(0), L.IntImm(0))
        return tests[0] if len(tests) == 1 else L.Binary("or", tests[0], tests[1])

    return te.compute(x.shape, body, name="isinf", tag="elemwise")


_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "left_shift": "<<",
            "right_shift": ">>"}


def _shift(symbol: str, x: L.PrimExpr, y: L.PrimExpr) -> L.PrimExpr:
    """ONNX BitShift-28: out-of-range amounts give the sign fill alone (C leaves them
    undefined)."""
    bits = int(x.dtype.lstrip("uint"))
    zero = L.const(0, x.dtype)
    valid = y < L.const(bits, y.dtype)
    if x.dtype.startswith("int"):
        valid = L.logical_and(y >= zero, valid)
    fill = zero
    if symbol == ">>" and x.dtype.startswith("int"):
        fill = L.Select(x < zero, L.const(-1, x.dtype), zero)
    safe = L.Select(valid, y, zero)
    return L.Select(valid, L.Binary(symbol, x, safe), fill)


def _bitwise(op: str, symbol: str) -> None:
    @register_compute(op)
    def _compute(inputs, attrs, out_type):
        """Compute of a broadcasting bitwise op: and, or, xor, left_shift, right_shift.

        ONNX BitwiseAnd / BitwiseOr / BitwiseXor and BitShift (``a << b``, ``a >> b``).

        Shifts by an amount outside ``[0, bits)`` give the sign fill alone (0, or -1 for a negative
        signed ``>>``) where C leaves them undefined (:func:`_shift`).

        Parameters
        ----------
        a, b : te.Tensor
            Of one integer dtype, broadcastable to each other; ``b`` the shift amount of a shift.

        Returns
        -------
        te.Tensor
            ``broadcast_shapes(a.shape, b.shape)`` (``out_type.shape``), a's dtype; tag
            ``broadcast``.
        """
        a, b = inputs

        def body(*i):
            x, y = broadcast_load(a, i), broadcast_load(b, i)
            return _shift(symbol, x, y) if symbol in ("<<", ">>") else L.Binary(symbol, x, y)

        return te.compute(out_type.shape, body, name=op, tag="broadcast")


for _op, _symbol in _BITWISE.items():
    _bitwise(_op, _symbol)


@register_compute("bitwise_not")
def bitwise_not(inputs, attrs, out_type):
    """ONNX BitwiseNot: ``out[i] = x[i] ^ all_ones``.

    Parameters
    ----------
    x : te.Tensor
        Any shape, an integer dtype (``int*`` or ``uint*``).

    Returns
    -------
    te.Tensor
        x's shape and dtype; tag ``elemwise``.
    """
    (x,) = inputs
    bits = int(x.dtype.lstrip("uint"))
    ones = L.const(-1 if x.dtype.startswith("int") else (1 << bits) - 1, x.dtype)
    return te.compute(x.shape, lambda *i: L.Binary("^", x[i], ones), name="bitwise_not",
                      tag="elemwise")
