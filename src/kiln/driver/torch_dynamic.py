"""Graphs dynamo made dynamic, as one Kiln VM artifact for every size.

When a compiled function sees a second size, dynamo captures the graph again with symbolic
sizes: each such tensor dim is a symbol (``s77``), and the graph takes the symbols' values as
extra int inputs. :func:`compile_symbolic` names each symbol's dim in the ONNX export (the
exporter's ``dynamic_axes``), so that it becomes a Kiln symbolic dim, with the value range
dynamo's shape environment knows for it as bounds, and builds the model for the VM. The int
inputs are computed from the tensors' shapes inside the exported module, so the artifact takes
the tensors only. Where a symbol is no tensor dim, or the export or build fails, the caller
compiles per shape instead (:class:`kiln.driver.torch_backend.KilnShapeSpecializer`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kiln.driver.torch_artifacts import cached_build, export_graph, frozen_graph
from kiln.driver.torch_graph_check import FallBack
from kiln.errors import KilnError
from kiln.frontend.pytorch import import_torch, onnx_dim_params

logger = logging.getLogger("kiln")


def compile_symbolic(gm: Any, inputs: list, target: str | None, weights: list[bool],
                     fallback: Callable) -> KilnVMGraph:
    """``gm``, whose placeholders' fake tensors have symbolic sizes, as one VM artifact.

    Parameters
    ----------
    gm, inputs, target : as :func:`kiln.driver.torch_backend.kiln_backend`'s.
    weights : list of bool
        ``weights[k]``: input ``k`` is a parameter or buffer (frozen into the artifact).
    fallback : callable
        What runs a call the VM refuses (sizes outside the bounds it was built for).

    Raises
    ------
    FallBack
        A symbolic int input that is no dim of a tensor input, a dim that is an expression.
    KilnError
        Export, import or build failures.
    """
    torch = import_torch()
    sizes, shapes, bounds = symbolic_sizes(gm, inputs, weights)
    frozen = frozen_graph(gm, inputs, weights, sizes)
    args = tuple(inputs[k] for k in frozen.runtime)
    dims = tuple({d: torch.export.Dim(name) for d, name in shapes.get(k, {}).items()}
                 for k in frozen.runtime)
    model = export_graph(frozen, args, dims)
    if len(model.graph.input) != len(args):
        raise FallBack(f"the ONNX graph has {len(model.graph.input)} inputs for {len(args)} "
                       "runtime tensors")
    named = onnx_dim_params(model)
    exe = cached_build(model, target, "vm", {n: b for n, b in bounds.items() if n in named})
    return KilnVMGraph(exe, frozen.runtime, fallback)


def symbolic_sizes(gm: Any, inputs: list, weights: list[bool]
                   ) -> tuple[dict[int, tuple[int, int]], dict[int, dict[int, str]], dict]:
    """Where ``gm``'s symbols live.

    Returns
    -------
    sizes : ``{int input k: (tensor input j, dim d)}`` — the int is ``inputs[j].shape[d]``
    shapes : ``{tensor input j: {dim d: symbol name}}``
    bounds : ``{symbol name: (lo, hi)}`` from dynamo's shape environment (``hi`` None:
        unbounded)
    """
    torch = import_torch()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    shapes: dict[int, dict[int, str]] = {}
    where: dict[str, tuple[int, int]] = {}
    bounds: dict[str, tuple] = {}
    for j, (node, x) in enumerate(zip(placeholders, inputs)):
        value = node.meta.get("example_value")
        if not isinstance(x, torch.Tensor) or weights[j] or value is None:
            continue
        for d, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt):
                name = _symbol(size, f"input {j} dim {d}")
                shapes.setdefault(j, {})[d] = name
                where.setdefault(name, (j, d))
                bounds[name] = _bounds(size)
    sizes = {}
    for k, x in enumerate(inputs):
        if isinstance(x, torch.SymInt):
            name = _symbol(x, f"input {k}")
            if name not in where:
                raise FallBack(f"symbolic int input {k} ({name}) is no tensor input's size")
            sizes[k] = where[name]
    return sizes, shapes, bounds


def _symbol(size: Any, what: str) -> str:
    expr = size.node.expr
    if not expr.is_Symbol:
        raise FallBack(f"{what} has the symbolic size {expr}, an expression")
    return str(expr)


def _bounds(size: Any) -> tuple[int, int | None]:
    """The value range dynamo's shape environment holds for ``size``'s symbol (dynamo
    specializes sizes 0 and 1, so a dynamic dim starts at 2), as Kiln dim bounds."""
    try:
        rng = size.node.shape_env.var_to_range[size.node.expr]
        lo, hi = int(rng.lower), str(rng.upper)
    except (AttributeError, KeyError, TypeError, ValueError):
        return (1, None)
    high = int(hi) if hi.lstrip("-").isdigit() and int(hi) < 2**62 else None
    return (max(1, lo), high)


class KilnVMGraph:
    """The VM artifact called as dynamo calls ``gm``: the tensors at ``runtime`` positions in,
    a tuple of tensors out (Kiln's arrays seen by torch through DLPack, no copy). A call the VM
    refuses (sizes outside the bounds) goes to ``fallback``, logged once."""

    def __init__(self, exe: Any, runtime: list[int], fallback: Callable):
        from kiln.runtime import cpu
        from kiln.vm import VirtualMachine

        self.vm = VirtualMachine(exe, cpu())
        self.runtime = runtime
        self.fallback = fallback
        self.refused = False
        self.lock = threading.Lock()

    def __call__(self, *inputs: Any) -> tuple:
        torch = import_torch()
        arrays = [inputs[k].detach().contiguous().numpy() for k in self.runtime]
        try:
            with self.lock:
                out = self.vm["main"](*arrays)
        except KilnError as err:
            if not self.refused:
                logger.info("torch.compile backend kiln: the VM refused sizes %s (%s); "
                            "compiling for them", [a.shape for a in arrays], err)
                self.refused = True
            return self.fallback(*inputs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(torch.from_dlpack(o) for o in outs)
