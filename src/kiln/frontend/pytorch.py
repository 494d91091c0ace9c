"""PyTorch modules → graph IR through ONNX (TVM: ``relay.frontend.from_pytorch``).

``from_pytorch(module, example_inputs, dynamic_shapes=...)`` exports the module with
``torch.onnx.export`` into an in-memory ONNX model and imports that with
:func:`kiln.frontend.onnx.from_onnx`, so a PyTorch model gets exactly the ops, checks and error
messages an ONNX file gets (docs/decisions/040-torch-frontend-through-onnx.md).

PyTorch is an optional dependency (``pip install 'kiln[torch]'``): this module imports ``torch``
only when a function is called, so ``import kiln.frontend`` works without it.
"""

from __future__ import annotations

import inspect
import io
import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from kiln.errors import KilnError
from kiln.frontend.onnx.importer import from_onnx
from kiln.relay.graph import IRModule

logger = logging.getLogger("kiln")

#: the exporters ``exporter=`` names: torch.export + onnxscript (``dynamo=True``), the legacy
#: TorchScript tracer (``dynamo=False``), or "auto": dynamo when onnxscript is installed
EXPORTERS = ("auto", "dynamo", "torchscript")

#: the opset the TorchScript exporter writes (the dynamo exporter picks its own, 18+)
TORCHSCRIPT_OPSET = 17


def import_torch() -> Any:
    """``torch``, or a :class:`KilnError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise KilnError("this needs PyTorch, an optional dependency of Kiln: "
                        "pip install 'kiln[torch]'") from None
    return torch


def from_pytorch(module: Any, example_inputs: Any, dynamic_shapes: Any = None,
                 exporter: str = "auto") -> tuple[IRModule, dict[str, np.ndarray]]:
    """Convert a PyTorch module to a graph-IR module and its parameters.

    Parameters
    ----------
    module : torch.nn.Module
        The model, as it should run (call ``.eval()`` first for inference: dropout and batch
        norm are exported in the mode the module is in).
    example_inputs : torch.Tensor or tuple of torch.Tensor
        Positional inputs of ``module.forward``; their shapes and dtypes become the ONNX graph
        inputs' (named as ``forward``'s parameters).
    dynamic_shapes : dict or tuple, optional
        torch.export's convention: per input (by parameter name or position), ``{dim:
        torch.export.Dim(...)}``; e.g. ``{"x": {0: Dim("batch", min=1, max=64)}}``. Each Dim
        becomes a Kiln symbolic dim (:class:`kiln.arith.SymVar`) of its name with its bounds
        (one symbol for one Dim shared by several inputs), and the model compiles for the VM
        executor (``kiln.build`` chooses it). Default: all shapes static.
    exporter : str
        ``"dynamo"`` (``torch.onnx.export(dynamo=True)``: torch.export, needs onnxscript),
        ``"torchscript"`` (the legacy tracer, opset 17) or ``"auto"`` (default): dynamo when
        onnxscript is installed, else torchscript.

    Returns
    -------
    mod : IRModule
        As :func:`kiln.frontend.onnx.from_onnx`: ``mod["main"]``'s params are the inputs, then
        the weights.
    params : dict[str, np.ndarray]
        The weights (ONNX initializers) by name.

    Raises
    ------
    KilnError
        PyTorch is not installed; ``module`` is not a ``torch.nn.Module``; an input is not a
        tensor; ``dynamic_shapes`` names an input ``forward`` does not have; the export fails
        (the message has the exporter's reason).
    UnsupportedOpError, ShapeError
        From the ONNX import (an op Kiln does not support names op, node and opset).
    """
    model = export_onnx(module, example_inputs, dynamic_shapes, exporter)
    bounds = {name: bound for name, bound in dim_bounds(dynamic_shapes).items()
              if name in onnx_dim_params(model)}
    return from_onnx(model, dim_bounds=bounds)


def export_onnx(module: Any, example_inputs: Any, dynamic_shapes: Any = None,
                exporter: str = "auto") -> onnx.ModelProto:
    """``module`` exported to an in-memory ONNX model (``from_pytorch``'s first step).

    Parameters and errors as :func:`from_pytorch` (without the import's); ``module`` may also
    be a ``torch.export.ExportedProgram`` (the dynamo exporter; ``dynamic_shapes`` unused).
    """
    torch = import_torch()
    if exporter not in EXPORTERS:
        raise KilnError(f"unknown exporter {exporter!r}: expected one of {EXPORTERS}")
    if exporter == "auto":
        exporter = "dynamo" if _has_onnxscript() else "torchscript"
    args = _as_args(example_inputs, torch)
    if isinstance(module, torch.export.ExportedProgram) and exporter == "dynamo":
        return _export_dynamo(module, args, None, torch)  # (its shapes are decided)
    if not isinstance(module, torch.nn.Module):
        raise KilnError(f"from_pytorch needs a torch.nn.Module, got {type(module).__name__}")
    shapes = _positional_shapes(module, args, dynamic_shapes)
    with torch.no_grad():
        if exporter == "dynamo":
            return _export_dynamo(module, args, shapes, torch)
        return _export_torchscript(module, args, shapes, torch)


def _as_args(example_inputs: Any, torch: Any) -> tuple:
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(args, Sequence):
        raise KilnError("example_inputs must be a tensor or a tuple of tensors, got "
                        f"{type(example_inputs).__name__}")
    for k, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor):
            raise KilnError(f"example_inputs[{k}] is a {type(arg).__name__}, not a tensor")
    return tuple(args)


def forward_names(module: Any, count: int) -> list[str]:
    """The names of ``module.forward``'s first ``count`` positional parameters (the ONNX input
    names both exporters give), ``input_<k>`` past them (a ``*args`` forward)."""
    params = [p.name for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [params[k] if k < len(params) else f"input_{k}" for k in range(count)]


def _positional_shapes(module: Any, args: tuple, dynamic_shapes: Any) -> tuple | None:
    """``dynamic_shapes`` as a tuple with one entry per positional input: torch.export takes a
    dict only by parameter name, and the task's convention also allows positions."""
    if dynamic_shapes is None:
        return None
    names = forward_names(module, len(args))
    if isinstance(dynamic_shapes, Mapping):
        out: list[Any] = [None] * len(args)
        for key, dims in dynamic_shapes.items():
            pos = key if isinstance(key, int) else names.index(key) if key in names else None
            if pos is None or not 0 <= pos < len(args):
                raise KilnError(f"dynamic_shapes names input {key!r}, but the inputs are "
                                f"{names} (positions 0..{len(args) - 1})")
            out[pos] = dims
        return tuple(out)
    if len(dynamic_shapes) != len(args):
        raise KilnError(f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(args)} "
                        "inputs")
    return tuple(dynamic_shapes)


def dim_bounds(dynamic_shapes: Any) -> dict[str, tuple[int, int | None]]:
    """``{Dim name: (min, max)}`` of the ``torch.export.Dim``s in ``dynamic_shapes`` (``max``
    None when unbounded); the exporters write a Dim's name as the ONNX ``dim_param``."""
    entries = (dynamic_shapes.values() if isinstance(dynamic_shapes, Mapping)
               else dynamic_shapes or ())
    bounds: dict[str, tuple[int, int | None]] = {}
    for dims in entries:
        items = dims.values() if isinstance(dims, Mapping) else dims or ()
        for dim in items:
            name = getattr(dim, "__name__", None)
            if name is None or not hasattr(dim, "min"):
                continue  # None, Dim.AUTO / Dim.STATIC / Dim.DYNAMIC: no name, no bounds
            hi = dim.max if isinstance(dim.max, int) and dim.max < 2**62 else None
            bounds[name] = (max(1, int(dim.min)), hi)  # Kiln's dims are >= 1
    return bounds


def onnx_dim_params(model: onnx.ModelProto) -> set[str]:
    """The ``dim_param`` names of the model's graph inputs."""
    return {d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim
            if d.dim_param}


def _has_onnxscript() -> bool:
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def _export_dynamo(module: Any, args: tuple, shapes: tuple | None, torch: Any
                   ) -> onnx.ModelProto:
    try:
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=shapes,
                                    verbose=False, report=False)
    except Exception as err:  # noqa: BLE001 (torch.export raises many types; reported below)
        raise KilnError(f"torch.onnx.export (dynamo) failed: {export_reason(err)} (the "
                        "TorchScript tracer may take it: exporter='torchscript', which fixes "
                        "data-dependent control flow to the example's path)") from err
    return program.model_proto


def _export_torchscript(module: Any, args: tuple, shapes: tuple | None, torch: Any
                        ) -> onnx.ModelProto:
    names = forward_names(module, len(args))
    axes = {}
    for name, dims in zip(names, shapes or ()):
        items = dims.items() if isinstance(dims, Mapping) else enumerate(dims or ())
        named = {int(k): getattr(d, "__name__", None) or f"{name}_dim{k}" for k, d in items
                 if d is not None}
        if named:
            axes[name] = named
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings():  # its deprecation notices are about torch's API, not
            warnings.simplefilter("ignore", DeprecationWarning)  # about the caller's model
            torch.onnx.export(module, args, buffer, dynamo=False, input_names=names,
                              dynamic_axes=axes or None, opset_version=TORCHSCRIPT_OPSET)
    except Exception as err:  # noqa: BLE001 (the tracer raises many types; reported below)
        raise KilnError(f"torch.onnx.export (torchscript) failed: {export_reason(err)}") from err
    return onnx.load_from_string(buffer.getvalue())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def export_reason(err: BaseException, limit: int = 300) -> str:
    """One line saying why an export (or compile) failed: the innermost cause's type and the
    first line of its message (torch.onnx wraps the real reason in a long generic message)."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = [ln.strip() for ln in _ANSI.sub("", str(err)).splitlines() if ln.strip()]
    text = f"{type(err).__name__}: {lines[0] if lines else '(no message)'}"
    return text if len(text) <= limit else text[:limit - 3] + "..."
