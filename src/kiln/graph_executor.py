"""``kiln.graph_executor``: the user-facing graph executor (TVM's
``tvm.contrib.graph_executor``).

Usage::

    lib = kiln.runtime.load_module("model.so")
    gmod = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gmod.set_input("x", x)
    gmod.run()
    y = gmod.get_output(0).numpy()

    # per-node time and outputs, also on an exported library:
    dbg = kiln.debug_executor.GraphModuleDebug(lib["debug_create"]("default", kiln.cpu()))
    print(dbg.run(x=x, repeat=5).table())

:class:`GraphModule` wraps an executor *module* and calls it through its packed functions, as
TVM's wrapper does, so it works the same on any executor module. Lives outside
``kiln.runtime``'s internals but imports only ``kiln.runtime``.

May import: kiln.runtime (and kiln.errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln.errors import KilnError
from kiln.runtime import Device, Module, NDArray, cpu
from kiln.runtime.graph_executor.executor import GraphExecutor


class GraphModule:
    """Wrapper over a graph executor module.

    Parameters
    ----------
    module : Module
        An executor, e.g. ``factory["default"](kiln.cpu())``.

    Raises
    ------
    KilnError
        If ``module`` lacks the executor functions.

    Notes
    -----
    Use one GraphModule (one executor) from one thread at a time; different executors, from
    one factory or from several loaded libraries, may run concurrently in different threads
    (see ``kiln.runtime.GraphExecutor``).
    """

    def __init__(self, module: Module):
        if not isinstance(module, Module):
            raise KilnError(f"GraphModule expects an executor Module, got "
                            f"{type(module).__name__}")
        self.module = module
        self._set_input = module["set_input"]
        self._run = module["run"]
        self._get_output = module["get_output"]
        self._get_input = module["get_input"]
        self._get_num_outputs = module["get_num_outputs"]
        self._get_num_inputs = module["get_num_inputs"]
        self._get_input_index = module["get_input_index"]
        self._load_params = module["load_params"]

    def _optional(self, name: str) -> Any:
        # Functions added after TVM's first executor API: looked up on use, so a module
        # without them still works for the rest.
        return self.module[name]

    def set_input(self, key: int | str | None = None, value: Any = None, **params: Any) -> None:
        """Copy inputs into the executor: ``set_input("x", arr)``, ``set_input(0, arr)`` or
        ``set_input(x=arr, w=arr2)``. ``value``: numpy array or scalar, NDArray or DLPack
        producer with exactly the input's shape and dtype (never converted: float64 data for a
        float32 input is refused, as onnxruntime does), or a Python scalar or (nested) list,
        which takes the input's dtype.

        Raises
        ------
        KilnError
            Unknown name or index (the message lists the input names).
        ShapeError
            Shape or dtype differs (the message names the input, expected and given).
        """
        if key is not None:
            self._set_input(key, value)
        for name, val in params.items():
            self._set_input(name, val)

    def run(self, **inputs: Any) -> None:
        """Set ``inputs`` (if any) by name, then run the graph once.

        Raises
        ------
        KilnError
            If a kernel fails (its C error message is included).
        """
        if inputs:
            self.set_input(**inputs)
        self._run()

    def get_output(self, index: int | str, out: NDArray | None = None) -> NDArray:
        """A fresh copy of output ``index`` (valid after later runs too), or the output copied
        into ``out`` (returned) when given.

        Returns
        -------
        NDArray
            Shape and dtype of the graph's output ``index``.

        Raises
        ------
        KilnError
            Unknown output index or name.
        ShapeError
            ``out`` has another shape or dtype.
        """
        return self._get_output(index) if out is None else self._get_output(index, out)

    def run_from_inputs(self, inputs: Mapping[str, Any] | None = None,
                        **kwargs: Any) -> list[NDArray]:
        """Set ``inputs`` (a mapping and/or keywords, by name), run once, return copies of all
        outputs in order (TVM's ``run_from_inputs``).

        Raises
        ------
        KilnError, ShapeError
            As :meth:`set_input` and :meth:`run`.
        """
        args: list[Any] = [cpu()]
        for name, value in {**(inputs or {}), **kwargs}.items():
            args += [name, value]
        return list(self._optional("run_from_inputs")(*args))

    def set_input_zero_copy(self, key: int | str, value: Any) -> None:
        """Let the kernels read input ``key`` from ``value``'s memory, without copying
        (TVM's ``set_input_zero_copy``); ``value`` must be an NDArray, numpy array or DLPack
        tensor with exactly the input's shape and dtype, C-contiguous and 64-byte aligned
        (``kiln.runtime.empty`` / ``array`` give such memory).

        Raises
        ------
        KilnError
            Unknown input; unaligned, non-contiguous memory; memory overlapping a zero-copy
            output.
        ShapeError
            Shape or dtype differs.
        """
        self._optional("set_input_zero_copy")(key, value)

    def set_output_zero_copy(self, index: int | str, value: Any) -> None:
        """Let the kernel producing output ``index`` write into ``value``'s memory (TVM's
        ``set_output_zero_copy``); ``None`` ends the binding. Same requirements as
        :meth:`set_input_zero_copy`, and writable. See
        ``kiln.runtime.GraphExecutor.set_output_zero_copy`` for when a copy is made instead.

        Raises
        ------
        KilnError
            Unknown output; unaligned, non-contiguous or read-only memory; memory overlapping a
            zero-copy input, a shared param or another zero-copy output.
        ShapeError
            Shape or dtype differs.
        """
        self._optional("set_output_zero_copy")(index, value)

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """``(shape_dict, dtype_dict)`` of the graph inputs, params excluded (TVM's
        ``get_input_info``)."""
        info = self._optional("get_input_info")()
        return dict(info["shape"]), dict(info["dtype"])

    def get_output_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """``(shape_dict, dtype_dict)`` of the graph outputs, by output name (``output_<i>``
        when the graph has no names)."""
        info = self._optional("get_output_info")()
        return dict(info["shape"]), dict(info["dtype"])

    def share_params(self, other: GraphModule | Module, params_bytes: bytes) -> None:
        """Make this executor read the params named in ``params_bytes`` from ``other``'s
        memory, without copies (TVM's ``share_params``).

        Raises
        ------
        KilnError
            ``other`` is not a graph executor.
        ShapeError
            A param's shape or dtype differs between the two.
        """
        module = other.module if isinstance(other, GraphModule) else other
        self._optional("share_params")(module, params_bytes)

    def get_input(self, key: int | str) -> NDArray:
        """A copy of the current value of input ``key``."""
        return self._get_input(key)

    def get_num_inputs(self) -> int:
        """Number of graph inputs (params not counted)."""
        return self._get_num_inputs()

    def get_num_outputs(self) -> int:
        return self._get_num_outputs()

    def get_input_index(self, name: str) -> int:
        """Index of input ``name``, or -1."""
        return self._get_input_index(name)

    def load_params(self, params_bytes: bytes) -> None:
        """Set params from a ``kiln.runtime.save_param_dict`` blob."""
        self._load_params(params_bytes)

    def __getitem__(self, name: str) -> Any:
        return self.module[name]


def create(graph_json: str, lib: Module, device: Device | None = None, debug: bool = False,
           dump_root: str | None = None) -> GraphModule:
    """A GraphModule for ``graph_json`` over the kernels of ``lib`` (TVM's
    ``graph_executor.create``, and ``debugger.debug_executor.create`` with ``debug=True``);
    every null node is an input (no params bound).

    Parameters
    ----------
    graph_json : str
        TVM graph JSON.
    lib : Module
        Holds the kernels (a loaded library, a factory, a C source module tree).
    device : Device, optional
        The CPU (default).
    debug : bool
        Return a :class:`kiln.debug_executor.GraphModuleDebug` (per-node time and outputs).
    dump_root : str, optional
        With ``debug``: folder the per-node outputs are written to by ``run``.

    Raises
    ------
    ModuleLoadError
        Malformed graph JSON.
    KilnError
        A kernel named by the graph is missing from ``lib``.
    """
    if debug:
        from kiln.debug_executor import GraphModuleDebug
        from kiln.runtime.graph_executor.debug import GraphExecutorDebug

        return GraphModuleDebug(GraphExecutorDebug(graph_json, lib, device or cpu()), dump_root)
    return GraphModule(GraphExecutor(graph_json, lib, device or cpu()))


__all__ = ["GraphModule", "create"]
