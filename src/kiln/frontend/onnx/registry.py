"""The ONNX converter registry: ``@onnx_op("Conv", since=1)`` registers one converter version.

An op may have several versions where its semantics changed (e.g. Clip moved min/max from
attributes to inputs in opset 11); the importer picks the newest version whose ``since`` is at
most the model's default-domain opset.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.frontend.onnx.context import ConvertContext
    from kiln.relay.graph import Expr

    Converter = Callable[[ConvertContext], Expr | list[Expr]]

_CONVERTERS: dict[str, list[tuple[int, Callable]]] = {}


def onnx_op(op_type: str, since: int = 1) -> Callable[[Callable], Callable]:
    """Decorator: register a converter for ONNX ``op_type`` valid from opset ``since`` on.

    The converter receives a :class:`~kiln.frontend.onnx.context.ConvertContext` and returns the
    Expr of the node's first output, or a list with one Expr per output it can produce.
    """

    def wrap(fn: Callable) -> Callable:
        versions = _CONVERTERS.setdefault(op_type, [])
        assert since not in [s for s, _ in versions], f"{op_type} since {since} registered twice"
        bisect.insort(versions, (since, fn), key=lambda v: v[0])
        return fn

    return wrap


def find_converter(op_type: str, opset: int) -> Callable | None:
    """The converter of ``op_type`` for ``opset``: newest ``since <= opset``, or None."""
    best = None
    for since, fn in _CONVERTERS.get(op_type, []):
        if since <= opset:
            best = fn
    return best


def list_converters() -> dict[str, list[int]]:
    """Every registered ONNX op type with the ``since`` versions of its converters."""
    return {op: [s for s, _ in versions] for op, versions in sorted(_CONVERTERS.items())}
