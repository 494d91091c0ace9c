"""The graph executor (TVM's ``GraphExecutor``, src/runtime/graph_executor/graph_executor.cc).

Creation does all the work once: parse the graph JSON, set up the planned storage
(``graph_storage.GraphStorage``: one 64-byte-aligned pool per ``storage_id``, entries as views,
one ``DLTensor`` struct per entry) and build each ``tvm_op``'s ``TVMValue``/type-code arrays with
the DLTensor handles of its input entries then its output entries (SetupOpExecs). ``run()`` then
only walks the prebuilt calls. The executor is itself a module: ``get_function("set_input")``
etc., as in TVM, which the user-facing wrapper ``kiln.graph_executor.GraphModule`` calls.

Zero-copy I/O (``set_input_zero_copy`` / ``set_output_zero_copy``) re-points the entry's
DLTensor struct, which every kernel reading or writing the entry shares, so kernels use the
caller's memory directly. Where that would be wrong the executor copies instead, and says so in
the method docs: an output entry no kernel writes (a graph input or param that is also an output,
a ``__nop`` view), the second output bound to the same entry, and entries whose storage is shared
with another entry live at the same time (``GraphStorage.aliased``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.runtime import c_types as C
from kiln.runtime.graph_executor.call_batch import batch_calls
from kiln.runtime.graph_executor.graph_json import Graph, parse_graph
from kiln.runtime.graph_executor.storage import GraphStorage, overlaps
from kiln.runtime.module import Module
from kiln.runtime.ndarray import ALIGNMENT, Device, NDArray, array, cpu, is_aligned, wrap_aligned
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.params import load_param_dict, param_dict_names
from kiln.runtime.scalar_inputs import as_declared_scalar


def _copy_op(storage: GraphStorage, src: int, dst: int) -> Callable[[], None]:
    def run() -> None:
        np.copyto(storage.target[dst]._arr, storage.target[src]._arr)
    return run


def _python_op(func: PackedFunc, storage: GraphStorage, eids: list[int],
               flat: bool) -> Callable[[], None]:
    # A kernel registered from Python (tests, BYOC prototypes): called with NDArrays over the
    # entries' current memory (zero-copy bindings included).
    def run() -> None:
        func(*[storage.flat_view(e) if flat else storage.target[e] for e in eids])
    return run


def zero_copy_view(value: Any, what: str, writable: bool = False) -> NDArray:
    """An NDArray over ``value``'s own memory, for zero-copy binding (never a copy).

    Parameters
    ----------
    value : NDArray, numpy.ndarray or DLPack producer
    what : str
        Names the input or output in error messages.
    writable : bool
        Require writable memory (outputs).

    Raises
    ------
    KilnError
        ``value`` is another kind of object, not C-contiguous, not 64-byte aligned, or read-only
        when ``writable``.
    """
    if isinstance(value, NDArray):
        return value
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        arr = np.from_dlpack(value)
    else:
        raise KilnError(f"{what}: zero-copy needs an NDArray, a numpy array or a DLPack tensor, "
                        f"got {type(value).__name__}")
    if not arr.flags.c_contiguous:
        raise KilnError(f"{what}: zero-copy needs C-contiguous memory")
    if not is_aligned(arr):
        raise KilnError(f"{what}: zero-copy needs {ALIGNMENT}-byte aligned memory, got address "
                        f"0x{arr.ctypes.data:x} (use kiln.runtime.empty / array)")
    if writable and not arr.flags.writeable:
        raise KilnError(f"{what}: zero-copy output memory is read-only")
    try:
        C.dtype_name(arr.dtype)
    except KilnError as err:
        raise KilnError(f"{what}: {err}") from None
    return wrap_aligned(arr, owner=value)


class GraphExecutor(Module):
    """A ready-to-run graph over a module holding its kernels.

    Parameters
    ----------
    graph_json : str
        TVM graph JSON (docs/formats.md §4).
    lib : Module
        Where ``func_name`` of each op is looked up (``get_function`` with imports).
    device : Device
        Must be the CPU.
    params : mapping of str to NDArray, optional
        Values of params; their names are not counted as inputs.
    copy_params : bool
        True: copy ``params`` into the executor's own storage (TVM). False: kernels read the
        given NDArrays in place, read-only, so executors created from one factory hold the
        params once (an entry whose storage is shared with a live entry is copied anyway).

    Raises
    ------
    ModuleLoadError
        Malformed graph JSON, or storage larger than this machine's memory (checked before
        allocating; ``graph_json.storage_pool_bytes``).
    KilnError
        A kernel missing from ``lib``, a non-CPU device, a param name not in the graph, or
        storage that cannot be allocated.
    ShapeError
        A param whose shape or dtype differs from the graph's.

    Notes
    -----
    Threads: an executor holds mutable state (its storage, bindings, prebuilt argument arrays),
    so use each executor from **one thread at a time**. Any number of executors, from one
    factory or several libraries, may run concurrently in different threads: the module tree is
    only read, kernels release the GIL, and each library's error message buffer is
    thread-local. Params shared between executors (``copy_params=False``,
    :meth:`share_params`) are only read by kernels.
    """

    type_key = "GraphExecutor"

    def __init__(self, graph_json: str, lib: Module, device: Device | None = None,
                 params: Mapping[str, NDArray | np.ndarray] | None = None,
                 copy_params: bool = True):
        super().__init__()
        self.device = device if device is not None else cpu()
        self.device._check_cpu()
        self.graph: Graph = parse_graph(graph_json)
        if any(d != C.kDLCPU for d in self.graph.device_index):
            raise KilnError("graph JSON: device_index lists a non-CPU device; the Kiln runtime "
                            "runs on cpu only")
        self._lib = lib
        self._import_lib()
        self._storage = GraphStorage(self.graph, self.device)
        self._op_execs: list[Callable[[], None]] = []
        self._op_nids: list[int] = []
        self._op_written: set[int] = set()
        self._setup_op_execs()
        self._batched_ops = batch_calls(self._op_execs)  # same calls, fewer trips through ctypes
        # bindings: entry → caller's array (zero-copy inputs, shared params); output index →
        # (caller's array, written in place?); copies done around run() where not in place.
        self._in_bind: dict[int, NDArray] = {}
        self._out_bind: dict[int, tuple[NDArray, bool]] = {}
        self._pre_copies: list[tuple[np.ndarray, np.ndarray]] = []
        self._post_copies: list[tuple[np.ndarray, int]] = []
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
            if copy_params or not isinstance(value, NDArray):
                self.set_input(name, value)
            else:
                self._bind_shared(self._name_to_nid[name], value, f"param {name!r}")
        self._functions: dict[str, Callable[..., Any]] = {
            "set_input": self.set_input, "get_input": self.get_input,
            "set_input_zero_copy": self.set_input_zero_copy,
            "set_output_zero_copy": self.set_output_zero_copy,
            "get_output": self.get_output, "run": self.run,
            "run_from_inputs": self.run_from_inputs,
            "get_num_inputs": self.get_num_inputs, "get_num_outputs": self.get_num_outputs,
            "get_input_index": self.get_input_index, "load_params": self.load_params,
            "share_params": self.share_params,
            "get_input_info": self.get_input_info, "get_output_info": self.get_output_info,
            "get_input_names": lambda: list(self.input_names),
            "get_output_names": lambda: list(self.output_names),
        }

    def _import_lib(self) -> None:
        # Keeps the library (and its dlopen handle) alive as long as the executor.
        self._imports.append(self._lib)

    # -- setup
    def _setup_op_execs(self) -> None:
        g, st = self.graph, self._storage
        for nid, node in enumerate(g.nodes):
            if node.op != "tvm_op" or node.func_name == "__nop":
                continue
            outs = [g.entry_id(nid, k) for k in range(node.num_outputs)]
            eids = [g.entry_id(src, idx) for src, idx in node.inputs] + outs
            flat = str(node.attrs.get("flatten_data", "0")) == "1"
            fname = node.func_name
            op: Callable[[], None]
            if fname == "__copy":
                if len(eids) != 2:
                    raise KilnError(f"graph node {nid} ({node.name}): __copy needs one input "
                                    "and one output")
                op = _copy_op(st, eids[0], eids[1])
            else:
                func = self._lib.get_function(fname, query_imports=True)
                if func is None:
                    raise KilnError(f"graph node {nid} ({node.name}): function {fname!r} not "
                                    f"found in module '{self._lib.type_key}' or its imports")
                if func.is_c_function:
                    op = func.prepare(*[st.tensor(e, flat) for e in eids])
                else:
                    op = _python_op(func, st, eids, flat)
            self._op_execs.append(op)
            self._op_nids.append(nid)
            self._op_written.update(outs)

    # -- functions table
    def _get_own_function(self, name: str) -> PackedFunc | None:
        fn = self._functions.get(name)
        return PackedFunc(fn, name) if fn is not None else None

    def list_function_names(self) -> list[str]:
        return list(self._functions)

    # -- lookups
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

    def _output_index(self, index: int | str) -> int:
        if isinstance(index, str):
            if index not in self.output_names:
                raise KilnError(f"graph has no output named {index!r}; outputs: "
                                f"{self.output_names}")
            return self.output_names.index(index)
        if not 0 <= index < len(self.graph.heads):
            raise KilnError(f"output index {index} out of range: the graph has "
                            f"{len(self.graph.heads)} outputs")
        return int(index)

    def _output_label(self, index: int) -> str:
        return (f"output {index} ({self.output_names[index]!r})" if self.output_names
                else f"output {index}")

    def _head_eid(self, index: int) -> int:
        return self.graph.entry_id(*self.graph.heads[index])

    def _value(self, eid: int) -> NDArray:
        """Entry ``eid``'s current data (a bound input's caller array, else the kernels' view)."""
        bound = self._in_bind.get(eid)
        return bound if bound is not None else self._storage.target[eid]

    def _check_entry(self, arr: NDArray | np.ndarray, eid: int, what: str) -> None:
        shape, dtype = self.graph.shape[eid], self.graph.dltype[eid]
        given = np.dtype(arr.dtype).name
        if tuple(arr.shape) != shape or given != dtype:
            hint = f" (arrays are not converted: cast with .astype({dtype!r}))" \
                if given != dtype else ""
            raise ShapeError(f"{what}: expected shape {shape} dtype {dtype}, got shape "
                             f"{tuple(arr.shape)} dtype {given}{hint}")

    # -- bindings
    def _rebuild_copies(self) -> None:
        st = self._storage
        self._pre_copies = [(st.pool_view[e]._arr, a._arr) for e, a in self._in_bind.items()
                            if st.target[e] is not a]
        self._post_copies = [(a._arr, self._head_eid(i)) for i, (a, in_place)
                             in self._out_bind.items() if not in_place]

    def _check_overlap(self, arr: NDArray, what: str, is_output: bool,
                       skip_output: int | None = None) -> None:
        others = [(self._output_label(i), a) for i, (a, _) in self._out_bind.items()
                  if i != skip_output]
        if is_output:
            names = {self.graph.entry_id(n): self.graph.nodes[n].name for n in self.graph.arg_nodes}
            others += [(f"input {names.get(e, e)!r}", a) for e, a in self._in_bind.items()]
        for label, other in others:
            if overlaps(arr, other):
                raise KilnError(f"{what}: its memory overlaps the zero-copy {label}; kernels "
                                "would read data they are overwriting")

    def _unbind_input(self, eid: int) -> None:
        if self._in_bind.pop(eid, None) is not None:
            self._storage.reset(eid)
            self._rebuild_copies()

    def _bind_shared(self, nid: int, arr: NDArray, what: str) -> None:
        """Let kernels read ``arr`` (a param of a factory or another executor) in place."""
        eid = self.graph.entry_id(nid)
        self._check_entry(arr, eid, what)
        self._unbind_input(eid)
        if self._storage.aliased[eid]:  # cannot be shared: copy once
            np.copyto(self._storage.pool_view[eid]._arr, arr._arr)
            return
        self._storage.repoint(eid, arr)
        self._in_bind[eid] = arr
        self._rebuild_copies()

    # -- inputs
    def set_input(self, key: int | str, value: Any) -> None:
        """Copy ``value`` into input ``key`` (a name or an index).

        A zero-copy binding of the input (or a shared param) is released first: the value is
        copied into the executor's own storage and the caller's previous array is left alone.
        An NDArray, numpy array or scalar, or DLPack tensor must have the input's dtype (it is
        not converted, as onnxruntime refuses float64 data for a float32 input); Python scalars
        and lists take the input's dtype. A rank-0 input takes a one-element tensor of any rank
        (:mod:`kiln.runtime.scalar_inputs`).

        Raises
        ------
        KilnError
            Unknown name or index (the message lists the input names).
        ShapeError
            ``value``'s shape or dtype differs from the input's (names both).
        """
        nid = self._input_nid(key)
        eid = self.graph.entry_id(nid)
        name = self.graph.nodes[nid].name
        if isinstance(value, NDArray):
            src = value._arr
        elif isinstance(value, (np.ndarray, np.generic)):  # (a numpy scalar keeps its dtype)
            src = np.asarray(value)
        elif hasattr(value, "__dlpack__"):
            src = np.from_dlpack(value)
        else:  # Python scalars / lists take the input's dtype (onnxruntime converts lists)
            src = np.asarray(value, dtype=self.graph.dltype[eid])
        src = as_declared_scalar(src, len(self.graph.shape[eid]), f"input {name!r}")
        self._check_entry(src, eid, f"input {name!r}")
        self._unbind_input(eid)
        np.copyto(self._storage.pool_view[eid]._arr, src)

    def set_input_zero_copy(self, key: int | str, value: Any) -> None:
        """Make the kernels read input ``key`` straight from ``value``'s memory (no copy).

        Later changes to ``value`` are seen by later runs; ``value`` is kept alive by the
        executor until the input is set again (``set_input`` copies and ends the binding).
        If the input's storage is shared with another live entry (only foreign graph JSON
        does that), ``value`` is instead copied in at the start of every run.

        Parameters
        ----------
        key : int or str
            Input (or param) name or index.
        value : NDArray, numpy.ndarray or DLPack producer
            Exactly the input's shape (a rank-0 input: one element, of any rank) and dtype,
            C-contiguous, 64-byte aligned.

        Raises
        ------
        KilnError
            Unknown input; memory not aligned or not contiguous; memory overlapping a
            zero-copy output.
        ShapeError
            Shape or dtype differs from the input's.
        """
        nid = self._input_nid(key)
        eid = self.graph.entry_id(nid)
        what = f"input {self.graph.nodes[nid].name!r}"
        arr = as_declared_scalar(zero_copy_view(value, what), len(self.graph.shape[eid]), what)
        self._check_entry(arr, eid, what)
        self._check_overlap(arr, what, is_output=False)
        self._unbind_input(eid)
        if not self._storage.aliased[eid]:
            self._storage.repoint(eid, arr)
        self._in_bind[eid] = arr
        self._rebuild_copies()

    def get_input(self, key: int | str) -> NDArray:
        """A copy of input (or param) ``key``'s current value."""
        return array(self._value(self.graph.entry_id(self._input_nid(key))))

    def get_input_info(self) -> dict[str, dict[str, Any]]:
        """Inputs (params excluded) as ``{"shape": {name: shape}, "dtype": {name: dtype}}``
        (TVM's ``get_input_info`` packed function)."""
        eids = [self.graph.entry_id(self._name_to_nid[n]) for n in self.input_names]
        return self._info(self.input_names, eids)

    def get_output_info(self) -> dict[str, dict[str, Any]]:
        """Outputs as ``{"shape": {name: shape}, "dtype": {name: dtype}}``; names are the
        model's output names, else ``output_<i>``."""
        n = len(self.graph.heads)
        names = self.output_names or [f"output_{i}" for i in range(n)]
        return self._info(names, [self._head_eid(i) for i in range(n)])

    def _info(self, names: list[str], eids: list[int]) -> dict[str, dict[str, Any]]:
        g = self.graph
        return {"shape": {n: g.shape[e] for n, e in zip(names, eids)},
                "dtype": {n: g.dltype[e] for n, e in zip(names, eids)}}

    def load_params(self, data: bytes) -> None:
        """Set params from a ``save_param_dict`` blob (copied, as ``set_input``); names the
        graph lacks are ignored (TVM).

        Raises
        ------
        ModuleLoadError
            A corrupt blob.
        ShapeError
            A param whose shape or dtype differs from the graph's.
        """
        for name, value in load_param_dict(data).items():
            if name in self._name_to_nid:
                self.set_input(name, value)

    def share_params(self, other: Module, params_bytes: bytes) -> None:
        """Read the params named in ``params_bytes`` from ``other``'s memory, without copies
        (TVM's ``GraphExecutor::ShareParams``; only the names in the blob are read).

        Both executors then read the same arrays: a later ``set_input`` of such a param on
        either one gives that executor its own copy again.

        Parameters
        ----------
        other : GraphExecutor
            An executor of the same graph (or one with the same param names, shapes, dtypes).
        params_bytes : bytes
            A ``save_param_dict`` blob; names not in both graphs are ignored.

        Raises
        ------
        KilnError
            ``other`` is not a graph executor.
        ShapeError
            A param's shape or dtype differs between the two graphs.
        ModuleLoadError
            A corrupt blob header.
        """
        if not isinstance(other, GraphExecutor):
            raise KilnError(f"share_params: expected a graph executor module, got "
                            f"{type(other).__name__}")
        for name in param_dict_names(params_bytes):
            if name in self._name_to_nid and name in other._name_to_nid:
                src = other._value(other.graph.entry_id(other._name_to_nid[name]))
                self._bind_shared(self._name_to_nid[name], src, f"param {name!r}")

    # -- outputs
    def set_output_zero_copy(self, index: int | str, value: Any) -> None:
        """Make the kernel that produces output ``index`` write into ``value``'s memory.

        ``None`` ends the binding. The output is written in place (no copy) when a kernel
        produces it; it is copied into ``value`` at the end of each run when no kernel writes it
        (a graph input or param that is also an output, a ``__nop`` view), when another output
        index bound first is the same entry, or when its storage is shared with another live
        entry. Other entries that share the output's planned storage keep using the pool.

        Parameters
        ----------
        index : int or str
            Output index or name.
        value : NDArray, numpy.ndarray or DLPack producer, or None
            Exactly the output's shape and dtype, C-contiguous, 64-byte aligned, writable.

        Raises
        ------
        KilnError
            Unknown output; memory not aligned, not contiguous or read-only; memory overlapping
            a zero-copy input, a shared param or another zero-copy output.
        ShapeError
            Shape or dtype differs from the output's.
        """
        index = self._output_index(index)
        eid = self._head_eid(index)
        what = self._output_label(index)
        arr = None
        if value is not None:
            arr = zero_copy_view(value, what, writable=True)
            self._check_entry(arr, eid, what)
            self._check_overlap(arr, what, is_output=True, skip_output=index)
        old = self._out_bind.pop(index, None)
        if old is not None and old[1]:
            self._storage.reset(eid)
        self._rebuild_copies()
        if arr is None:
            return
        in_place = (eid in self._op_written and not self._storage.aliased[eid]
                    and not any(p and self._head_eid(i) == eid
                                for i, (_, p) in self._out_bind.items()))
        if in_place:
            self._storage.repoint(eid, arr)
        self._out_bind[index] = (arr, in_place)
        self._rebuild_copies()

    def get_num_inputs(self) -> int:
        """Number of inputs, not counting params."""
        return len(self.input_names)

    def get_num_outputs(self) -> int:
        return len(self.graph.heads)

    def get_output(self, index: int | str, out: NDArray | None = None) -> NDArray:
        """A **fresh copy** of output ``index`` (so it stays valid across later ``run`` calls),
        or, with ``out``, the output copied into ``out`` (returned).

        Raises
        ------
        KilnError
            Index out of range or unknown output name.
        ShapeError
            ``out``'s shape or dtype differs from the output's.
        """
        value = self._value(self._head_eid(self._output_index(index)))
        return array(value) if out is None else out.copyfrom(value)

    # -- run
    def _run_prologue(self) -> None:
        for dst, src in self._pre_copies:
            np.copyto(dst, src)

    def _run_epilogue(self) -> None:
        for dst, eid in self._post_copies:
            np.copyto(dst, self._value(eid)._arr)

    def run(self) -> None:
        """Run every op once, in graph order.

        Raises
        ------
        KilnError
            If a kernel fails (message from the library's error buffer).
        """
        self._run_prologue()
        for op in self._batched_ops:
            op()
        self._run_epilogue()

    def run_from_inputs(self, *args: Any) -> list[NDArray]:
        """Set inputs, run, return copies of all outputs (TVM's ``run_from_inputs``).

        Parameters
        ----------
        *args
            ``(device, key0, value0, key1, value1, ...)``: the device the outputs are returned
            on (the CPU), then input names or indices and values, as for ``set_input``.

        Returns
        -------
        list of NDArray
            Every output, in order.

        Raises
        ------
        KilnError
            An odd number of key/value arguments, or any ``set_input`` / ``run`` error.
        """
        if not args or not isinstance(args[0], Device):
            raise KilnError("run_from_inputs: the first argument must be the device "
                            "(kiln.cpu()) for the outputs")
        args[0]._check_cpu()
        pairs = args[1:]
        if len(pairs) % 2:
            raise KilnError("run_from_inputs: inputs must come as key, value pairs")
        for k in range(0, len(pairs), 2):
            self.set_input(pairs[k], pairs[k + 1])
        self.run()
        return [self.get_output(i) for i in range(len(self.graph.heads))]

    def set_inputs(self, values: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """``set_input`` for each (name, value)."""
        items = values.items() if isinstance(values, Mapping) else values
        for k, v in items:
            self.set_input(k, v)

    def __repr__(self) -> str:
        return (f"<kiln.runtime.{type(self).__name__} inputs={self.input_names} "
                f"outputs={len(self.graph.heads)} ops={len(self._op_execs)}>")
