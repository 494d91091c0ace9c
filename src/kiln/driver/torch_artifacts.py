"""The torch.compile backend's way from dynamo's FX graph to a Kiln artifact: the graph with its
weights frozen (:func:`frozen_graph`), exported to ONNX (:func:`export_graph`), built and
cached by content (:func:`cached_build`). Used by :mod:`kiln.driver.torch_backend` (static
graphs) and :mod:`kiln.driver.torch_dynamic` (graphs with symbolic sizes).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from kiln.errors import KilnError
from kiln.frontend.pytorch import export_onnx, import_torch

logger = logging.getLogger("kiln")

#: built artifacts by (sha256 of the ONNX model, target, executor, bounds); least recently used
#: dropped first
_ARTIFACTS: OrderedDict[tuple, Any] = OrderedDict()
_ARTIFACTS_MAX = 32
_ARTIFACTS_LOCK = threading.Lock()


def is_weight(x: Any) -> bool:
    """Dynamo marks the parameters and buffers it lifts to graph inputs as static inputs."""
    return getattr(x, "_dynamo_static_input_type", None) is not None


def frozen_graph(gm: Any, inputs: list, weights: list[bool],
                 sizes: Mapping[int, tuple[int, int]] | None = None) -> Any:
    """A ``torch.nn.Module`` running ``gm`` with the weights among ``inputs`` as its buffers
    (they export as ONNX initializers); its ``forward`` takes the other tensors, whose
    positions among ``inputs`` are its ``runtime`` list. An int input ``k`` is
    ``inputs[j].shape[d]`` for ``sizes[k] == (j, d)`` (a symbolic size dynamo passes beside
    its tensor), else fixed to its value in ``inputs``."""
    torch = import_torch()
    sizes = dict(sizes or {})

    class Frozen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm
            self.fixed: dict[int, int] = {}
            self.runtime: list[int] = []
            for k, (x, weight) in enumerate(zip(inputs, weights)):
                if isinstance(x, torch.Tensor) and weight:
                    self.register_buffer(f"w{k}", x.detach())
                elif isinstance(x, torch.Tensor):
                    self.runtime.append(k)
                elif k not in sizes:
                    self.fixed[k] = int(x)

        def forward(self, *args: Any) -> Any:
            given = dict(zip(self.runtime, args))
            full = []
            for k in range(len(inputs)):
                if k in given:
                    full.append(given[k])
                elif k in sizes:
                    full.append(given[sizes[k][0]].shape[sizes[k][1]])
                elif k in self.fixed:
                    full.append(self.fixed[k])
                else:
                    full.append(getattr(self, f"w{k}"))
            return self.gm(*full)

    return Frozen()


def export_graph(frozen: Any, args: tuple, dynamic_shapes: tuple | None = None) -> Any:
    """``frozen`` exported to ONNX: with the TorchScript exporter (0.5-5 s where the dynamo one
    takes 7-15 s; tracing is safe on dynamo's straight-line graph), the dynamo exporter when
    that fails (static shapes only).

    Raises
    ------
    KilnError
        Both exporters failed (the dynamo one's reason), or the TorchScript one failed for a
        graph with ``dynamic_shapes``.
    """
    try:
        return export_onnx(frozen, args, dynamic_shapes, exporter="torchscript")
    except KilnError as err:
        if dynamic_shapes is not None:
            raise
        logger.info("torch.compile backend kiln: %s; trying the dynamo exporter", err)
        return export_onnx(frozen, args, exporter="dynamo")


def cached_build(model: Any, target: str | None, executor: str = "graph",
                 dim_bounds: Mapping[str, tuple] | None = None) -> Any:
    """``kiln.build`` of the ONNX ``model`` for ``target`` (default: the host's fastest), or
    the artifact built before for the same content, target, executor and bounds.

    Raises what :func:`kiln.frontend.onnx.from_onnx` and :func:`kiln.build` raise.
    """
    from kiln.driver.build_module import build
    from kiln.frontend.onnx.importer import from_onnx
    from kiln.target import default_target

    target = target or default_target()
    digest = hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    key = (digest, target, executor, tuple(sorted((dim_bounds or {}).items())))
    with _ARTIFACTS_LOCK:
        if key in _ARTIFACTS:
            _ARTIFACTS.move_to_end(key)
            return _ARTIFACTS[key]
    mod, params = from_onnx(model, dim_bounds=dim_bounds)
    artifact = build(mod, target=target, params=params, executor=executor)
    with _ARTIFACTS_LOCK:
        _ARTIFACTS[key] = artifact
        while len(_ARTIFACTS) > _ARTIFACTS_MAX:
            _ARTIFACTS.popitem(last=False)
    return artifact


def clear_cache() -> None:
    """Forget the built artifacts (tests; memory)."""
    with _ARTIFACTS_LOCK:
        _ARTIFACTS.clear()


def graph_outputs(gm: Any) -> list:
    """The example values (fake tensors) of ``gm``'s outputs, in order."""
    node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
    return [o.meta["example_value"] for o in outs]
