"""The VM's shape heap at compile time: a heap slot per symbol and per derived dim, and the
``vm.builtin.shape_compute`` programs that fill them (decision 014; late symbols: 016)."""

from __future__ import annotations

from kiln import arith
from kiln.arith import Dim, SymVar
from kiln.backend.vm_dynamic import depends_on
from kiln.errors import CompileError
from kiln.runtime.vm.bytecode import heap, imm

#: shape-program opcodes
SHAPE_OPS = {"add": 0, "sub": 1, "mul": 2, "floordiv": 3, "floormod": 4, "min": 5, "max": 6}


class ShapeHeap:
    """Heap slots of the symbols and of every derived dim, with the programs computing them.

    Slots ``0 .. len(symbols)-1`` are the symbols; :meth:`operand` gives a dim as an immediate
    (an int) or the slot of its expression, emitting the program's operations on first use so
    that each distinct subexpression is computed once.

    A dim over ``late`` symbols (bound by a data-dependent op where it runs, decision 016)
    cannot be computed at the function head: its operations go to :attr:`inline`, which the
    emitter places just before the next instruction, and its slot is known only in the
    current body scope (:meth:`push`/:meth:`pop`): a branch or loop body that computed it
    may not have run where it is used next."""

    def __init__(self, symbols: list[SymVar], late: list[SymVar] = ()):
        self.slots: dict[Dim, int] = {s: k for k, s in enumerate(symbols)}
        self.size = len(symbols)
        self.program: list[int] = []
        self.late = {s.name for s in late}
        self.scopes: list[dict[Dim, int]] = [{}]
        self.inline: list[int] = []

    def push(self) -> None:
        """Enter a body: late-dependent slots computed inside it stay inside it."""
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    def take_inline(self) -> list[int]:
        """The late-dependent operations requested since the last call, to run now."""
        out, self.inline = self.inline, []
        return out

    def operand(self, d: Dim) -> tuple[int, int]:
        """(kind, value) for the shape program: (1, int) or (0, slot)."""
        if isinstance(d, int):
            return 1, d
        return 0, self.slot(d)

    def arg(self, d: Dim) -> int:
        """A bytecode argument word for ``d``: an immediate or a heap slot."""
        kind, value = self.operand(d)
        return imm(value) if kind == 1 else heap(value)

    def slot(self, d: arith.SymExpr) -> int:
        if d in self.slots:
            return self.slots[d]
        for scope in reversed(self.scopes):
            if d in scope:
                return scope[d]
        if isinstance(d, SymVar):
            raise CompileError(f"symbol {d.name} is not bound by any input of the model")
        op, a, b = _decompose(d)
        ka, va = self.operand(a)
        kb, vb = self.operand(b)
        dst = self.size
        self.size += 1
        step = [SHAPE_OPS[op], dst, ka, va, kb, vb]
        if depends_on(d, self.late):
            self.inline += step
            self.scopes[-1][d] = dst
        else:
            self.program += step
            self.slots[d] = dst
        return dst


def _decompose(d: arith.SymExpr) -> tuple[str, Dim, Dim]:
    """``d`` as one operation over smaller dims."""
    if isinstance(d, arith.SymOp):
        return d.op, d.args[0], d.args[1]
    assert isinstance(d, arith.Poly), f"unexpected dim {d!r}"
    if d.const:
        return "add", arith.sub(d, d.const), d.const
    if len(d.terms) > 1:
        (mono, coeff), *_ = d.terms
        first = arith.mul(coeff, arith.prod(mono))
        return "add", first, arith.sub(d, first)
    ((mono, coeff),) = d.terms
    if coeff != 1:
        return "mul", arith.prod(mono), coeff
    return "mul", arith.prod(mono[:-1]), mono[-1]
