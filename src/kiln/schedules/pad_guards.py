"""Padding guards hoisted out of reductions: a row of taps that reads only padding is skipped.

A convolution that reads its padded input in place (a wide pad over a symbolic plane,
:func:`kiln.schedules.nn_cpu._mostly_padding`) lowers to

    for ry: for rx: ... acc = acc + select(inside(y, ry) and inside(x, rx), p0[...], 0) * w

where every tap pays its bounds test and its multiply-add, in the padding too. DeepLabV3's
ASPP convs (dilation 12 / 24 / 36 over a 4×4 map) spend most of their taps in the padding.
:func:`hoist_pad_guards` moves each conjunct of such a test to the outermost serial loop where
it is invariant, as ``for ry: if (inside(y, ry)): for rx: ...``, and drops it from the select
there: a row of taps outside the plane costs one test. (Static planes have their taps clipped
at the graph level instead, :mod:`kiln.relay.transform.clip_taps`.)

The rewrite is exact for the updates it accepts: ``acc = acc + select(c, x, 0)`` or
``acc = acc + select(c, x, 0) * w`` (either operand order), float only, where a false ``c``
adds zero — a zero product with a finite weight (an infinite or NaN weight in a padded tap
would have made the skipped term NaN). A loop's body is guarded only when every store in it is
such an update, and only by conjuncts that read no buffer and no variable bound inside it.
"""

from __future__ import annotations

from kiln.tir import loop as L


def hoist_pad_guards(func: L.PrimFunc) -> L.PrimFunc:
    """``func`` with the padding tests of its accumulating selects hoisted to the outermost
    serial loops where they are invariant (module docstring); unchanged where none applies.

    Parameters
    ----------
    func : PrimFunc
        A lowered, scheduled kernel.

    Returns
    -------
    PrimFunc
    """
    body = _guard(func.body, frozenset())
    if body is func.body:
        return func
    return L.PrimFunc(func.name, func.params, body, dict(func.attrs))


def _guard(s: L.Stmt, done: frozenset[str]) -> L.Stmt:
    """``s`` with its serial loops' bodies guarded (``done``: conjuncts already tested by an
    enclosing guard, by their text)."""
    if isinstance(s, L.For):
        conds = [] if s.kind != "serial" else _hoistable(s.body, done)
        inner = done | {repr(c) for c in conds}
        body = _guard(s.body, inner)
        if conds:
            body = L.IfThenElse(L.logical_and(*conds), _drop(body, inner))
        return s if body is s.body else L.For(s.var, s.min, s.extent, s.kind, body)
    if isinstance(s, L.SeqStmt):
        stmts = [_guard(x, done) for x in s.stmts]
        return s if all(a is b for a, b in zip(stmts, s.stmts)) else L.SeqStmt(stmts)
    if isinstance(s, L.IfThenElse):
        then = _guard(s.then_case, done)
        other = _guard(s.else_case, done) if s.else_case else None
        if then is s.then_case and other is s.else_case:
            return s
        return L.IfThenElse(s.cond, then, other)
    if isinstance(s, (L.Allocate, L.LetStmt, L.AssertStmt)):
        body = _guard(s.body, done)
        return s if body is s.body else _with_body(s, body)
    return s


def _with_body(s: L.Stmt, body: L.Stmt) -> L.Stmt:
    if isinstance(s, L.Allocate):
        return L.Allocate(s.buffer, body)
    if isinstance(s, L.LetStmt):
        return L.LetStmt(s.var, s.value, body)
    return L.AssertStmt(s.cond, s.message, s.args, body)


def _hoistable(body: L.Stmt, done: frozenset[str]) -> list[L.PrimExpr]:
    """The conjuncts shared by the padding tests of every store in ``body`` that use no
    variable bound inside it and read no buffer; none if a store is not a padded update or the
    body is a bare store (a guard there would sit inside the vector loop)."""
    if not isinstance(body, (L.For, L.SeqStmt)):
        return []
    stores = [x for x in L.walk_stmts(body) if isinstance(x, L.BufferStore)]
    if not stores:
        return []
    bound = _bound_vars(body)
    common: dict[str, L.PrimExpr] | None = None
    for st in stores:
        cond = _padded_update_cond(st)
        if cond is None:
            return []
        mine = {repr(c): c for c in _conjuncts(cond)
                if repr(c) not in done and _invariant(c, bound)}
        common = mine if common is None else {k: v for k, v in common.items() if k in mine}
        if not common:
            return []
    return list(common.values())


def _padded_update_cond(st: L.BufferStore) -> L.PrimExpr | None:
    """``c`` of a float ``acc = acc + select(c, x, 0) [* w]`` store, else None."""
    v = st.value
    if not (L.is_float(st.buffer.dtype) and isinstance(v, L.Binary) and v.op == "+"):
        return None
    acc, term = v.a, v.b
    if not (isinstance(acc, L.BufferLoad) and acc.buffer is st.buffer
            and [repr(i) for i in acc.indices] == [repr(i) for i in st.indices]):
        return None
    sel = _zero_select(term)
    if sel is None and isinstance(term, L.Binary) and term.op == "*":
        sel = _zero_select(term.a) or _zero_select(term.b)
    return None if sel is None else sel.cond


def _zero_select(e: L.PrimExpr) -> L.Select | None:
    if isinstance(e, L.Select) and isinstance(e.false_value, L.FloatImm) \
            and e.false_value.value == 0.0:
        return e
    return None


def _conjuncts(c: L.PrimExpr) -> list[L.PrimExpr]:
    if isinstance(c, L.Binary) and c.op == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _invariant(c: L.PrimExpr, bound: set[L.Var]) -> bool:
    return not any(isinstance(e, (L.BufferLoad, L.Call)) or (isinstance(e, L.Var) and e in bound)
                   for e in L.walk_exprs(c))


def _bound_vars(s: L.Stmt) -> set[L.Var]:
    return {x.var for x in L.walk_stmts(s) if isinstance(x, (L.For, L.LetStmt))}


def _drop(s: L.Stmt, tested: frozenset[str]) -> L.Stmt:
    """``s`` with the conjuncts in ``tested`` (true under the guard) removed from the padded
    updates' selects."""

    def fexpr(e: L.PrimExpr) -> L.PrimExpr:
        return L.map_expr(e, _strip(tested))

    return L.map_stmt(s, fexpr)


def _strip(tested: frozenset[str]):
    def fn(e: L.PrimExpr) -> L.PrimExpr:
        if isinstance(e, L.Select) and _zero_select(e) is not None:
            rest = [c for c in _conjuncts(e.cond) if repr(c) not in tested]
            if len(rest) < len(_conjuncts(e.cond)):
                return e.true_value if not rest else L.Select(L.logical_and(*rest),
                                                              e.true_value, e.false_value)
        return e

    return fn
