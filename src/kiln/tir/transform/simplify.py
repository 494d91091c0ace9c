"""Simplify: constant folding and index arithmetic over the loop IR.

Rules (all exact for the loop IR's integer semantics):
- integer constant folding and identities (x+0, x*1, x*0, x//1, x%1);
- loops of extent 1 disappear (their variable becomes the loop's min);
- with a small interval analysis of loop variables (TVM's arith::ConstIntBound in spirit):
  ``x // c -> 0`` and ``x % c -> x`` when 0 <= x < c;
- ``(q*c + r) // c -> q + r // c`` and ``(q*c + r) % c -> r % c`` for any ``r`` (floor
  division): a flattened index splits at a divisor of its row;
- ``(x*c + r) // (c*k) -> x // k`` and ``(x*c + r) % (c*k) -> (x % k)*c + r`` when
  0 <= r < c (the flattened index of a reshape read back in larger rows);
- symbolic divisors (shape symbols): ``(q*d + r) // d -> q`` and ``% d -> r`` when ``r`` is
  known to lie in ``[0, d)``: a loop variable of extent ``d``, or ``y % d``;
- ``Select`` and ``IfThenElse`` with a condition known from the bounds collapse.
"""

from __future__ import annotations

from kiln.tir import loop as L

name = "Simplify"

Bound = tuple[float, float]
_INF = float("inf")


def simplify(func: L.PrimFunc) -> L.PrimFunc:
    body = _Simplifier().stmt(func.body, {})
    return L.PrimFunc(func.name, func.params, body, dict(func.attrs))


class _Simplifier:
    def __init__(self) -> None:
        self.extents: dict[L.Var, L.PrimExpr] = {}  # loops from 0: their (symbolic) extent

    def stmt(self, s: L.Stmt, ranges: dict[L.Var, Bound]) -> L.Stmt:
        if isinstance(s, L.For):
            lo, ext = self.expr(s.min, ranges), self.expr(s.extent, ranges)
            if isinstance(ext, L.IntImm) and ext.value == 1:
                return self.stmt(L.substitute_stmt(s.body, {s.var: lo}), ranges)
            if _is(lo, 0):
                self.extents[s.var] = ext
            inner = dict(ranges)
            lb, ub = self.bound(lo, ranges)[0], self.bound(lo, ranges)[1]
            eb = self.bound(ext, ranges)[1]
            inner[s.var] = (lb, ub + eb - 1)
            return L.For(s.var, lo, ext, s.kind, self.stmt(s.body, inner))
        if isinstance(s, L.SeqStmt):
            return L.seq(*[self.stmt(x, ranges) for x in s.stmts])
        if isinstance(s, L.Allocate):
            return L.Allocate(s.buffer, self.stmt(s.body, ranges))
        if isinstance(s, L.IfThenElse):
            cond = self.expr(s.cond, ranges)
            known = self.truth(cond, ranges)
            if known is True:
                return self.stmt(s.then_case, ranges)
            if known is False:
                return self.stmt(s.else_case, ranges) if s.else_case else L.SeqStmt([])
            return L.IfThenElse(cond, self.stmt(s.then_case, ranges),
                                self.stmt(s.else_case, ranges) if s.else_case else None)
        if isinstance(s, L.AssertStmt):
            return L.AssertStmt(self.expr(s.cond, ranges), s.message,
                                [self.expr(a, ranges) for a in s.args],
                                self.stmt(s.body, ranges))
        if isinstance(s, L.LetStmt):
            return L.LetStmt(s.var, self.expr(s.value, ranges), self.stmt(s.body, ranges))
        return L.map_stmt(s, lambda e: self.expr(e, ranges))

    def expr(self, e: L.PrimExpr, ranges: dict[L.Var, Bound]) -> L.PrimExpr:
        return L.map_expr(e, lambda x: self.rewrite(x, ranges))

    # -- one node, children already simplified
    def rewrite(self, e: L.PrimExpr, ranges: dict[L.Var, Bound]) -> L.PrimExpr:
        if isinstance(e, L.Select):
            known = self.truth(e.cond, ranges)
            if known is not None:
                return e.true_value if known else e.false_value
            return e
        if not isinstance(e, L.Binary) or e.dtype != L.INT:
            return e
        a, b, op = e.a, e.b, e.op
        if isinstance(a, L.IntImm) and isinstance(b, L.IntImm):
            return L.IntImm(_fold(op, a.value, b.value), e.dtype)
        if op == "+":
            if _is(a, 0):
                return b
            if _is(b, 0):
                return a
        elif op == "-" and _is(b, 0):
            return a
        elif op == "*":
            if _is(a, 0) or _is(b, 0):
                return L.IntImm(0, e.dtype)
            if _is(a, 1):
                return b
            if _is(b, 1):
                return a
        elif op in ("//", "%") and isinstance(b, L.IntImm) and b.value > 0:
            return self.divmod(op, a, b.value, ranges) or e
        elif op in ("//", "%") and not isinstance(b, L.IntImm):
            out = self.symbolic_divmod(op, a, b)
            if out is not None:
                return out
        if op == "//" and isinstance(b, L.Binary) and b.op == "*":
            # a // (d*c) == (a // c) // d for c, d > 0 (d: a product of shape symbols): the
            # flattened index of a symbolic reshape, (i*384 + j) // (seq*384) -> i // seq.
            for c, d in ((b.a, b.b), (b.b, b.a)):
                if isinstance(c, L.IntImm) and c.value > 0:
                    q = self.divmod("//", a, c.value, ranges)
                    if q is not None:
                        return self.rewrite(L.Binary("//", q, d), ranges)
        return e

    def symbolic_divmod(self, op: str, a: L.PrimExpr, d: L.PrimExpr) -> L.PrimExpr | None:
        """``(q*d + r) // d -> q`` / ``% d -> r`` for a symbolic ``d`` and ``r`` in ``[0, d)``."""
        terms = _terms(a)
        multiples = [t for t in terms if _has_factor(t, d)]
        rest = [t for t in terms if not _has_factor(t, d)]
        if not multiples or len(rest) > 1 or (rest and not self.below(rest[0], d)):
            return None
        if op == "%":
            return rest[0] if rest else L.IntImm(0)
        out = _without_factor(multiples[0], d)
        for t in multiples[1:]:
            out = out + _without_factor(t, d)
        return out

    def below(self, r: L.PrimExpr, d: L.PrimExpr) -> bool:
        """Whether ``0 <= r < d`` is known: a loop variable of extent ``d``, or ``y % d``."""
        if isinstance(r, L.Var):
            ext = self.extents.get(r)
            return ext is not None and _same(ext, d)
        return isinstance(r, L.Binary) and r.op == "%" and _same(r.b, d)

    def divmod(self, op: str, a: L.PrimExpr, c: int, ranges) -> L.PrimExpr | None:
        if c == 1:
            return a if op == "//" else L.IntImm(0)
        lo, hi = self.bound(a, ranges)
        if 0 <= lo and hi < c:
            return L.IntImm(0) if op == "//" else a
        # (x*c' + r) with c' | c and 0 <= r < c': x // (c/c') and (x % (c/c'))*c' + r
        if isinstance(a, L.Binary) and a.op == "+":
            for mul, rest in ((a.a, a.b), (a.b, a.a)):
                if isinstance(mul, L.Binary) and mul.op == "*" and \
                        isinstance(mul.b, L.IntImm) and 1 < mul.b.value < c and \
                        c % mul.b.value == 0:
                    rlo, rhi = self.bound(rest, ranges)
                    if 0 <= rlo and rhi < mul.b.value:
                        k = c // mul.b.value
                        if op == "//":
                            return self.rewrite(L.Binary("//", mul.a, L.IntImm(k)), ranges)
                        low = self.rewrite(L.Binary("%", mul.a, L.IntImm(k)), ranges)
                        return low * mul.b.value + rest
        # (q*c + r) // c == q + r // c and (q*c + r) % c == r % c, whatever r (floor division)
        terms = _terms(a)
        quotients = [_multiple_of(t, c) for t in terms]
        if len(terms) > 1 and any(q is not None for q in quotients):
            others = [t for t, q in zip(terms, quotients) if q is None]
            rest = self.rewrite(L.Binary(op, _sum(others), L.IntImm(c)), ranges)
            if op == "%":
                return rest
            for q in quotients:
                rest = rest if q is None else self.rewrite(L.Binary("+", q, rest), ranges)
            return rest
        q = _multiple_of(a, c)
        if q is not None:
            return q if op == "//" else L.IntImm(0)
        return None

    def truth(self, cond: L.PrimExpr, ranges) -> bool | None:
        if isinstance(cond, L.IntImm):
            return bool(cond.value)
        if isinstance(cond, L.Binary) and cond.op in ("<", "<=", ">", ">=") \
                and cond.a.dtype == L.INT:
            alo, ahi = self.bound(cond.a, ranges)
            blo, bhi = self.bound(cond.b, ranges)
            if cond.op == "<":
                return True if ahi < blo else False if alo >= bhi else None
            if cond.op == "<=":
                return True if ahi <= blo else False if alo > bhi else None
            if cond.op == ">":
                return True if alo > bhi else False if ahi <= blo else None
            return True if alo >= bhi else False if ahi < blo else None
        if isinstance(cond, L.Binary) and cond.op == "and":
            ta, tb = self.truth(cond.a, ranges), self.truth(cond.b, ranges)
            if ta is False or tb is False:
                return False
            if ta is True and tb is True:
                return True
        return None

    def bound(self, e: L.PrimExpr, ranges) -> Bound:
        if isinstance(e, L.IntImm):
            return (e.value, e.value)
        if isinstance(e, L.Var):
            return ranges.get(e, (-_INF, _INF))
        if isinstance(e, L.Binary) and e.dtype == L.INT:
            alo, ahi = self.bound(e.a, ranges)
            blo, bhi = self.bound(e.b, ranges)
            if e.op == "+":
                return (alo + blo, ahi + bhi)
            if e.op == "-":
                return (alo - bhi, ahi - blo)
            if e.op == "*" and isinstance(e.b, L.IntImm) and e.b.value >= 0:
                return (alo * e.b.value, ahi * e.b.value) if alo > -_INF else (-_INF, _INF)
            if e.op == "//" and isinstance(e.b, L.IntImm) and e.b.value > 0 and alo >= 0:
                return (alo // e.b.value, ahi // e.b.value if ahi < _INF else _INF)
            if e.op == "%" and isinstance(e.b, L.IntImm) and e.b.value > 0:
                return (0, e.b.value - 1)
            if e.op == "min":
                return (min(alo, blo), min(ahi, bhi))
            if e.op == "max":
                return (max(alo, blo), max(ahi, bhi))
        return (-_INF, _INF)


def _terms(e: L.PrimExpr) -> list[L.PrimExpr]:
    """The summands of a tree of ``+``."""
    if isinstance(e, L.Binary) and e.op == "+":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _sum(terms: list[L.PrimExpr]) -> L.PrimExpr:
    """``terms[0] + terms[1] + ...``, or 0 for none."""
    out = terms[0] if terms else L.IntImm(0)
    for t in terms[1:]:
        out = L.Binary("+", out, t)
    return out


def _factors(e: L.PrimExpr) -> list[L.PrimExpr]:
    if isinstance(e, L.Binary) and e.op == "*":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _has_factor(term: L.PrimExpr, d: L.PrimExpr) -> bool:
    return _same(term, d) or _without_factor(term, d) is not None


def _without_factor(term: L.PrimExpr, d: L.PrimExpr) -> L.PrimExpr | None:
    """``term / d`` when ``d``'s factors are among ``term``'s (as a product), else None."""
    rest = _factors(term)
    for f in _factors(d):
        k = next((i for i, x in enumerate(rest) if _same(x, f)), None)
        if k is None:
            return None
        del rest[k]
    out: L.PrimExpr = L.IntImm(1)
    for x in rest:
        out = x if _is(out, 1) else out * x
    return out


def _same(a: L.PrimExpr, b: L.PrimExpr) -> bool:
    """Structural equality of index expressions (variables by identity)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, L.IntImm):
        return a.value == b.value and a.dtype == b.dtype
    if isinstance(a, L.Binary):
        return a.op == b.op and _same(a.a, b.a) and _same(a.b, b.b)
    return False


def _is(e: L.PrimExpr, value: int) -> bool:
    return isinstance(e, L.IntImm) and e.value == value


def _multiple_of(e: L.PrimExpr, c: int) -> L.PrimExpr | None:
    """If ``e`` is ``q * k`` with ``k`` a multiple of ``c``, return ``q * (k // c)``."""
    if isinstance(e, L.Binary) and e.op == "*":
        for x, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, L.IntImm) and k.value % c == 0:
                return x if k.value == c else x * (k.value // c)
    if isinstance(e, L.IntImm) and e.value % c == 0:
        return L.IntImm(e.value // c)
    return None


def _fold(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "//":
        return a // b
    if op == "%":
        return a % b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if op in _BITWISE:
        return _BITWISE[op](a, b)
    raise AssertionError(f"cannot fold {op}")


_BITWISE = {"&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
            "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b}
