"""Dataflow patterns over the graph IR: the small pattern language of BYOC pattern tables (TVM:
python/tvm/relay/dataflow_pattern/__init__.py and src/relay/ir/dataflow_matcher.cc, reduced to
what composites need).

Build a pattern from :func:`is_op`, :func:`wildcard`, :func:`is_constant` and :func:`is_var`,
combine alternatives with ``|`` and constrain attributes with :meth:`Pattern.has_attr`::

    x, w, b = wildcard(), is_constant(), is_constant()
    conv = is_op("nn.conv2d")(x, w)
    conv_bias_relu = is_op("nn.relu")(is_op("nn.bias_add")(conv, b) | is_op("add")(conv, b))

:func:`match` matches a pattern rooted at one node. The same pattern object used twice must
match the same node both times (as in TVM). Arguments match in order (``add(a, b)`` does not match
``add(b, a)``: spell both orders with ``|``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from kiln.relay.graph import Call, Constant, Expr, Var

_ids = itertools.count()


class Pattern:
    """Base of patterns. Patterns are immutable; combine them with ``|`` and ``has_attr``."""

    def __init__(self) -> None:
        self.pid = next(_ids)

    def __or__(self, other: Pattern) -> Pattern:
        return AltPattern(self, other)

    def has_attr(self, attrs: dict[str, Any]) -> Pattern:
        """This pattern, matching only calls whose attrs include ``attrs`` (equal values)."""
        return AttrPattern(self, dict(attrs))

    def has_dtype(self, dtype: str) -> Pattern:
        """This pattern, matching only nodes of dtype ``dtype``."""
        return DTypePattern(self, dtype)

    def _match(self, expr: Expr, m: _State) -> _State | None:
        raise NotImplementedError


@dataclass
class _State:
    bound: dict[int, Expr] = field(default_factory=dict)  # pattern id → node
    inputs: list[Expr] = field(default_factory=list)  # leaf bindings, first-seen order
    nodes: list[Expr] = field(default_factory=list)  # calls matched by call patterns

    def copy(self) -> _State:
        return _State(dict(self.bound), list(self.inputs), list(self.nodes))


def _bind(p: Pattern, expr: Expr, m: _State, leaf: bool) -> _State | None:
    seen = m.bound.get(p.pid)
    if seen is not None:
        return m if seen is expr else None
    m = m.copy()
    m.bound[p.pid] = expr
    if leaf:
        if all(e is not expr for e in m.inputs):
            m.inputs.append(expr)
    elif all(e is not expr for e in m.nodes):
        m.nodes.append(expr)
    return m


class WildcardPattern(Pattern):
    """Matches any node; it becomes an input of the composite."""

    def _match(self, expr: Expr, m: _State) -> _State | None:
        return _bind(self, expr, m, leaf=True)


class ConstantPattern(Pattern):
    """Matches a :class:`Constant`; it becomes an input of the composite."""

    def _match(self, expr: Expr, m: _State) -> _State | None:
        return _bind(self, expr, m, leaf=True) if isinstance(expr, Constant) else None


class VarPattern(Pattern):
    """Matches a graph input :class:`Var` (any, or the one named ``name``)."""

    def __init__(self, name: str | None = None):
        super().__init__()
        self.name = name

    def _match(self, expr: Expr, m: _State) -> _State | None:
        if not isinstance(expr, Var) or (self.name is not None and expr.name != self.name):
            return None
        return _bind(self, expr, m, leaf=True)


class CallPattern(Pattern):
    """Matches a :class:`Call` of op ``op`` whose arguments match ``args`` in order."""

    def __init__(self, op: str, args: list[Pattern]):
        super().__init__()
        self.op = op
        self.args = list(args)

    def _match(self, expr: Expr, m: _State) -> _State | None:
        if not isinstance(expr, Call) or expr.op.name != self.op or \
                len(expr.args) != len(self.args):
            return None
        state: _State | None = _bind(self, expr, m, leaf=False)
        for p, a in zip(self.args, expr.args):
            if state is None:
                return None
            state = p._match(a, state)
        return state


class AltPattern(Pattern):
    """Matches what ``left`` matches, else what ``right`` matches."""

    def __init__(self, left: Pattern, right: Pattern):
        super().__init__()
        self.left, self.right = left, right

    def _match(self, expr: Expr, m: _State) -> _State | None:
        got = self.left._match(expr, m)
        return got if got is not None else self.right._match(expr, m)


class AttrPattern(Pattern):
    """Matches what ``pattern`` matches when the node is a Call with the given attrs."""

    def __init__(self, pattern: Pattern, attrs: dict[str, Any]):
        super().__init__()
        self.pattern, self.attrs = pattern, attrs

    def _match(self, expr: Expr, m: _State) -> _State | None:
        if not isinstance(expr, Call) or any(expr.attrs.get(k) != v for k, v in self.attrs.items()):
            return None
        return self.pattern._match(expr, m)


class DTypePattern(Pattern):
    """Matches what ``pattern`` matches when the node's dtype is ``dtype``."""

    def __init__(self, pattern: Pattern, dtype: str):
        super().__init__()
        self.pattern, self.dtype = pattern, dtype

    def _match(self, expr: Expr, m: _State) -> _State | None:
        if expr.checked_type.dtype != self.dtype:
            return None
        return self.pattern._match(expr, m)


class _OpRef:
    def __init__(self, op: str):
        self.op = op

    def __call__(self, *args: Pattern) -> CallPattern:
        return CallPattern(self.op, list(args))


def is_op(op: str) -> _OpRef:
    """``is_op("nn.conv2d")(x, w)``: a call of graph op ``op`` on arguments matching ``x, w``."""
    return _OpRef(op)


def wildcard() -> WildcardPattern:
    """Any node (an input of the composite)."""
    return WildcardPattern()


def is_constant() -> ConstantPattern:
    """A constant (an input of the composite: weights, biases)."""
    return ConstantPattern()


def is_var(name: str | None = None) -> VarPattern:
    """A graph input, optionally the one named ``name``."""
    return VarPattern(name)


@dataclass
class Match:
    """A match of a pattern rooted at ``root``.

    Attributes
    ----------
    root : the node the pattern's outermost call matched.
    nodes : every call the pattern's call patterns matched (the composite's interior), root
        included.
    inputs : the nodes matched by leaf patterns (wildcards, constants, vars), each once, in the
        order the matcher met them: the composite's parameters.
    """

    root: Expr
    nodes: list[Expr]
    inputs: list[Expr]


def match(pattern: Pattern, expr: Expr) -> Match | None:
    """Match ``pattern`` rooted at ``expr``; None when it does not match."""
    state = pattern._match(expr, _State())
    if state is None:
        return None
    return Match(expr, state.nodes, state.inputs)


__all__ = ["AltPattern", "AttrPattern", "CallPattern", "ConstantPattern", "DTypePattern",
           "Match", "Pattern", "VarPattern", "WildcardPattern", "is_constant", "is_op", "is_var",
           "match", "wildcard"]
