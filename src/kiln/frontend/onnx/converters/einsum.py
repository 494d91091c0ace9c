"""Converter of ONNX Einsum: the equation normalized to explicit letter form for the ``einsum``
graph op (ellipsis dimensions get capital letters; an implicit output is the letters used once,
in alphabetical order, after the ellipsis dimensions — numpy's and ONNX's rule)."""

from __future__ import annotations

from collections import Counter

from kiln.frontend.onnx.context import ConvertContext
from kiln.frontend.onnx.registry import onnx_op
from kiln.relay.graph import Expr

_ELLIPSIS_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def normalize_equation(equation: str, ranks: list[int]) -> str:
    """``equation`` with '...' replaced and the output made explicit; raises ValueError."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"{len(terms)} operands in the equation, {len(ranks)} inputs")
    if any(c.isupper() for c in eq):
        raise ValueError("capital subscripts are not supported")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t),
              default=0)
    if ell > len(_ELLIPSIS_LETTERS):
        raise ValueError("too many ellipsis dimensions")

    def expand(term: str, rank: int | None) -> str:
        if "..." not in term:
            return term
        n = ell if rank is None else rank - len(term.replace("...", ""))
        return term.replace("...", _ELLIPSIS_LETTERS[ell - n:ell])

    new_terms = [expand(t, r) for t, r in zip(terms, ranks)]
    if arrow:
        new_out = expand(out, None)
    else:
        counts = Counter("".join(t.replace("...", "") for t in terms))
        new_out = _ELLIPSIS_LETTERS[:ell] + "".join(sorted(c for c, n in counts.items()
                                                           if n == 1))
    for t, r in zip(new_terms, ranks):
        if len(t) != r:
            raise ValueError(f"subscripts {t!r} do not match rank {r}")
    return ",".join(new_terms) + "->" + new_out


@onnx_op("Einsum", since=12)
def einsum(ctx: ConvertContext) -> Expr:
    args = [ctx.input(k) for k in range(len(ctx.inputs))]
    try:
        equation = normalize_equation(str(ctx.attr("equation")),
                                      [a.checked_type.ndim for a in args])
    except ValueError as err:
        raise ctx.unsupported(f"equation {ctx.attr('equation')!r}: {err}") from None
    return ctx.call("einsum", args, equation=equation)
