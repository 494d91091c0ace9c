"""The ONNX nodes a graph JSON kernel node covers, read from its ``onnx_*`` attrs.

Written by the compiler (``kiln.relay.provenance.kernel_attrs``, docs/formats.md §4.1) so that
profiles and dumps speak in the model's terms: which ONNX nodes a fused kernel computes, and
which ONNX tensor its output holds, in which layout. A library built before these attrs (or a
graph not imported from ONNX) has none: :func:`onnx_source` returns None and profiles show the
kernel names alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import KilnError

_BLOCKED = re.compile(r"NCHW(\d+)c")


@dataclass(frozen=True)
class OnnxSource:
    """What one kernel node computes, in ONNX terms.

    Attributes
    ----------
    nodes, op_types : tuple of str
        Names and op types of the ONNX nodes the kernel covers, in graph order.
    output : str or None
        The ONNX tensor the kernel's output holds (None: an intermediate value, e.g. part of
        a node lowered to several kernels).
    layout : str
        ``""`` when the output is stored as the model has it, else the stored layout
        (``"NCHW8c"``: ``[N, C/8, H, W, 8]``, channels maybe padded past ``C``).
    shape : tuple of int
        The ONNX tensor's shape in the model's layout (with ``layout``; else empty).
    """

    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    output: str | None = None
    layout: str = ""
    shape: tuple[int, ...] = ()


def _json_list(attrs: dict[str, Any], key: str, where: str) -> list:
    try:
        value = json.loads(attrs[key])
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, list):
        raise KilnError(f"graph JSON {where}: attrs.{key} must be a JSON list in a string, got "
                        f"{str(attrs[key])[:80]!r}")
    return value


def onnx_source(attrs: dict[str, Any], where: str) -> OnnxSource | None:
    """The :class:`OnnxSource` of a node's ``attrs``; None when it has no ``onnx_nodes``.

    Raises
    ------
    KilnError
        Malformed ``onnx_*`` attrs (``where`` names the node).
    """
    if "onnx_nodes" not in attrs:
        return None
    nodes = [str(n) for n in _json_list(attrs, "onnx_nodes", where)]
    ops = ([str(o) for o in _json_list(attrs, "onnx_op_types", where)]
           if "onnx_op_types" in attrs else [""] * len(nodes))
    if len(ops) != len(nodes):
        raise KilnError(f"graph JSON {where}: {len(nodes)} onnx_nodes but {len(ops)} "
                        "onnx_op_types")
    layout = str(attrs.get("onnx_layout", ""))
    shape: tuple[int, ...] = ()
    if layout:
        if not _BLOCKED.fullmatch(layout):
            raise KilnError(f"graph JSON {where}: onnx_layout {layout!r} is not NCHW<c>c")
        shape = tuple(int(d) for d in _json_list(attrs, "onnx_shape", where))
    output = attrs.get("onnx_output")
    return OnnxSource(tuple(nodes), tuple(ops), None if output is None else str(output),
                      layout, shape)


def to_model_layout(value: np.ndarray, source: OnnxSource) -> np.ndarray:
    """A kernel's output as the model has it: ``[N, C/c, H, W, c]`` → ``[N, C, H, W]``
    (padded channels dropped) for an ``NCHW{c}c`` output, else ``value`` itself.

    Raises
    ------
    KilnError
        ``value``'s shape does not fit ``source.layout`` and ``source.shape``.
    """
    if not source.layout:
        return value
    block = int(_BLOCKED.fullmatch(source.layout).group(1))
    n, c, h, w = source.shape
    if value.ndim != 5 or value.shape[4] != block or value.shape[0] != n \
            or value.shape[2:4] != (h, w) or value.shape[1] * block < c:
        raise KilnError(f"ONNX tensor {source.output!r}: a {source.layout} value of shape "
                        f"{value.shape} cannot hold shape {source.shape}")
    nchw = value.transpose(0, 1, 4, 2, 3).reshape(n, value.shape[1] * block, h, w)
    return np.ascontiguousarray(nchw[:, :c])


def nodes_text(names: tuple[str, ...] | list[str], limit: int = 3) -> str:
    """``"Conv_12, Add_13, HardSwish_14"``; past ``limit`` names, ``"A, B, C +N more"``."""
    shown = ", ".join(names[:limit])
    return f"{shown} +{len(names) - limit} more" if len(names) > limit else shown


__all__ = ["OnnxSource", "nodes_text", "onnx_source", "to_model_layout"]
