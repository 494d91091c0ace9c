"""ONNX's backend interface for Kiln (``onnx.backend.base.Backend``), as every ONNX backend has.

With it ONNX's own conformance runner drives Kiln::

    import onnx.backend.test
    from kiln.driver import onnx_backend as kiln_backend

    globals().update(onnx.backend.test.BackendTest(kiln_backend, __name__).test_cases)

``prepare(model)`` imports the model (so an unsupported op raises
:class:`~kiln.errors.UnsupportedOpError` there) and returns a :class:`KilnBackendRep`;
``rep.run(inputs)`` compiles the model for the inputs' shapes on first use (cached per shape)
and runs it with the graph executor.

Inputs needed at compile time. Kiln compiles static graphs: a converter that needs the value of
an input (Reshape's shape, Pad's pads, TopK's k, reduction axes...) reads it as a constant.
When that value comes from a graph input, the importer raises
:class:`~kiln.frontend.onnx.context.NotConstantError` naming the inputs it depends on; the rep
then binds exactly those inputs, with the values given to ``run``, as initializers and imports
again. Such a compiled model is specialized to those values: it is cached under them, and other
values compile again (docs/decisions/009-onnx-backend-conformance.md).

Data-dependent shapes (docs/decisions/016-data-dependent-shapes.md). Where such a value is data,
the converters of Reshape, Expand, ConstantOfShape, Tile, Slice, Compress, TopK and Range make
the op data-dependent instead (one VM artifact for every value); NonZero, Unique and
NonMaxSuppression always are. The rep tries that first; when the graph then cannot be typed,
converted or compiled (e.g. a Range's late length meeting a ConstantOfShape's in an Add: two
symbols that do not broadcast; an If whose branches then differ), it imports again with
:func:`~kiln.frontend.onnx.context.static_values_only` and binds the inputs as above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from kiln.errors import CompileError, KilnError, ShapeError, UnsupportedOpError
from kiln.frontend.onnx.context import NotConstantError, static_values_only
from kiln.frontend.onnx.importer import MAX_OPSET, from_onnx, model_opset

DEFAULT_TARGET = "c"


class KilnBackendRep(BackendRep):
    """A prepared model: compiles on first :meth:`run` for the given input shapes.

    Parameters
    ----------
    model : onnx.ModelProto
        A checked model.
    target : str
        Kiln target string (``"c"``, ``"llvm"``...).
    """

    def __init__(self, model: onnx.ModelProto, target: str = DEFAULT_TARGET):
        self.model = model
        self.target = target
        inits = {init.name for init in model.graph.initializer}
        self.input_names = [v.name for v in model.graph.input if v.name not in inits]
        self.bound: set[str] = set()  # inputs that compile as constants (see module docstring)
        self.static_values = False  # data-dependent ops failed: bind inputs instead
        self._compiled: dict[tuple, Any] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the model.

        Parameters
        ----------
        inputs : list of np.ndarray (graph inputs in order), dict by name, or one array.

        Returns
        -------
        tuple of np.ndarray
            The graph outputs in order, with the dtypes and shapes the model declares.

        Raises
        ------
        UnsupportedOpError, ShapeError, CompileError, KilnError
            From importing or compiling the model for these inputs.
        """
        values = self._as_dict(inputs)
        gmod = self._executor(values)
        for name in self.input_names:
            if name not in self.bound:
                gmod.set_input(name, values[name])
        gmod.run()
        return tuple(gmod.get_output(k).numpy() for k in range(gmod.get_num_outputs()))

    def _as_dict(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            values = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(self.input_names):
                raise ShapeError(f"the model has {len(self.input_names)} input(s) "
                                 f"{self.input_names}, got {len(inputs)} value(s)")
            values = dict(zip(self.input_names, inputs))
        missing = [n for n in self.input_names if n not in values]
        if missing:
            raise ShapeError(f"no value given for input(s) {missing}")
        return {n: np.asarray(values[n]) for n in self.input_names}

    def _executor(self, values: dict[str, np.ndarray]) -> Any:
        key = self._key(values)
        if key not in self._compiled:
            try:
                mod, params, self.bound = self._import(values)
                key = self._key(values)  # with the inputs found to need binding
                if key not in self._compiled:
                    self._compiled[key] = _compile(mod, params, self.target)
            except (ShapeError, CompileError, UnsupportedOpError):
                if self.static_values:
                    raise
                # data-dependent ops the graph could not take (shapes that do not broadcast,
                # If branches that differ): bind the inputs instead
                self.static_values = True
                return self._executor(values)
        return self._compiled[key]

    def _import(self, values: dict[str, np.ndarray]) -> tuple[Any, dict, set[str]]:
        if self.static_values:
            with static_values_only():
                return import_binding(self.model, values, self.bound)
        return import_binding(self.model, values, self.bound)

    def _key(self, values: dict[str, np.ndarray]) -> tuple:
        key = []
        for name in self.input_names:
            v = values[name]
            key.append((name, v.shape, v.dtype.str, v.tobytes() if name in self.bound else None))
        return tuple(key)


def import_binding(model: onnx.ModelProto, values: Mapping[str, np.ndarray],
                   bound: set[str]) -> tuple[Any, dict[str, np.ndarray], set[str]]:
    """Import ``model`` for the input ``values``, binding as constants the inputs in ``bound``
    and every further input a converter needs at compile time (``NotConstantError``).

    Returns
    -------
    (mod, params, bound) : the module, its parameters and the inputs bound in the end.

    Raises
    ------
    UnsupportedOpError
        As :func:`kiln.frontend.onnx.from_onnx`, also when a needed value depends on something
        other than the graph inputs given.
    """
    bound = set(bound)
    while True:
        try:
            mod, params = import_with_bound_inputs(model, values, bound)
            return mod, params, bound
        except NotConstantError as err:
            more = set(err.inputs) - bound
            if not more or not more <= set(values):
                raise
            bound |= more


def import_with_bound_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray],
                             bound: set[str]) -> tuple[Any, dict[str, np.ndarray]]:
    """``from_onnx`` with the inputs in ``bound`` turned into initializers of their ``values``
    and the other inputs' shapes fixed to those of ``values``.

    Raises what :func:`kiln.frontend.onnx.from_onnx` raises (NotConstantError included).
    """
    if bound:
        model = _bind_inputs(model, {n: values[n] for n in bound})
    shapes = {n: tuple(v.shape) for n, v in values.items() if n not in bound}
    return from_onnx(model, shape=shapes)


def _bind_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [v for v in out.graph.input if v.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name)
                                 for name, v in values.items())
    return out


def _compile(mod: Any, params: dict[str, np.ndarray], target: str) -> Any:
    from kiln.driver.build_module import build
    from kiln.graph_executor import GraphModule
    from kiln.runtime import VMExecutable, cpu

    lib = build(mod, target=target, params=params)
    if isinstance(lib, VMExecutable):  # symbolic dims or a run-time If
        return _VMRunner(lib)
    return GraphModule(lib["default"](cpu()))


class _VMRunner:
    """The graph executor's interface (set_input / run / get_output) over the VM, so a model
    the ONNX backend compiles to a VM executable runs the same way."""

    def __init__(self, exe: Any):
        from kiln.vm import VirtualMachine

        self.vm = VirtualMachine(exe, __import__("kiln").cpu())
        main = exe.functions[exe.func_index["main"]]
        self.names = [p.name for p in main.params]
        self.inputs: dict[str, np.ndarray] = {}
        self.outputs: tuple = ()

    def set_input(self, name: str, value: np.ndarray) -> None:
        self.inputs[name] = value

    def run(self) -> None:
        out = self.vm["main"](*(self.inputs[n] for n in self.names))
        self.outputs = tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def get_num_outputs(self) -> int:
        return len(self.outputs)

    def get_output(self, k: int) -> Any:
        return self.outputs[k]


class KilnBackend(Backend):
    """ONNX backend: CPU only; ``prepare(model, device="CPU", target="c")``."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",  # type: ignore[override]
                **kwargs: Any) -> KilnBackendRep:
        """Check and import ``model``; compile lazily at the first :meth:`KilnBackendRep.run`.

        Keyword arguments other than ``target`` (the runner passes ``rtol``/``atol``) are
        ignored.

        Raises
        ------
        UnsupportedOpError
            An op, opset, attribute or dtype Kiln does not support (names the node), or a
            device other than CPU.
        KilnError
            A model ``onnx.checker`` rejects.
        """
        if not cls.supports_device(device):
            raise UnsupportedOpError(f"device {device!r} is not supported (Kiln runs on CPU)")
        try:
            onnx.checker.check_model(model)
        except (onnx.checker.ValidationError, ValueError) as err:
            raise KilnError(f"invalid ONNX model: {str(err).strip().splitlines()[0]}") from None
        return cls._prepare_checked(model, kwargs.get("target", DEFAULT_TARGET))

    @classmethod
    def _prepare_checked(cls, model: onnx.ModelProto, target: str) -> KilnBackendRep:
        model_opset(model)
        rep = KilnBackendRep(model, target)
        try:
            with static_values_only():  # (as the binding path imports: no data-dependent If)
                from_onnx(model)  # unsupported ops fail here, before any input is seen
        except NotConstantError:
            pass  # needs input values: imported again at run time
        except ShapeError:
            pass  # e.g. symbolic dimensions that only the run-time inputs fix
        return rep

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node on ``inputs`` (one array per non-empty input name, in order).

        ``kwargs["opset_version"]`` picks the default-domain opset (default: the newest
        Kiln supports).
        """
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            arrays = [np.asarray(inputs[n]) for n in names]
        else:
            arrays = [np.asarray(v) for v in inputs]
        graph = helper.make_graph(
            [node], "run_node",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in zip(names, arrays)],
            [helper.make_empty_tensor_value_info(n) for n in node.output if n])
        opset = [helper.make_opsetid("", int(kwargs.get("opset_version", MAX_OPSET)))]
        model = helper.make_model(graph, opset_imports=opset,
                                  ir_version=helper.find_min_ir_version_for(opset))
        if not cls.supports_device(device):
            raise UnsupportedOpError(f"device {device!r} is not supported (Kiln runs on CPU)")
        # Output types are unknown before conversion, which onnx.checker rejects: skip it.
        return cls._prepare_checked(model, kwargs.get("target", DEFAULT_TARGET)).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
supports_device = KilnBackend.supports_device
is_compatible = KilnBackend.is_compatible
