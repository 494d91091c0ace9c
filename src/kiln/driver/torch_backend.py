"""``torch.compile(model, backend="kiln")``: Kiln as a TorchDynamo backend.

TorchDynamo captures each graph of torch ops as an FX ``GraphModule`` and hands it, with example
inputs, to the backend, which returns the callable to run instead (TVM once had the same place:
``torch._dynamo.backends.tvm``). :func:`kiln_backend` exports the graph to ONNX
(:func:`kiln.frontend.pytorch.export_onnx`, with the graph's weights frozen into it), compiles it
with ``kiln.build`` for the host (default target: ``llvm -mcpu=native``) and returns a
:class:`KilnCompiledGraph` that runs it on torch tensors, without copies where the memory allows.

What the backend cannot take runs as PyTorch's own eager code, with one warning on the ``kiln``
logger naming the reason, and never an error: autograd (inputs that need gradients while grad
mode is on), non-CPU tensors, graphs that mutate their inputs or buffers (batch norm in training
mode), non-tensor outputs, an export or an op Kiln does not support.

Weights are frozen. Dynamo passes a module's parameters and buffers as graph inputs; the backend
binds their values at compile time (as ``torch._inductor.config.freezing`` does), so weights
changed in place afterwards are not seen: compile for inference, after loading the weights.

Shapes. A graph dynamo made dynamic (its inputs have symbolic sizes: a second call with another
batch size) becomes one VM artifact for all sizes (:mod:`kiln.driver.torch_dynamic`); where
that fails, it is compiled once per concrete input shape, on first use of that shape, each a
static artifact. Artifacts are cached by the ONNX model's content and the target
(:mod:`kiln.driver.torch_artifacts`), so graphs dynamo recompiles for another reason (a guard
on grad mode) do not compile again.

Registration: the entry point ``kiln = kiln.driver.torch_backend:kiln_backend`` in the group
``torch_dynamo_backends`` (pyproject.toml) lets ``backend="kiln"`` work without importing Kiln
first; importing this module also registers it where the entry point is not installed.

(docs/decisions/040-torch-frontend-through-onnx.md)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kiln.driver.torch_artifacts import (
    cached_build,
    export_graph,
    frozen_graph,
    graph_outputs,
    is_weight,
)
from kiln.driver.torch_graph_check import FallBack, check_graph
from kiln.errors import KilnError
from kiln.frontend.pytorch import export_reason, import_torch

logger = logging.getLogger("kiln")

BACKEND_NAME = "kiln"

#: the keys of ``torch.compile(..., options=...)`` the backend reads
OPTIONS = ("target",)


def kiln_backend(gm: Any, example_inputs: list, *, options: Mapping[str, Any] | None = None,
                 mode: str | None = None) -> Callable:
    """The TorchDynamo backend: compile ``gm`` with Kiln, or return ``gm.forward``.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The graph dynamo captured.
    example_inputs : list of torch.Tensor / int
        Its inputs (real tensors: parameters and buffers among them, marked by dynamo).
    options : dict, optional
        ``torch.compile(..., options={"target": "c"})``: the Kiln target (default
        :func:`kiln.target.default_target`).
    mode : str, optional
        ``torch.compile``'s ``mode`` (inductor's presets): ignored, Kiln has one.

    Returns
    -------
    callable
        A :class:`KilnCompiledGraph` (for a graph with symbolic sizes: a
        :class:`kiln.driver.torch_dynamic.KilnVMGraph`, else a :class:`KilnShapeSpecializer`),
        or ``gm.forward`` when Kiln cannot take the graph (logged on ``kiln``
        at WARNING level with the reason).

    Raises
    ------
    KilnError
        ``options`` has a key other than :data:`OPTIONS` (a mistake of the caller, not a graph
        Kiln cannot take).
    """
    unknown = sorted(set(options or {}) - set(OPTIONS))
    if unknown:
        raise KilnError(f"torch.compile backend kiln: unknown option(s) {unknown}; it takes "
                        f"{list(OPTIONS)}")
    target = (options or {}).get("target")
    try:
        check_graph(gm, example_inputs)
        if any(_is_symbolic(x) for x in example_inputs):
            return compile_dynamic(gm, example_inputs, target)
        return compile_graph(gm, example_inputs, target)
    except FallBack as why:
        return _eager(gm, str(why))
    except Exception as err:  # noqa: BLE001 (a backend must never break the user's program)
        return _eager(gm, export_reason(err))


def compile_dynamic(gm: Any, inputs: list, target: str | None) -> Callable:
    """A graph with symbolic sizes: one VM artifact for all sizes
    (:mod:`kiln.driver.torch_dynamic`), else a static artifact per size on first use."""
    from kiln.driver.torch_dynamic import compile_symbolic

    weights = [is_weight(x) for x in inputs]
    per_shape = KilnShapeSpecializer(gm, weights, target)
    try:
        return compile_symbolic(gm, inputs, target, weights, per_shape)
    except Exception as err:  # noqa: BLE001 (as kiln_backend: per shape still compiles)
        reason = str(err) if isinstance(err, FallBack) else export_reason(err)
        logger.info("torch.compile backend kiln: symbolic sizes: %s; compiling per shape",
                    reason)
        return per_shape


def _eager(gm: Any, reason: str) -> Callable:
    logger.warning("torch.compile backend kiln: the graph runs eagerly in PyTorch: %s", reason)
    return gm.forward


def _is_symbolic(x: Any) -> bool:
    torch = import_torch()
    if isinstance(x, torch.SymInt):
        return True
    return isinstance(x, int) and not isinstance(x, bool)


def compile_graph(gm: Any, inputs: list, target: str | None,
                  weights: list[bool] | None = None) -> KilnCompiledGraph:
    """``gm`` on these exact inputs, compiled: the weights (``weights[k]``: input ``k`` is a
    parameter or buffer; default: as dynamo marks them) frozen, int inputs baked in.

    Raises
    ------
    FallBack
        The ONNX graph's inputs are not the runtime tensors.
    KilnError
        Export, import or compile failures (the caller logs them).
    """
    torch = import_torch()
    if weights is None:
        weights = [is_weight(x) for x in inputs]
    frozen = frozen_graph(gm, inputs, weights)
    args = tuple(inputs[k] for k in frozen.runtime)
    model = export_graph(frozen, args)
    if len(model.graph.input) != len(args):
        raise FallBack(f"the ONNX graph has {len(model.graph.input)} inputs for {len(args)} "
                       "runtime tensors")
    compiled = KilnCompiledGraph(cached_build(model, target), frozen.runtime, torch)
    want = [(tuple(v.shape), v.dtype) for v in graph_outputs(gm)]
    static = all(type(d) is int for shape, _ in want for d in shape)  # (SymInts: per shape)
    if static and compiled.outputs != want:
        raise FallBack(f"the compiled graph's outputs {compiled.outputs} are not the graph's "
                       f"{want}")
    return compiled


class KilnCompiledGraph:
    """A compiled graph called as dynamo calls ``gm``: ``graph(*inputs) -> tuple of tensors``.

    Inputs (``runtime``: their positions among dynamo's inputs; the weights and ints are
    compiled in) are bound without a copy when C-contiguous and 64-byte aligned, as PyTorch's
    CPU allocator gives; the outputs are fresh tensors the kernels write into directly. One
    executor, used by one thread at a time (a lock).
    """

    def __init__(self, factory: Any, runtime: list[int], torch: Any):
        from kiln.graph_executor import GraphModule
        from kiln.runtime import cpu

        self.gmod = GraphModule(factory["default"](cpu()))
        self.runtime = runtime
        shapes, dtypes = self.gmod.get_output_info()
        self.outputs = [(tuple(shapes[n]), getattr(torch, dtypes[n])) for n in shapes]
        self.torch = torch
        self.lock = threading.Lock()

    def __call__(self, *inputs: Any) -> tuple:
        torch = self.torch
        outs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in self.outputs)
        with self.lock, torch.no_grad():
            for k, out in enumerate(outs):  # first: frees last call's outputs for the inputs
                self.gmod.set_output_zero_copy(k, out)
            for k, pos in enumerate(self.runtime):
                bind_input(self.gmod, k, inputs[pos])
            self.gmod.run()
        return outs


def bind_input(gmod: Any, index: int, tensor: Any) -> None:
    """Input ``index`` reads ``tensor``'s memory when it can (contiguous, 64-byte aligned), else
    gets a copy."""
    if tensor.is_contiguous() and tensor.data_ptr() % 64 == 0 and tensor.numel() > 0:
        try:
            gmod.set_input_zero_copy(index, tensor.detach())
            return
        except KilnError:
            pass  # e.g. memory the executor cannot alias: copy instead
    gmod.set_input(index, tensor.detach().contiguous().numpy())


class KilnShapeSpecializer:
    """A graph with symbolic sizes, compiled once per concrete input shape on first use (each a
    static Kiln artifact); a shape Kiln cannot compile runs eagerly (logged once)."""

    def __init__(self, gm: Any, weights: list[bool], target: str | None):
        self.gm = gm
        self.target = target
        self.weights = weights
        self.compiled: dict[tuple, Callable] = {}

    def __call__(self, *inputs: Any) -> Any:
        key = tuple(_shape_key(x) for x in inputs)
        if key not in self.compiled:
            try:
                self.compiled[key] = compile_graph(self.gm, list(inputs), self.target,
                                                   self.weights)
            except FallBack as why:
                self.compiled[key] = _eager(self.gm, f"shapes {key}: {why}")
            except Exception as err:  # noqa: BLE001 (as kiln_backend)
                self.compiled[key] = _eager(self.gm, f"shapes {key}: {export_reason(err)}")
        return self.compiled[key](*inputs)


def _shape_key(x: Any) -> Any:
    return (tuple(x.shape), str(x.dtype)) if hasattr(x, "shape") else int(x)


def register() -> None:
    """Register ``kiln_backend`` as ``backend="kiln"`` unless torch knows the name already
    (from the installed entry point, which then loads this module)."""
    torch = import_torch()
    if BACKEND_NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(kiln_backend, name=BACKEND_NAME)


register()
