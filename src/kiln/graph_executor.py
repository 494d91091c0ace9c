"""``kiln.graph_executor``: the user-facing graph executor (TVM's
``tvm.contrib.graph_executor``).

Usage::

    lib = kiln.runtime.load_module("model.so")
    gmod = kiln.graph_executor.GraphModule(lib["default"](kiln.cpu()))
    gmod.set_input("x", x)
    gmod.run()
    y = gmod.get_output(0).numpy()

:class:`GraphModule` wraps an executor *module* and calls it through its packed functions, as
TVM's wrapper does, so it works the same on any executor module. Lives outside
``kiln.runtime``'s internals but imports only ``kiln.runtime``.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import KilnError
from kiln.runtime import Device, Module, NDArray, cpu
from kiln.runtime.graph_executor import GraphExecutor


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

    def set_input(self, key: int | str | None = None, value: Any = None, **params: Any) -> None:
        """Copy inputs into the executor: ``set_input("x", arr)``, ``set_input(0, arr)`` or
        ``set_input(x=arr, w=arr2)``. ``value``: numpy array, NDArray or DLPack producer with
        exactly the input's shape and dtype.

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

    def get_output(self, index: int | str) -> NDArray:
        """A fresh copy of output ``index`` (valid after later runs too).

        Returns
        -------
        NDArray
            Shape and dtype of the graph's output ``index``.
        """
        return self._get_output(index)

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


def create(graph_json: str, lib: Module, device: Device | None = None) -> GraphModule:
    """A GraphModule for ``graph_json`` over the kernels of ``lib`` (TVM's
    ``graph_executor.create``); every null node is an input (no params bound).

    Raises
    ------
    ModuleLoadError
        Malformed graph JSON.
    KilnError
        A kernel named by the graph is missing from ``lib``.
    """
    return GraphModule(GraphExecutor(graph_json, lib, device or cpu()))


__all__ = ["GraphModule", "create"]
