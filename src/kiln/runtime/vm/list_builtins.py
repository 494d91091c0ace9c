"""VM builtins that collect a run-time loop's scan outputs (decision 015, "Control flow at run
time"): ``vm.builtin.list_new``, ``list_append``, ``list_stack``.

An ONNX ``Loop`` stacks one element per iteration of each scan output along a new axis 0,
over a count known only once the loop has run. As onnxruntime does, the bytecode keeps a list
per scan output: ``list_new`` before the loop, ``list_append`` of a *copy* of the element
after each body run (the body's arena, where the element lives, is reused by the next
iteration), and ``list_stack`` after the loop, whose result's leading dim then binds the
loop's count symbol (``vm.builtin.bind_shape``). Memory is O(total elements), not O(count²).

| builtin | arguments | result |
|---|---|---|
| ``list_new`` | (none) | an empty accumulator |
| ``list_append`` | accumulator, tensor | (none): the tensor's copy appended |
| ``list_stack`` | accumulator, ``CONST`` label, ``CONST`` dtype, elem dims (``IMM``/``HEAP``)... |
a new tensor ``[count, *dims]`` (``[0, *dims]`` when empty) |

Every one carries ``run.effect = "data"``: a function that runs them is interpreted on every
call, never replayed from a recording (its loop runs a data-dependent number of times).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.ndarray import NDArray, array
from kiln.runtime.vm.bytecode import HEAP, IMM

Run = Callable[[Any, list], Any]


class ScanList(list):
    """The accumulator of one scan output: numpy copies of its per-iteration elements."""


def _list(v: Any, builtin: str) -> ScanList:
    if type(v) is not ScanList:
        raise KilnError(f"vm.builtin.{builtin}: argument 0 is {type(v).__name__}, not a list "
                        "made by vm.builtin.list_new")
    return v


def list_new(site: Any) -> Run:
    """``list_new()``: an empty accumulator (one per scan output, made before the loop)."""
    site.nargs(0, 0)

    def run(frame: Any, args: list) -> ScanList:
        return ScanList()

    run.effect = "data"  # type: ignore[attr-defined]
    return run


def list_append(site: Any) -> Run:
    """``list_append(list, tensor)``: append a copy of the tensor (its storage is reused by
    the next iteration)."""
    site.nargs(2, 2)

    def run(frame: Any, args: list) -> None:
        acc, t = _list(args[0], "list_append"), args[1]
        if type(t) is not NDArray:
            raise KilnError(f"vm.builtin.list_append: argument 1 is {type(t).__name__}, not a "
                            "tensor")
        acc.append(t._arr.copy())

    run.effect = "data"  # type: ignore[attr-defined]
    return run


def list_stack(site: Any) -> Run:
    """``list_stack(list, CONST label, CONST dtype, dims...)``: the elements stacked along a
    new axis 0, a new tensor of shape ``[len(list), *dims]``. Raises ShapeError naming
    ``label`` (the loop's node and scan output) when an element's shape or dtype is not
    ``dims``/``dtype``."""
    site.nargs(3)
    label = site.str_const(1, "label")
    try:
        dtype = C.dtype_name(site.str_const(2, "dtype string"))
    except KilnError as err:
        raise site.fail(str(err)) from None
    for i in range(3, len(site.args)):
        if site.args[i][0] not in (IMM, HEAP):
            raise site.fail(f"argument {i} must be an immediate or a heap slot")

    def run(frame: Any, args: list) -> NDArray:
        acc = _list(args[0], "list_stack")
        dims = tuple(args[3:])
        for it, e in enumerate(acc):
            if e.shape != dims or str(e.dtype) != dtype:
                raise ShapeError(f"{label}: iteration {it} gave {e.dtype}{list(e.shape)}, "
                                 f"expected {dtype}{list(dims)} (one type for every iteration)")
        if any(d < 0 for d in dims):
            raise ShapeError(f"{label}: negative element dims {list(dims)}")
        return array(np.stack(acc) if acc else np.zeros((0, *dims), dtype))

    run.effect = "data"  # type: ignore[attr-defined]
    return run


LIST_BUILTINS: dict[str, Callable[[Any], Run]] = {
    f.__name__: f for f in (list_new, list_append, list_stack)}

__all__ = ["LIST_BUILTINS", "ScanList"]
