"""How the LLVM codegen writes a buffer index: ``c + Σ k · atom``
(:func:`kiln.codegen.llvm.expr.linear_index`), so that the pixels of an unrolled register block
are one base plus constants; no compiler needed."""

from __future__ import annotations

from kiln.codegen.llvm.expr import linear_index
from kiln.tir import loop as L

XO, XI, RX = L.Var("xo"), L.Var("xi"), L.Var("rx")


def _terms(e: L.PrimExpr) -> tuple[int, dict[str, int]]:
    c, parts = linear_index(e)
    merged: dict[str, int] = {}
    for atom, k in parts:
        merged[repr(atom)] = merged.get(repr(atom), 0) + k
    return c, {a: k for a, k in merged.items() if k}


def test_a_strided_pixel_is_a_constant_from_the_block_base():
    """``(xo * 14 + 3) * 2 + rx``: pixel 3 of a stride-2 block is ``28 xo + rx + 6``; every
    pixel of the block differs by its constant only (LLVM had made ``xo * 14 + 3`` an ``or``
    and kept one pointer per pixel: a 128-channel stride-2 int8 conv spilled, 558 -> 233 us)."""
    assert _terms((XO * 14 + 3) * 2 + RX) == (6, {"xo": 28, "rx": 1})
    assert _terms((XO * 14 + XI) * 2 + RX * 4) == (0, {"xo": 28, "xi": 2, "rx": 4})
    assert _terms((XO - 2) * 3 - (RX - 1)) == (-5, {"xo": 3, "rx": -1})
    assert _terms(2 * (XO + 1)) == (2, {"xo": 2})


def test_what_stays_one_atom():
    """A product of two variables, a division, or unsigned arithmetic (which wraps where the
    i64 sum would not) is evaluated as it is and scaled."""
    for e in (XO * RX, (XO + 1) // 2, L.Binary("+", L.Var("u", "uint32"),
                                                L.IntImm(1, "uint32"))):
        c, parts = linear_index(e)
        assert c == 0 and len(parts) == 1 and parts[0][0] is e and parts[0][1] == 1
