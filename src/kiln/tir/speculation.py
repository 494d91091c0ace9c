"""Whether a loop-IR expression may be evaluated where its program would not evaluate it
(speculated): a select's two sides computed as vector lanes, an ``exp`` hoisted out of its
store's conditions. It may not when it could fault: an integer division (by zero), a
packed-argument read, or a load the program does not make anyway (it may be out of bounds
there: padding's guarded ``inside ? data[y - 1] : 0``)."""

from __future__ import annotations

from kiln.tir import loop as L

#: a load's identity: its buffer and its index expressions
LoadKey = tuple[int, str]


def load_key(e: L.BufferLoad) -> LoadKey:
    return id(e.buffer), repr(e.indices)


def may_trap(e: L.PrimExpr, made: set[LoadKey] = frozenset()) -> bool:
    """Whether evaluating ``e`` speculatively could fault: an integer division by anything but
    a nonzero constant, a packed-argument read, or a load other than those in ``made`` (loads
    known to happen anyway, their index arithmetic included: fused loops index rows with
    ``f // 128``)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, L.BufferLoad):
            if load_key(x) in made:
                continue
            return True
        if isinstance(x, L.Call) and x.name.startswith("kiln."):
            return True
        if isinstance(x, L.Binary) and x.op in ("/", "//", "%") and not L.is_float(x.dtype) \
                and not (isinstance(x.b, L.IntImm) and x.b.value != 0):
            return True
        stack.extend(L.expr_children(x))
    return False


def loads_in(e: L.PrimExpr) -> set[LoadKey]:
    """Every load in ``e``."""
    return _loads(e, lazy=False)


def eager_loads(e: L.PrimExpr) -> set[LoadKey]:
    """The loads evaluating ``e`` always makes: not those under a select's sides or the right
    operand of ``and``/``or`` alone (C's lazy ``?:``, ``&&``, ``||``)."""
    return _loads(e, lazy=True)


def _loads(e: L.PrimExpr, lazy: bool) -> set[LoadKey]:
    """The loads in ``e``; with ``lazy``, only down the operands always evaluated."""
    found: set[LoadKey] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, L.BufferLoad):
            found.add(load_key(x))
        if lazy and isinstance(x, L.Select):
            stack.append(x.cond)
        elif lazy and isinstance(x, L.Binary) and x.op in ("and", "or"):
            stack.append(x.a)
        else:
            stack.extend(L.expr_children(x))
    return found
