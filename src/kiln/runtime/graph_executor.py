"""The graph executor (TVM's ``GraphExecutor``, src/runtime/graph_executor/graph_executor.cc).

Creation does all the work once: parse the graph JSON, allocate one 64-byte-aligned pool per
``storage_id`` sized to the largest entry that shares it (entries are views into their pool:
SetupStorage), and build each ``tvm_op``'s ``TVMValue``/type-code arrays with the DLTensor
handles of its input entries then its output entries (SetupOpExecs). ``run()`` then only walks the
prebuilt calls. The executor is itself a module: ``get_function("set_input")`` etc., as in TVM,
which the user-facing wrapper ``kiln.graph_executor.GraphModule`` calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.graph_json import Graph, entry_nbytes, parse_graph, storage_pool_bytes
from kiln.runtime.module import Module
from kiln.runtime.ndarray import NDArray, array, cpu, empty, wrap_aligned
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.params import load_param_dict


def _copy_op(src: NDArray, dst: NDArray) -> Callable[[], None]:
    def run() -> None:
        dst.copyfrom(src)
    return run


def _python_op(func: PackedFunc, args: list[NDArray]) -> Callable[[], None]:
    # A kernel registered from Python (tests, BYOC prototypes): called with the same NDArrays.
    def run() -> None:
        func(*args)
    return run


class GraphExecutor(Module):
    """A ready-to-run graph over a module holding its kernels.

    Parameters
    ----------
    graph_json : str
        TVM graph JSON (shared reference, section 4).
    lib : Module
        Where ``func_name`` of each op is looked up (``get_function`` with imports).
    device : Device
        Must be the CPU.
    params : mapping of str to NDArray, optional
        Copied into their entries now; their names are not counted as inputs.

    Raises
    ------
    ModuleLoadError
        Malformed graph JSON, or storage larger than this machine's memory (checked before
        allocating; ``graph_json.storage_pool_bytes``).
    KilnError
        A kernel missing from ``lib``, a non-CPU device, a param name not in the graph, or
        storage that cannot be allocated.
    """

    type_key = "GraphExecutor"

    def __init__(self, graph_json: str, lib: Module, device: Any = None,
                 params: Mapping[str, NDArray | np.ndarray] | None = None):
        super().__init__()
        self.device = device if device is not None else cpu()
        self.device._check_cpu()
        self.graph: Graph = parse_graph(graph_json)
        if any(d != C.kDLCPU for d in self.graph.device_index):
            raise KilnError("graph JSON: device_index lists a non-CPU device; the Kiln runtime "
                            "runs on cpu only")
        self._lib = lib
        self._import_lib()
        self._entries = self._setup_storage()
        self._op_execs = self._setup_op_execs()
        g = self.graph
        self._name_to_nid = {g.nodes[nid].name: nid for nid in g.arg_nodes}
        params = dict(params or {})
        for name in params:
            if name not in self._name_to_nid:
                raise KilnError(f"param {name!r} is not an input of the graph")
        self.input_names = [g.nodes[n].name for n in g.arg_nodes if g.nodes[n].name not in params]
        self.param_names = [g.nodes[n].name for n in g.arg_nodes if g.nodes[n].name in params]
        # set_input indices: the inputs first (0..n-1), then the params.
        self._arg_order = self.input_names + self.param_names
        out_names = g.attrs.get("output_names")
        self.output_names: list[str] = (
            [str(n) for n in out_names[1]] if isinstance(out_names, list) and len(out_names) == 2
            and isinstance(out_names[1], list) and len(out_names[1]) == len(g.heads) else [])
        for name, value in params.items():
            self.set_input(name, value)
        self._functions: dict[str, Callable[..., Any]] = {
            "set_input": self.set_input, "get_input": self.get_input,
            "get_output": self.get_output, "run": self.run,
            "get_num_inputs": self.get_num_inputs, "get_num_outputs": self.get_num_outputs,
            "get_input_index": self.get_input_index, "load_params": self.load_params,
            "get_input_names": lambda: list(self.input_names),
            "get_output_names": lambda: list(self.output_names),
        }

    def _import_lib(self) -> None:
        # Keeps the library (and its dlopen handle) alive as long as the executor.
        self._imports.append(self._lib)

    # -- setup
    def _setup_storage(self) -> list[NDArray]:
        g = self.graph
        pool_bytes = storage_pool_bytes(g)  # checked against memory before allocating
        try:
            pools = {sid: empty((n,), "uint8", self.device) for sid, n in pool_bytes.items()}
        except MemoryError:
            raise KilnError(f"graph executor: cannot allocate {sum(pool_bytes.values())} bytes "
                            "of storage") from None
        entries = []
        for eid in range(g.num_entries):
            raw = pools[g.storage_id[eid]]._arr[:entry_nbytes(g, eid)]
            view = raw.view(g.dltype[eid]).reshape(g.shape[eid])
            entries.append(wrap_aligned(view, owner=pools[g.storage_id[eid]]))
        return entries

    def _setup_op_execs(self) -> list[Callable[[], None]]:
        g = self.graph
        execs: list[Callable[[], None]] = []
        for nid, node in enumerate(g.nodes):
            if node.op != "tvm_op":
                continue
            args = [self._entries[g.entry_id(src, idx)] for src, idx in node.inputs]
            args += [self._entries[g.entry_id(nid, k)] for k in range(node.num_outputs)]
            if str(node.attrs.get("flatten_data", "0")) == "1":
                args = [wrap_aligned(a._arr.reshape(-1), owner=a) for a in args]
            fname = node.func_name
            if fname == "__nop":
                continue
            if fname == "__copy":
                if len(args) != 2:
                    raise KilnError(f"graph node {nid} ({node.name}): __copy needs one input "
                                    "and one output")
                execs.append(_copy_op(args[0], args[1]))
                continue
            func = self._lib.get_function(fname, query_imports=True)
            if func is None:
                raise KilnError(f"graph node {nid} ({node.name}): function {fname!r} not found "
                                f"in module '{self._lib.type_key}' or its imports")
            if func.is_c_function:
                execs.append(func.prepare(*args))
            else:
                execs.append(_python_op(func, args))
        return execs

    # -- functions table
    def _get_own_function(self, name: str) -> PackedFunc | None:
        fn = self._functions.get(name)
        return PackedFunc(fn, name) if fn is not None else None

    def list_function_names(self) -> list[str]:
        return list(self._functions)

    # -- inputs
    def get_input_index(self, name: str) -> int:
        """Index of input (or param) ``name``; -1 when the graph has no such input (as TVM)."""
        try:
            return self._arg_order.index(name)
        except ValueError:
            return -1

    def _input_nid(self, key: int | str) -> int:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= key < len(self._arg_order):
                raise KilnError(f"input index {key} out of range: the graph has "
                                f"{len(self.input_names)} inputs {self.input_names}")
            key = self._arg_order[int(key)]
        nid = self._name_to_nid.get(str(key))
        if nid is None:
            raise KilnError(f"graph has no input named {key!r}; inputs: {self.input_names}"
                            + (f" (params: {self.param_names})" if self.param_names else ""))
        return nid

    def set_input(self, key: int | str, value: Any) -> None:
        """Copy ``value`` into input ``key`` (a name or an index).

        Raises
        ------
        KilnError
            Unknown name or index (the message lists the input names).
        ShapeError
            ``value``'s shape or dtype differs from the input's (names both).
        """
        nid = self._input_nid(key)
        entry = self._entries[self.graph.entry_id(nid)]
        name = self.graph.nodes[nid].name
        if isinstance(value, NDArray):
            src = value._arr
        elif isinstance(value, np.ndarray):
            src = value
        elif hasattr(value, "__dlpack__"):
            src = np.from_dlpack(value)
        else:  # Python scalars / lists take the input's dtype
            src = np.asarray(value, dtype=entry.dtype)
        if tuple(src.shape) != entry.shape or src.dtype.name != entry.dtype:
            raise ShapeError(f"input {name!r}: expected shape {entry.shape} dtype {entry.dtype}, "
                             f"got shape {tuple(src.shape)} dtype {src.dtype.name}")
        np.copyto(entry._arr, src)

    def get_input(self, key: int | str) -> NDArray:
        """A copy of input (or param) ``key``'s current value."""
        return array(self._entries[self.graph.entry_id(self._input_nid(key))])

    def load_params(self, data: bytes) -> None:
        """Set params from a ``save_param_dict`` blob; names the graph lacks are ignored (TVM)."""
        for name, value in load_param_dict(data).items():
            if name in self._name_to_nid:
                self.set_input(name, value)

    # -- run / outputs
    def run(self) -> None:
        """Run every op once, in graph order.

        Raises
        ------
        KilnError
            If a kernel fails (message from the library's error buffer).
        """
        for op in self._op_execs:
            op()

    def get_num_inputs(self) -> int:
        """Number of inputs, not counting params."""
        return len(self.input_names)

    def get_num_outputs(self) -> int:
        return len(self.graph.heads)

    def get_output(self, index: int | str) -> NDArray:
        """A **fresh copy** of output ``index`` (so it stays valid across later ``run`` calls).

        Raises
        ------
        KilnError
            Index out of range or unknown output name.
        """
        if isinstance(index, str):
            if index not in self.output_names:
                raise KilnError(f"graph has no output named {index!r}; outputs: "
                                f"{self.output_names}")
            index = self.output_names.index(index)
        if not 0 <= index < len(self.graph.heads):
            raise KilnError(f"output index {index} out of range: the graph has "
                            f"{len(self.graph.heads)} outputs")
        nid, idx = self.graph.heads[index]
        return array(self._entries[self.graph.entry_id(nid, idx)])

    def set_inputs(self, values: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """``set_input`` for each (name, value)."""
        items = values.items() if isinstance(values, Mapping) else values
        for k, v in items:
            self.set_input(k, v)
