"""Signatures and shape specs of VM functions (decision 014): the symbols a function's inputs
bind, the ``match_shape`` / ``bind_shape`` specs that check values against their types, and
the parameter and output signatures the executable records."""

from __future__ import annotations

import numpy as np

from kiln import arith
from kiln.arith import SymVar
from kiln.errors import CompileError
from kiln.relay.graph import Function, TensorType
from kiln.runtime.vm.executable_format import Sym, TensorSig
from kiln.tir.transform.make_packed_api import dl_dtype

#: match-spec dim kinds
MATCH_EQUAL, MATCH_BIND, MATCH_CHECK = 0, 1, 2


def input_symbols(func: Function) -> list[SymVar]:
    """The symbols in ``func``'s parameter shapes, in order of first appearance (their heap
    slots are their positions)."""
    found: dict[str, SymVar] = {}
    for v in func.params:
        for d in v.checked_type.shape:
            for s in arith.free_symbols(d):
                found.setdefault(s.name, s)
    return list(found.values())


def symbol(symbols: list[SymVar], name: str) -> SymVar:
    """The symbol called ``name``; CompileError when there is none (a kernel's symbol
    argument the function does not bind)."""
    for s in symbols:
        if s.name == name:
            return s
    raise CompileError(f"kernel argument symbol {name} is not a symbol of the model's inputs")


def match_spec(t, symbols: list[SymVar], bound: set[str]) -> np.ndarray:
    """An input's ``match_shape`` spec: each symbol bound at its first occurrence."""
    def slot(d: arith.SymExpr) -> int:
        if not isinstance(d, SymVar):
            raise CompileError(f"input dim {d} is an expression; inputs take symbols or ints")
        return symbols.index(d)

    def binds(d: SymVar) -> bool:
        first = d.name not in bound
        bound.add(d.name)
        return first

    return shape_spec(t, slot, binds)


def shape_spec(t: TensorType, slot, binds) -> np.ndarray:
    """The spec of ``match_shape`` / ``bind_shape`` for a value of type ``t``: dtype code and
    bits, rank, then per dim (MATCH_EQUAL, int), or (MATCH_BIND / MATCH_CHECK, heap slot):
    ``slot(dim)`` gives the slot, ``binds(symbol)`` whether this dim binds it."""
    code, bits = dl_dtype(t.dtype)
    spec = [code, bits, t.ndim]
    for d in t.shape:
        if isinstance(d, int):
            spec += [MATCH_EQUAL, d]
        else:
            k = slot(d)
            spec += [MATCH_BIND if isinstance(d, SymVar) and binds(d) else MATCH_CHECK, k]
    return np.array(spec, dtype=np.int64)


def signature(name: str, t, symbols: list[SymVar]) -> TensorSig | None:
    """A parameter's or output's signature; None for an output with a derived dim (the format
    records ints and symbols only)."""
    dims: list = []
    for d in t.shape:
        if isinstance(d, int):
            dims.append(d)
        elif isinstance(d, SymVar):
            dims.append(Sym(symbols.index(d)))
        else:
            return None
    return TensorSig(name, t.dtype, tuple(dims))
