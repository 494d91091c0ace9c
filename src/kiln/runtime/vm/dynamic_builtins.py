"""VM builtins of the data-dependent ops (decision 016): ``vm.builtin.nonzero`` and the rest.

Each runs the numpy definition of :mod:`kiln.runtime.dynamic_ops` on its tensor arguments and
returns a new 64-byte-aligned tensor (a tuple for Unique and TopK). The bytecode then binds
the result's data-dependent dims to their heap slots with ``vm.builtin.bind_shape``. Static
arguments are immediates: an axis (``-1``: none, the input flattened), flags (an optional
ONNX input that is absent arrives as an empty tensor, as the ONNX reference reads it). All
carry ``run.effect = "data"``:
a function calling them is never replayed from a recording.

| builtin | arguments | result |
|---|---|---|
| ``nonzero`` | x | int64 ``[rank, n]`` |
| ``unique`` | x, ``IMM`` axis, ``IMM`` sorted | (Y, indices, inverse_indices, counts) |
| ``non_max_suppression`` | ``IMM`` center_point_box, boxes, scores, max_out, iou, score | int64
``[n, 3]`` |
| ``compress`` | x, condition, ``IMM`` axis | selected slices |
| ``topk`` | x, k, ``IMM`` axis, ``IMM`` largest | (values, indices) |
| ``range`` | start, limit, delta | ``[n]`` |
| ``reshape_to`` | x, shape, ``IMM`` allowzero | a copy of x with that shape |
| ``expand`` | x, shape | broadcast copy |
| ``constant_of_shape`` | shape, value | filled tensor |
| ``tile`` | x, repeats | tiled copy |
| ``slice`` | x, starts, ends, axes, steps | the slice |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.runtime import dynamic_ops as D
from kiln.runtime.ndarray import NDArray, array

Run = Callable[[Any, list], Any]


def _arrays(name: str, args: list) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for i, v in enumerate(args):
        if type(v) is NDArray:
            out.append(v._arr)
        else:
            raise KilnError(f"vm.builtin.{name}: argument {i} is {type(v).__name__}, not a "
                            "tensor")
    return out


def _wrap(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(array(v) for v in value)
    return array(value)


def _tensor_op(name: str, fn: Callable[..., Any], ntensors: int, nimm: int = 0,
               first_imm: bool = False) -> Callable[[Any], Run]:
    """A factory for builtin ``name``: ``ntensors`` tensors and ``nimm`` immediates (after
    them, or first with ``first_imm``), passed to ``fn(*tensors, *immediates)``."""

    def factory(site: Any) -> Run:
        site.nargs(ntensors + nimm, ntensors + nimm)
        imm_pos = range(nimm) if first_imm else range(ntensors, ntensors + nimm)
        imms = [site.imm(i) for i in imm_pos]
        t0 = nimm if first_imm else 0

        def run(frame: Any, args: list) -> Any:
            tensors = _arrays(name, args[t0:t0 + ntensors])
            return _wrap(fn(*tensors, *imms))

        run.effect = "data"  # type: ignore[attr-defined]
        return run

    factory.__name__ = name
    factory.arity = (ntensors, nimm)  # type: ignore[attr-defined]  # the C twin's, checked
    return factory


def _axis(a: int) -> int | None:
    return None if a < 0 else a


DYNAMIC_BUILTINS: dict[str, Callable[[Any], Run]] = {
    "nonzero": _tensor_op("nonzero", D.nonzero, 1),
    "unique": _tensor_op("unique", lambda x, axis, srt: D.unique(x, _axis(axis), bool(srt)),
                         1, 2),
    "non_max_suppression": _tensor_op(
        "non_max_suppression",
        lambda b, s, m, iou, sc, center: D.non_max_suppression(b, s, m, iou, sc, center),
        5, 1, first_imm=True),
    "compress": _tensor_op("compress", lambda x, c, axis: D.compress(x, c, _axis(axis)), 2, 1),
    "topk": _tensor_op("topk", lambda x, k, axis, largest: D.topk(x, k, axis, bool(largest)),
                       2, 2),
    "range": _tensor_op("range", D.range_, 3),
    "reshape_to": _tensor_op("reshape_to",
                             lambda x, s, allowzero: D.reshape(x, s, bool(allowzero)).copy(),
                             2, 1),
    "expand": _tensor_op("expand", D.expand, 2),
    "constant_of_shape": _tensor_op("constant_of_shape", D.constant_of_shape, 2),
    "tile": _tensor_op("tile", D.tile, 2),
    "slice": _tensor_op("slice", D.slice_, 5),
}

__all__ = ["DYNAMIC_BUILTINS"]
