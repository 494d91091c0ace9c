"""``GraphExecutorFactoryModule``: graph JSON + params + the kernel library, as one module
(TVM's src/runtime/graph_executor/graph_executor_factory.cc and
python/tvm/contrib/graph_executor_factory... ``relay.build``'s result).

It is binary-serializable (type_key ``GraphExecutorFactory``) and imports the library, so it is
the usual root of an exported artifact. Serialized form (docs/formats.md §6)::

    string graph_json | u64 n | vec<string> names | n × NDArray | string module_name
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.binary_module import register_module_loader
from kiln.runtime.graph_executor.executor import GraphExecutor
from kiln.runtime.graph_executor.graph_json import parse_graph
from kiln.runtime.module import Module
from kiln.runtime.ndarray import Device, NDArray, cpu
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.params import read_ndarray, to_ndarray_dict, write_ndarray
from kiln.runtime.stream import StreamReader, StreamWriter

TYPE_KEY = "GraphExecutorFactory"


class GraphExecutorFactoryModule(Module):
    """Creates graph executors for one compiled model.

    Parameters
    ----------
    graph_json : str
        TVM graph JSON (docs/formats.md §4); validated now.
    lib : Module
        The module holding the kernels (a ``CSourceModule`` tree, or a loaded library).
    params : mapping of str to numpy array or NDArray
        Constant inputs by name (numpy arrays are copied into aligned NDArrays once); every
        executor created reads them in place.
    module_name : str
        Name of the creation function (TVM: ``"default"``).

    Notes
    -----
    Functions: ``<module_name>(device) → executor module``, ``debug_create(module_name,
    device)``, ``get_graph_json()``, ``get_graph_params() → {name: NDArray}`` (the factory's own
    arrays, shared read-only by its executors), ``get_lib()``, ``remove_params()``.

    Raises
    ------
    ModuleLoadError
        If ``graph_json`` is malformed.
    """

    type_key = TYPE_KEY
    is_binary_serializable = True

    def __init__(self, graph_json: str, lib: Module | None,
                 params: Mapping[str, np.ndarray | NDArray] | None = None,
                 module_name: str = "default"):
        super().__init__()
        parse_graph(graph_json)  # fail at build time, not at first use
        self.graph_json = graph_json
        self.params: dict[str, NDArray] = to_ndarray_dict(params)
        self.module_name = module_name
        if lib is not None:
            self.import_module(lib)

    @property
    def lib(self) -> Module:
        """The kernel library (the first import).

        Raises
        ------
        KilnError
            If the factory has no library (a blob whose import tree was not linked).
        """
        if not self._imports:
            raise KilnError(f"{TYPE_KEY} module has no kernel library imported")
        return self._imports[0]

    # TVM's Python-side names
    libmod_name = property(lambda self: self.module_name)

    def get_lib(self) -> Module:
        return self.lib

    def get_graph_json(self) -> str:
        return self.graph_json

    def get_params(self) -> dict[str, NDArray]:
        return dict(self.params)

    get_graph_params = get_params

    def create(self, device: Device | None = None) -> GraphExecutor:
        """A new executor on ``device`` (default cpu(0)), TVM's ``<module_name>(device)``.

        Each executor has its own storage for inputs, intermediates and outputs; the params
        are **not** copied: every executor's kernels read this factory's param arrays in place
        (read-only), so creating executors does not grow memory by the params' size. (TVM copies
        them into each executor; its ``remove_params`` workaround is kept below.) A ``set_input``
        or ``load_params`` of a param on one executor gives that executor its own copy.

        Raises
        ------
        KilnError
            A kernel missing from the library, a non-CPU device.
        """
        return GraphExecutor(self.graph_json, self.lib, device or cpu(), self.params,
                             copy_params=False)

    def debug_create(self, module_name: str | None = None,
                     device: Device | None = None) -> GraphExecutor:
        """A debug executor (per-node timing and outputs) with the params, as :meth:`create`
        (TVM's factory ``debug_create(module_name, device)``).

        Raises
        ------
        KilnError
            ``module_name`` is not this factory's name.
        """
        from kiln.runtime.graph_executor.debug import GraphExecutorDebug

        if isinstance(module_name, Device):  # debug_create(device)
            module_name, device = None, module_name
        if module_name is not None and module_name != self.module_name:
            raise KilnError(f"debug_create: this factory is {self.module_name!r}, not "
                            f"{module_name!r}")
        return GraphExecutorDebug(self.graph_json, self.lib, device or cpu(), self.params,
                                  copy_params=False)

    def remove_params(self) -> GraphExecutorFactoryModule:
        """A factory over the same graph and library without params (TVM's ``remove_params``):
        export it and ship the params separately (``save_param_dict`` / ``load_params``)."""
        return GraphExecutorFactoryModule(self.graph_json, self.lib, {}, self.module_name)

    def _functions(self) -> dict[str, Callable[..., Any]]:
        return {
            self.module_name: self.create,
            "debug_create": self.debug_create,
            "get_graph_json": self.get_graph_json,
            "get_graph_params": self.get_params,
            "get_lib": self.get_lib,
            "remove_params": self.remove_params,
        }

    def _get_own_function(self, name: str) -> PackedFunc | None:
        fn = self._functions().get(name)
        return PackedFunc(fn, name) if fn is not None else None

    def missing_function_hint(self, name: str) -> str:
        # usually "vm_load_executable": a program written for VM libraries
        return ("this is a graph executor library (static shapes): run it with "
                f"kiln.graph_executor.GraphModule(lib[{self.module_name!r}](kiln.cpu())) (from C "
                "or C++: see examples/deploy_c; `kiln compile --executor vm` builds a VM library)")

    def list_function_names(self) -> list[str]:
        return list(self._functions())

    def save_to_binary(self) -> bytes:
        w = StreamWriter()
        w.string(self.graph_json)
        names = list(self.params)
        w.u64(len(names))
        w.vec_str(names)
        for name in names:
            write_ndarray(w, self.params[name])
        w.string(self.module_name)
        return w.getvalue()

    @staticmethod
    def load_from_binary(data: bytes) -> GraphExecutorFactoryModule:
        """Inverse of :meth:`save_to_binary` (the library is linked later, as an import).

        Raises
        ------
        ModuleLoadError
            Truncated or corrupt bytes, or malformed graph JSON.
        """
        r = StreamReader(data, f"{TYPE_KEY} module")
        graph_json = r.string("graph_json")
        n = r.u64("param count")
        names = r.vec_str("param names")
        if n != len(names):
            raise r.error(f"corrupt: {n} params but {len(names)} names")
        params = {name: read_ndarray(r, f"param {name!r}") for name in names}
        module_name = r.string("module_name")
        if r.remaining:
            raise r.error(f"{r.remaining} unexpected trailing bytes")
        return GraphExecutorFactoryModule(graph_json, None, params, module_name)

    def __repr__(self) -> str:
        return (f"<kiln.runtime.GraphExecutorFactoryModule {self.module_name!r} "
                f"params={len(self.params)} imports={len(self._imports)}>")


register_module_loader(TYPE_KEY, GraphExecutorFactoryModule.load_from_binary, override=True,
                       zero_copy=True)
