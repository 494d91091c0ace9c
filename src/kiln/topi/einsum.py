"""The einsum compute: one reduction over the letters missing from the output, of the product
of the operands read at their letters (a size-1 axis under a longer letter reads index 0).

A two-operand einsum summing one letter is a batched matrix product (attention's
``bsgrd,tbgd->bgrst`` and ``bgrst,tbgd->bsgrd``): :func:`matmul_roles` names which output axes
are its rows and its columns, and the CPU schedule register-blocks it as ``nn.matmul``
(:func:`kiln.schedules.dense_cpu.schedule_einsum`). Where B holds its column letter strided and
the summed letter contiguous (the scores read the sequence-major key cache ``tbgd`` along
``t``), B is first copied with its column letter last (:func:`pack_columns`), so the register
block loads contiguous vectors instead of gathering them (docs/decisions/057).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from kiln.errors import ShapeError
from kiln.tir import loop as L
from kiln.tir import te
from kiln.topi.registry import register_compute


def parse_einsum(equation: str) -> tuple[list[str], str]:
    """(input subscripts, output subscripts) of an explicit letter-only equation."""
    if "->" not in equation or "." in equation:
        raise ShapeError(f"einsum equation {equation!r} is not in explicit letter form")
    lhs, out = equation.split("->")
    return lhs.split(","), out


def letter_extents(terms: list[str], shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Each letter's extent; raises ShapeError for a rank or extent mismatch."""
    extents: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            raise ShapeError(f"subscripts {term!r} do not match shape {shape}")
        for letter, n in zip(term, shape):
            cur = extents.get(letter)
            if cur is None or cur == 1:
                extents[letter] = n
            elif n not in (1, cur):
                raise ShapeError(f"letter {letter!r} has extents {cur} and {n}")
    return extents


@register_compute("einsum")
def einsum(inputs, attrs, out_type):
    """ONNX Einsum: the product of the operands at their letters, summed over the missing letters.

    ``out[o] = Σ_{summed letters} Π_t inputs[t][letters of term t]``
    (https://onnx.ai/onnx/operators/onnx__Einsum.html; explicit form only). An operand's size-1
    axis under a letter whose extent is longer is read at index 0 (broadcast). The result
    carries ``matmul_roles`` (:func:`matmul_roles`) for the CPU schedule.

    Parameters
    ----------
    operands : list of te.Tensor
        ``inputs``: one tensor per term of the equation, of one dtype; operand ``t`` has rank
        ``len(terms[t])``, axis ``k`` the extent of letter ``terms[t][k]`` (or 1).
    equation : str
        attrs: explicit letter form, ``"bsgrd,tbgd->bgrst"`` (no ellipsis: the frontend gives
        ellipsis dimensions letters of their own).

    Returns
    -------
    te.Tensor
        One axis per output letter, ``[extent(c) for c in out]`` (``out_type.shape``), the
        operands' dtype; tag ``einsum``.

    Raises
    ------
    ShapeError
        From :func:`kiln.relay.op.einsum.parse_einsum` / ``letter_extents``: an equation not in
        explicit letter form, or mismatched extents (type inference has raised it first).
    """
    terms, out = parse_einsum(attrs["equation"])
    extents = letter_extents(terms, [t.shape for t in inputs])
    roles = matmul_roles(terms, out)
    if roles is not None and te.extents_version() == 0:
        inputs, terms = pack_columns(list(inputs), terms, out)
    summed = [c for c in extents if c not in out]
    raxes = {c: te.reduce_axis(extents[c], f"r_{c}") for c in summed}

    def body(*o):
        var = {c: o[k] for k, c in enumerate(out)} | {c: r.var for c, r in raxes.items()}
        value = None
        for t, term in zip(inputs, terms):
            idx = tuple(L.IntImm(0) if n == 1 and extents[c] != 1 else var[c]
                        for c, n in zip(term, t.shape))
            load = t[idx]
            value = load if value is None else value * load
        if not raxes:
            return value
        return te.sum(value, list(raxes.values()))

    out_tensor = te.compute(out_type.shape, body, name="einsum", tag="einsum")
    out_tensor.matmul_roles = roles
    return out_tensor


#: the least rows (static) for which B of a matmul-like einsum is packed (pack_columns): each
#: packed element is then read by that many rows' multiply-adds for one move
MIN_PACKED_ROWS = 16


def pack_columns(inputs: list[te.Tensor], terms: list[str], out: str
                 ) -> tuple[list[te.Tensor], list[str]]:
    """``(inputs, terms)`` with operand B of a matmul-like einsum copied so that its column
    letter is its last axis, when B's last letter is the summed one (its columns strided).

    ``tbgd`` (columns ``t``, summed ``d``) becomes a stage ``bgdt`` tagged ``einsum_pack``: the
    register block of :func:`kiln.schedules.dense_cpu.schedule_einsum` then loads each
    ``k``-step's columns as one contiguous vector, where it gathered them ``g·d`` elements
    apart (SmolLM2's scores at 512 tokens: 6.7 GFLOP/s). The copy is ``|B|`` moves against
    ``|B| x rows`` multiply-adds: only where A has a symbolic row letter (then blocked, and the
    kernel's version for one row — a decoded token — keeps the gather:
    :func:`kiln.tir.te.extents_version`) or static rows of at least MIN_PACKED_ROWS.

    Parameters
    ----------
    inputs : list of te.Tensor
        The two operands.
    terms : list of str
        Their subscripts; ``out``: the output's (its last letter is the column letter).

    Returns
    -------
    (list of te.Tensor, list of str)
        The operands and terms, B replaced by the packed stage and its subscripts, or the
        arguments unchanged.
    """
    col = out[-1]
    (summed,) = set("".join(terms)) - set(out)
    k = next(n for n, term in enumerate(terms) if col in term)
    term, b = terms[k], inputs[k]
    a_term, a = terms[1 - k], inputs[1 - k]
    rows = [a.shape[a_term.index(c)] for c in out if c in a_term and c not in term]
    static = math.prod(n for n in rows if isinstance(n, int))
    if term[-1] != summed or (all(isinstance(n, int) for n in rows) and static < MIN_PACKED_ROWS):
        return inputs, terms
    packed_term = "".join(c for c in term if c not in (col, summed)) + summed + col
    shape = tuple(b.shape[term.index(c)] for c in packed_term)

    def body(*idx):
        at = dict(zip(packed_term, idx))
        return b[tuple(at[c] for c in term)]

    inputs[k] = te.compute(shape, body, name="einsum_pack", tag="einsum_pack")
    terms = list(terms)
    terms[k] = packed_term
    return inputs, terms


class MatmulRoles(NamedTuple):
    """Output axes of a matmul-like einsum: ``col`` (the last output axis, from operand B)
    and ``rows`` (output axes from operand A only, the candidates for register-block rows)."""

    rows: tuple[int, ...]
    col: int


def matmul_roles(terms: list[str], out: str) -> MatmulRoles | None:
    """The roles of ``terms -> out`` when it is a batched matrix product, else None.

    A batched matrix product: two operands, one summed letter that both have, and a last output
    letter that only one of them (B) has.

    Parameters
    ----------
    terms : list of str
        The input subscripts (``["bsgrd", "tbgd"]``).
    out : str
        The output subscripts (``"bgrst"``).

    Returns
    -------
    MatmulRoles or None
        ``col``: the last output axis (B's letter); ``rows``: the positions of output letters of
        operand A only. None when the equation is not such a product or A has no such letter.
    """
    if len(terms) != 2 or not out:
        return None
    summed = set("".join(terms)) - set(out)
    col = out[-1]
    owners = [t for t in terms if col in t]
    if len(summed) != 1 or len(owners) != 1 or not all(summed <= set(t) for t in terms):
        return None
    a = terms[1] if owners[0] is terms[0] else terms[0]
    rows = tuple(k for k, c in enumerate(out[:-1]) if c in a and c not in owners[0])
    return MatmulRoles(rows, len(out) - 1) if rows else None
