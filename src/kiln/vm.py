"""``kiln.vm``: the user-facing VM for models with symbolic shapes (TVM's
``tvm.runtime.vm`` / ``python/tvm/runtime/relax_vm.py``).

Usage::

    lib = kiln.runtime.load_module("model.so")      # root: the VMExecutable
    vm = kiln.vm.VirtualMachine(lib, kiln.cpu())
    logits = vm["main"](input_ids, attention_mask)  # any allowed sequence length
    print(vm.profile("main", input_ids, attention_mask).table())

:class:`VirtualMachine` creates the runtime VM module (``vm_load_executable``) and initializes
it (``vm_initialization``), then calls it through its packed functions, as TVM's wrapper does.
Imports only ``kiln.runtime``.

May import: kiln.runtime (and kiln.errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.errors import KilnError
from kiln.runtime import Device, Module, NDArray, cpu
from kiln.runtime.vm.executable import VMExecutable
from kiln.runtime.vm.profile import BenchmarkResult, ProfileReport

#: TVM's allocator types (the Kiln VM's arena serves both)
NAIVE_ALLOCATOR = 1
POOLED_ALLOCATOR = 2


def _executable(lib_or_exec: Any) -> Module:
    if isinstance(lib_or_exec, VMExecutable):
        return lib_or_exec
    if isinstance(lib_or_exec, Module):
        if lib_or_exec.get_function("vm_load_executable") is not None:
            return lib_or_exec
        raise KilnError(f"VirtualMachine: module '{lib_or_exec.type_key}' has no VM executable "
                        "(was the model built for the graph executor? use "
                        "kiln.graph_executor.GraphModule)")
    raise KilnError(f"VirtualMachine expects a loaded module or a VMExecutable, got "
                    f"{type(lib_or_exec).__name__}")


class VirtualMachine:
    """Runs the VM functions of a compiled model.

    Parameters
    ----------
    lib_or_exec : Module or VMExecutable
        ``kiln.runtime.load_module("m.so")`` (whose root is the executable), or the executable.
    device : Device, optional
        ``kiln.cpu()`` (the default); other devices raise.
    alloc_type : int
        TVM's allocator type (1 naive, 2 pooled); both use the VM's arena.

    Raises
    ------
    KilnError
        Not a VM executable; a non-CPU device; a kernel named in the function table missing
        from the library.
    ModuleLoadError
        A call site of the bytecode that does not fit its builtin or callee.

    Notes
    -----
    Inputs are numpy arrays, NDArrays or DLPack tensors; C-contiguous, 64-byte-aligned ones of
    the right dtype are used in place (``kiln.runtime.empty`` / ``array`` give such memory),
    others are copied once per call. Results are fresh copies: storage is reused by the next
    call. Memory is bounded by the largest shape seen (:meth:`memory_stats`).
    Use one VirtualMachine from one thread at a time; several may share an executable.
    """

    def __init__(self, lib_or_exec: Any, device: Device | None = None,
                 alloc_type: int = POOLED_ALLOCATOR):
        exe = _executable(lib_or_exec)
        dev = device if device is not None else cpu()
        if not isinstance(dev, Device):
            raise KilnError(f"VirtualMachine: device must be a kiln Device, got "
                            f"{type(dev).__name__}")
        self.module: Module = exe["vm_load_executable"]()
        self.device = dev
        self.module["vm_initialization"](dev.device_type, dev.device_id, alloc_type)
        self._funcs: dict[str, Callable[..., Any]] = {}

    def __getitem__(self, name: str) -> Callable[..., Any]:
        """VM function ``name`` as a callable: ``vm["main"](*inputs)``.

        The callable takes the function's inputs in signature order and returns an NDArray, or
        a tuple of NDArrays for several outputs.

        Raises
        ------
        KilnError
            No such function; on call: a wrong number of inputs, an unsupported dtype, a kernel
            failure (its library's message).
        ShapeError
            On call: an input of the wrong dtype (a tensor is never converted: float64 data for a
            float32 input is refused, as onnxruntime does; Python scalars and lists take the
            input's dtype) or rank (a rank-0 input takes one element of any rank, as
            onnxruntime does), a dim that differs from the signature
            or from the same symbol in an earlier input, or a symbol outside its bounds or not
            a multiple of its divisor (the message names the input, the dim and the symbol).
        """
        fn = self._funcs.get(name)
        if fn is None:  # looked up once: vm["main"](x) in a loop costs no lookups
            if name not in self.module:
                raise KilnError(f"VM has no function {name!r}; functions: "
                                f"{self.module['get_function_names']()}")
            fn = self._funcs[name] = self.module[name]
        return fn

    def set_input(self, func_name: str, *args: Any, **kwargs: Any) -> None:
        """Keep copies of the inputs of ``func_name`` for :meth:`invoke_stateful`, positionally
        and/or by parameter name.

        Raises
        ------
        KilnError
            Unknown function, unknown parameter names, missing or extra inputs.
        ShapeError
            A tensor whose dtype is not its input's (not converted, as for :meth:`__getitem__`).
        """
        if kwargs:
            args = self._merge_kwargs(func_name, args, kwargs)
        self.module["set_input"](func_name, *args)

    def _merge_kwargs(self, func_name: str, args: tuple, kwargs: dict[str, Any]) -> tuple:
        exe = self.module.exe  # type: ignore[attr-defined]
        fidx = exe.func_index.get(func_name)
        if fidx is None:
            raise KilnError(f"VM has no function {func_name!r}")
        names = [p.name for p in exe.functions[fidx].params]
        values = list(args) + [None] * (len(names) - len(args))
        for key, value in kwargs.items():
            if key not in names:
                raise KilnError(f"{func_name!r} has no input {key!r}; inputs: {names}")
            values[names.index(key)] = value
        missing = [n for n, v in zip(names, values) if v is None]
        if missing:
            raise KilnError(f"{func_name!r}: inputs {missing} are not set")
        return tuple(values)

    def invoke_stateful(self, func_name: str) -> None:
        """Run ``func_name`` on the inputs given to :meth:`set_input`.

        Raises
        ------
        KilnError, ShapeError
            No inputs set; as for a direct call.
        """
        self.module["invoke_stateful"](func_name)

    def get_outputs(self, func_name: str) -> NDArray | tuple[NDArray, ...]:
        """The result of the last :meth:`invoke_stateful` of ``func_name``.

        Raises
        ------
        KilnError
            The function was not invoked statefully yet.
        """
        return self.module["get_outputs"](func_name)

    def time_evaluator(self, func_name: str, dev: Device | None = None, number: int = 10,
                       repeat: int = 1, min_repeat_ms: float = 0.0
                       ) -> Callable[..., BenchmarkResult]:
        """A timer of ``func_name`` (TVM's ``vm.time_evaluator``).

        Parameters
        ----------
        func_name : str
        dev : Device, optional
            The CPU.
        number : int
            Calls per measurement (a measurement is their mean).
        repeat : int
            Measurements.
        min_repeat_ms : float
            ``number`` is doubled until a measurement takes at least this long.

        Returns
        -------
        callable
            ``f(*inputs) -> BenchmarkResult`` (seconds: ``mean``, ``median``, ``min``,
            ``max``, ``std``, ``results``); without inputs it times :meth:`invoke_stateful`.
        """
        return self.module["time_evaluator"](func_name, dev, number, repeat, min_repeat_ms)

    def profile(self, func_name: str, *args: Any) -> ProfileReport:
        """Run ``func_name`` once with every kernel timed (microseconds, argument shapes, bytes
        read and written); ``report.table()`` prints it. Without inputs, uses
        :meth:`set_input`'s."""
        return self.module["profile"](func_name, *args)

    def memory_stats(self) -> dict[str, int]:
        """``{"storage_bytes", "peak_storage_bytes", "num_storages", "allocations"}``: the VM's
        storage arena, in bytes."""
        return self.module["memory_stats"]()

    def replay_stats(self) -> dict[str, int]:
        """``{"calls", "replays", "recordings", "interpreted", "guard_failures", "kept"}``:
        how many calls were served by recorded kernel sequences (any call of a function
        without control flow once it was traced; with data-dependent shapes, a call whose
        shapes are the traced ones: the others count in ``guard_failures`` and are
        interpreted)."""
        return self.module["replay_stats"]()


__all__ = ["NAIVE_ALLOCATOR", "POOLED_ALLOCATOR", "VirtualMachine"]
