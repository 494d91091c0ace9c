"""What ``torch.compile(backend="kiln")`` can take: :func:`check_graph` raises :class:`FallBack`
(the graph then runs eagerly) for what a compiled Kiln graph would get wrong.

A Kiln artifact computes fresh outputs from its inputs: it cannot give autograd a graph, run
on another device, or write into its inputs. The ONNX exporters drop a write into an input
(``x.add_(1)``, ``x[0] = 1``, batch norm updating its running stats in training mode) without
a word, and the TorchScript one even performs it once while tracing, so writes are found here,
on dynamo's FX graph, before anything is exported: an in-place op (a method or function whose
name ends in ``_``, ``inplace=True``, ``out=``, item assignment, training-mode batch norm) whose
target shares storage with a graph input. Dynamo's ``example_value`` fake tensors keep the
inputs' storages through views, so a view of an input counts as the input; in-place ops on
intermediate tensors (torchvision's ``ReLU(inplace=True)``) are fine, the exporters
functionalize them.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

from kiln.frontend.pytorch import import_torch


class FallBack(Exception):
    """The graph runs eagerly; the message says why (one line)."""


def check_graph(gm: Any, example_inputs: list) -> None:
    """Raise :class:`FallBack` naming the first reason ``gm`` cannot be compiled (module
    docstring); return None when it can."""
    torch = import_torch()
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise FallBack("inputs require grad and grad mode is on (Kiln compiles inference "
                       "graphs; call the model under torch.no_grad() or torch.inference_mode())")
    devices = sorted({t.device.type for t in tensors} - {"cpu"})
    if devices:
        raise FallBack(f"tensors on {', '.join(devices)} (Kiln's backend runs on CPU)")
    inputs = {_storage(n) for n in gm.graph.nodes if n.op == "placeholder"} - {None}
    for node in gm.graph.nodes:
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            values = [getattr(o, "meta", {}).get("example_value") for o in outs]
            if not outs or not all(isinstance(v, torch.Tensor) for v in values):
                raise FallBack("the graph returns values that are not tensors")
        written = _written(node)
        if written is not None and _storage(written) in inputs:
            raise FallBack(f"node {node.name} ({_what(node)}) writes into a graph input or "
                           "weight in place")
        if _trains_batch_norm(node):
            raise FallBack(f"node {node.name}: batch norm in training mode updates its running "
                           "statistics (call model.eval())")


def _storage(node: Any) -> Any:
    """A key of the storage of ``node``'s example value (fake tensor), or None."""
    torch = import_torch()
    value = getattr(node, "meta", {}).get("example_value")
    if not isinstance(value, torch.Tensor):
        return None
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(value.untyped_storage())


def _written(node: Any) -> Any:
    """The FX node whose tensor ``node`` writes into in place, or None."""
    if node.op not in ("call_method", "call_function") or not node.args:
        return None
    first = node.args[0]
    if node.op == "call_method":
        name = str(node.target)
        inplace = name.endswith("_") and not name.startswith("__") or name == "__setitem__"
        return first if inplace else None
    target = node.target
    if target is operator.setitem:
        return first
    if "out" in node.kwargs:
        return node.kwargs["out"]
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.startswith("__"):
        return first
    return first if _bound(node).get("inplace") is True else None


def _bound(node: Any) -> dict:
    """``node``'s arguments by parameter name, where its function has a Python signature."""
    try:
        return dict(inspect.signature(node.target).bind(*node.args, **node.kwargs).arguments)
    except (TypeError, ValueError):
        return {}


def _trains_batch_norm(node: Any) -> bool:
    torch = import_torch()
    if node.op != "call_function" or node.target is not torch.nn.functional.batch_norm:
        return False
    args = _bound(node)
    return bool(args.get("training")) and args.get("running_mean") is not None


def _what(node: Any) -> str:
    return str(node.target) if node.op == "call_method" else getattr(node.target, "__name__",
                                                                      str(node.target))
