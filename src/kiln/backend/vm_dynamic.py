"""How the VM bytecode runs a data-dependent op (``dyn.*``, decision 016).

A ``dyn.*`` call becomes one call of its builtin (``kiln.runtime.vm.dynamic_builtins``; the calls
of one ONNX node's several outputs share it) and a ``vm.builtin.bind_shape`` of its result:
the late symbols of its type are bound to their heap slots there (or checked, when a sibling
output bound them first), with their bounds. This module knows each op's builtin and its
argument layout; :mod:`kiln.backend.vm_codegen` places the calls.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.arith import SymVar, free_symbols
from kiln.errors import CompileError
from kiln.relay.graph import Call, Expr, Function, IfCall, LoopCall, post_order
from kiln.relay.op.dynamic import bound_by
from kiln.runtime.ndarray import array
from kiln.runtime.vm.bytecode import const, imm


def _axis(a: int | None) -> int:
    return -1 if a is None else a


#: op → (builtin name, its immediates before the tensors, its immediates after them)
_LAYOUT: dict[str, tuple[str, Callable[[dict], list[int]], Callable[[dict], list[int]]]] = {
    "dyn.nonzero": ("nonzero", lambda a: [], lambda a: []),
    "dyn.unique": ("unique", lambda a: [], lambda a: [_axis(a["axis"]), int(a["sort"])]),
    "dyn.non_max_suppression": ("non_max_suppression",
                                lambda a: [int(a["center_point_box"])], lambda a: []),
    "dyn.compress": ("compress", lambda a: [], lambda a: [_axis(a["axis"])]),
    "dyn.topk": ("topk", lambda a: [], lambda a: [a["axis"], int(a["largest"])]),
    "dyn.range": ("range", lambda a: [], lambda a: []),
    "dyn.reshape": ("reshape_to", lambda a: [], lambda a: [int(a["allowzero"])]),
    "dyn.expand": ("expand", lambda a: [], lambda a: []),
    "dyn.constant_of_shape": ("constant_of_shape", lambda a: [], lambda a: []),
    "dyn.tile": ("tile", lambda a: [], lambda a: []),
    "dyn.slice": ("slice", lambda a: [], lambda a: []),
}
#: ops whose builtin returns a tuple (one item per ONNX output; attr ``output`` picks one)
MULTI_OUTPUT = ("dyn.unique", "dyn.topk")


def is_dynamic(node: Expr) -> bool:
    """Whether ``node`` is a call of a data-dependent op."""
    return isinstance(node, Call) and node.op.name in _LAYOUT


def builtin_args(node: Call, tensors: list[int], constant) -> tuple[str, list[int]]:
    """The builtin (``vm.builtin.<name>``) and argument words of ``node`` over the words of
    its tensor arguments; ``constant(value, key)`` interns a constant pool entry."""
    name, before, after = _LAYOUT[node.op.name]
    words = [imm(v) for v in before(node.attrs)] + tensors
    if node.op.name == "dyn.constant_of_shape":
        value = np.array(node.attrs["value"], dtype=node.attrs["dtype"])
        words.append(const(constant(array(value), ("fill", value.dtype.str, value.tobytes()))))
    return "vm.builtin." + name, words + [imm(v) for v in after(node.attrs)]


def sibling_key(node: Call) -> tuple:
    """Calls with equal keys share one builtin call (the outputs of one Unique or TopK)."""
    attrs = tuple(sorted((k, repr(v)) for k, v in node.attrs.items()
                         if k not in ("output", "shape")))
    return (node.op.name, tuple(a.uid for a in node.args), attrs)


def label(node: Call) -> str:
    """The op and node, for run-time error messages."""
    where = f" (node '{node.span}')" if node.span else ""
    return f"{node.op.name}{where}"


def late_symbols_of(func: Function) -> list[SymVar]:
    """Every late symbol the data-dependent ops of ``func`` and its loops' scan outputs bind
    (branches and loop bodies included), once each, in order of appearance.

    Raises
    ------
    CompileError
        Two different symbols with one name.
    """
    found: dict[str, SymVar] = {}
    for f in _functions(func):
        for node in post_order(f.outputs):
            for s in bound_by(node):
                if found.setdefault(s.name, s) != s:
                    raise CompileError(f"late symbol {s.name} has two definitions "
                                       f"({found[s.name]!r} bounds differ)")
    return list(found.values())


def _functions(func: Function) -> list[Function]:
    out = [func]
    for node in post_order(func.outputs):
        if isinstance(node, IfCall):
            out += _functions(node.then_body) + _functions(node.else_body)
        elif isinstance(node, LoopCall):
            out += _functions(node.step) + _functions(node.body)
    return out


def depends_on(d, late: set[str]) -> bool:
    """Whether dim ``d`` involves a late symbol (named in ``late``)."""
    return not isinstance(d, int) and any(s.name in late for s in free_symbols(d))
