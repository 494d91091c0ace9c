"""EliminateCommonSubexpr: compute each distinct call once (TVM:
relay.transform.EliminateCommonSubexpr, src/relay/transforms/eliminate_common_subexpr.cc).

Two calls of the same op with the same attributes on the same (already deduplicated) arguments
are one value: the second is replaced by the first. ONNX exporters repeat work this way — every
MatMul of a transformer layer reshapes the same LayerNorm output to 2-D on its own, three
copies of one tensor per layer in MiniLM. Constants of equal dtype, shape and bytes are one
value as well. Ops the VM runs itself (``OpDef.runtime``: views,
traps, data-dependent ops, cache appends) are left alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from kiln.relay.graph import Call, Constant, Expr, Function, post_order, rewrite, same_call

name = "EliminateCommonSubexpr"


def eliminate_common_subexpr(func: Function) -> Function:
    """``func`` with repeated calls merged (see the module docstring); the first of each
    group of equal calls, in post order, is kept. Constants of equal contents are one too."""
    seen: dict[tuple, Expr] = {}

    def visit(call: Call, args: list[Expr]) -> Expr:
        new = same_call(call, args)
        if call.op.runtime:
            return new
        key = (call.op.name, tuple(a.uid for a in args), _attrs_key(call.attrs))
        return seen.setdefault(key, new)

    return rewrite(func, visit, leaves=_repeated_constants(func))


def _repeated_constants(func: Function) -> dict[int, Expr]:
    """Each Constant whose dtype, shape and bytes equal an earlier one's, mapped to that one
    (by uid). An unrolled recurrent layer's steps each had their own copy of the packed
    recurrent weight (AlterOpLayout packs a weight per use): ddddocr's CRNN carried 30 copies
    of a 4 MB matrix, and no step found the last one's in cache. Only constants sharing a
    dtype and shape with another are hashed."""
    groups: dict[tuple, list[Constant]] = {}
    for node in post_order(func.outputs):
        if isinstance(node, Constant):
            groups.setdefault((node.data.dtype.str, node.data.shape), []).append(node)
    leaves: dict[int, Expr] = {}
    for members in groups.values():
        first: dict[Any, Constant] = {}
        for c in members if len(members) > 1 else ():
            kept = first.setdefault(_value_key(c.data), c)
            if kept is not c:
                leaves[c.uid] = kept
    return leaves


def _attrs_key(attrs: dict[str, Any]) -> tuple:
    return tuple((k, _value_key(v)) for k, v in sorted(attrs.items()))


def _value_key(v: Any) -> Any:
    """A hashable stand-in for an attribute value: plain scalars with their type (``1`` and
    ``1.0`` differ), arrays by dtype, shape and a digest of their bytes (numpy's repr elides
    the middle of large arrays), anything else (symbolic dims) by its repr."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v).__name__, v)
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return ("array", v.shape, repr(v.tolist()))
        return ("array", v.dtype.str, v.shape, hashlib.sha256(v.tobytes()).hexdigest())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value_key(x) for x in v))
    if isinstance(v, dict):
        return ("dict", _attrs_key(v))
    return (type(v).__name__, repr(v))
