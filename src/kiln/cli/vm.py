"""``kiln run`` and ``kiln inspect`` on VM libraries (root module ``relax.VMExecutable``).

A VM library takes inputs of any shape its signature allows: each dim is an int or a symbol
with bounds (``kiln.runtime.vm.executable_format.Symbol``). Inputs come from an ``.npz`` (any
allowed
shape) or are random: ``--input-shape NAME:SHAPE`` picks an input's shape, whose symbols then
size every other input sharing them; a symbol no ``--input-shape`` sets takes its smallest
allowed value (at least 1, a multiple of its divisor) — what onnxruntime's ``perf_test`` does
with free dims (1). Given shapes are checked against the symbols before the inputs are made (so
an error names the ``--input-shape`` at fault); otherwise shape, dtype and bound errors are the
VM's own (:class:`~kiln.errors.ShapeError`, naming the input, the dim and the symbol).

Imports only ``kiln.runtime`` and the CLI's helpers (no compiler).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import numpy as np

from kiln.cli.graph_info import TensorInfo
from kiln.errors import KilnError, ShapeError

MAIN = "main"


@dataclass(frozen=True)
class VMTensor:
    """A parameter or output of a VM function: dims are ints or symbol names."""

    name: str
    dtype: str
    dims: tuple[int | str, ...]

    def shape_text(self) -> str:
        """``1x3x224x224`` when static, ``[batch_size, sequence_length]`` when symbolic."""
        if all(isinstance(d, int) for d in self.dims):
            return "x".join(map(str, self.dims)) or "scalar"
        return "[" + ", ".join(map(str, self.dims)) + "]"


@dataclass(frozen=True)
class VMSignature:
    """The signature of one VM function, with the executable's symbols.

    Attributes
    ----------
    function : str
    inputs, outputs : list of VMTensor
    symbols : dict
        ``{name: kiln.runtime.vm.executable_format.Symbol}`` (bounds and divisor).
    """

    function: str
    inputs: list[VMTensor]
    outputs: list[VMTensor]
    symbols: dict

    def default_value(self, symbol: str) -> int:
        """The smallest value >= 1 that ``symbol`` allows (its lower bound, rounded up to a
        multiple of its divisor)."""
        s = self.symbols[symbol]
        v = max(s.lo, 1)
        return -(-v // s.divisor) * s.divisor


def is_vm_library(root) -> bool:
    """Whether a loaded root module is a VM executable (has ``vm_load_executable``)."""
    return root.get_function("vm_load_executable") is not None


def vm_signature(exe, function: str = MAIN) -> VMSignature:
    """Read ``function``'s signature from a VM executable's function table.

    Raises
    ------
    KilnError
        The executable has no such VM function.
    """
    from kiln.runtime.vm.executable_format import Sym

    fidx = exe.func_index.get(function)
    if fidx is None or not exe.functions[fidx].is_vm:
        raise KilnError(f"the VM executable has no function {function!r}; functions: "
                        f"{exe.vm_function_names()}")
    f = exe.functions[fidx]

    def tensors(sigs) -> list[VMTensor]:
        return [VMTensor(s.name, s.dtype, tuple(exe.symbols[d.index].name if isinstance(d, Sym)
                                                else int(d) for d in s.dims)) for s in sigs]

    return VMSignature(function, tensors(f.params), tensors(f.outputs),
                       {s.name: s for s in exe.symbols})


def input_shapes(sig: VMSignature, given: dict[str, tuple[int, ...]]
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Concrete shapes of random inputs.

    Parameters
    ----------
    sig : VMSignature
    given : dict
        ``--input-shape`` by input name, used as given; fixed dims are left to the VM to
        check.

    Returns
    -------
    shapes : dict
        ``{input: shape}`` for every input, in signature order.
    defaulted : dict
        ``{symbol: value}`` for the symbols no given shape set (:meth:`VMSignature.default_value`).

    Raises
    ------
    KilnError
        A name that is not an input.
    ShapeError
        A given shape of the wrong rank, a symbol outside its bounds, or given two values
        (the message names the ``--input-shape``, the dim and the symbol).
    """
    names = [t.name for t in sig.inputs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise KilnError(f"--input-shape for unknown input(s) {unknown}; the inputs are {names}")
    values: dict[str, int] = {}
    for t in sig.inputs:  # symbols sized by the given shapes
        if t.name in given:
            _take_symbols(sig, t, given[t.name], values)
    defaulted: dict[str, int] = {}
    shapes = {}
    for t in sig.inputs:
        if t.name in given:
            shapes[t.name] = tuple(given[t.name])
            continue
        for d in t.dims:
            if isinstance(d, str) and d not in values:
                values[d] = defaulted[d] = sig.default_value(d)
        shapes[t.name] = tuple(values[d] if isinstance(d, str) else d for d in t.dims)
    return shapes, defaulted


def _take_symbols(sig: VMSignature, t: VMTensor, shape: tuple[int, ...],
                  values: dict[str, int]) -> None:
    """Record the symbols ``--input-shape`` gives ``t``; check them first, so that an error
    names this input rather than another input whose shape follows from it."""
    text = f"--input-shape {t.name}:{'x'.join(map(str, shape))}"
    if len(shape) != len(t.dims):
        raise ShapeError(f"{text}: input {t.name!r} has rank {len(t.dims)} "
                         f"({t.shape_text()}), got {len(shape)} dims")
    for k, (d, v) in enumerate(zip(t.dims, shape)):
        if not isinstance(d, str):
            continue
        s = sig.symbols[d]
        if v < s.lo or (s.hi is not None and v > s.hi) or v % s.divisor:
            raise ShapeError(f"{text}: dim {k}: symbol {d} = {v} is outside {s.describe()}")
        if values.get(d, v) != v:
            raise ShapeError(f"{text}: dim {k}: symbol {d} is {values[d]} by an earlier "
                             f"--input-shape but {v} here")
        values[d] = v


def cast_inputs(arrays: dict[str, np.ndarray], sig: VMSignature,
                path: str = "the .npz") -> dict[str, np.ndarray]:
    """The ``.npz`` arrays in C order, each checked to have its input's dtype (nothing is
    cast, as for graph libraries); shapes are the VM's to check.

    Raises
    ------
    ShapeError
        An array whose dtype is not its input's (:func:`kiln.cli.files.check_dtype`).
    """
    from kiln.cli.files import check_dtype

    out = {}
    for t in sig.inputs:
        arr = arrays[t.name]
        check_dtype(t.name, arr, t.dtype, path)
        out[t.name] = np.asarray(arr, dtype=t.dtype, order="C")  # native byte order, C order
    return out


def concrete(sig: VMSignature, shapes: dict[str, tuple[int, ...]]) -> list[TensorInfo]:
    """The inputs as :class:`TensorInfo` with concrete ``shapes`` (for ``random_inputs``)."""
    return [TensorInfo(t.name, shapes[t.name], t.dtype) for t in sig.inputs]


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _median_report(reports: list):
    """One ProfileReport whose times are the medians of ``reports`` (same calls each time)."""
    from kiln.runtime.vm.profile import ProfileReport

    if len(reports) == 1:
        return reports[0]
    rows = [dataclasses.replace(r, time_us=statistics.median(rep.rows[i].time_us
                                                             for rep in reports))
            for i, r in enumerate(reports[0].rows)]
    return ProfileReport(rows, statistics.median(rep.total_us for rep in reports))


def run_vm(root, feed: dict[str, np.ndarray], sig: VMSignature, repeat: int = 1,
           profile: bool = False) -> tuple[dict[str, np.ndarray], list[str], dict | None]:
    """Run ``sig.function`` on ``feed``: one call for the outputs, then ``repeat`` timed calls
    (or, with ``profile``, ``repeat`` profiled calls whose per-kernel median is reported).

    Parameters
    ----------
    root : Module
        The loaded VM executable.
    feed : dict
        ``{input name: array}`` (every input).
    sig : VMSignature
    repeat : int
    profile : bool
        Print the VM's per-kernel table (``vm.profile(...).table()``) instead of the latency.

    Returns
    -------
    outputs : dict
        ``{output name: array}``.
    lines : list of str
        The timing line, or the profile table's lines.
    trace : dict or None
        With ``profile``: the profiled calls as a Chrome trace
        (:func:`kiln.cli.profile_trace.vm_trace`).

    Raises
    ------
    KilnError, ShapeError
        As the VM raises them: wrong number, rank or dtype of inputs, a symbol that differs
        between inputs or lies outside its bounds, a kernel failure.
    """
    import kiln
    from kiln.cli.files import format_timing
    from kiln.vm import VirtualMachine

    vm = VirtualMachine(root, kiln.cpu())
    args = [kiln.runtime.array(feed[t.name]) for t in sig.inputs]
    fn = vm[sig.function]
    result = _as_tuple(fn(*args))  # also records the shape's kernel sequence
    names = [t.name for t in sig.outputs]
    if len(names) != len(result):
        names = [f"output_{k}" for k in range(len(result))]
    outputs = {n: (r.numpy() if hasattr(r, "numpy") else np.asarray(r))
               for n, r in zip(names, result)}
    if profile:
        from kiln.cli.profile_trace import vm_trace

        reports = [vm.profile(sig.function, *args) for _ in range(repeat)]
        return outputs, _median_report(reports).table().splitlines(), vm_trace(reports)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return outputs, [format_timing(times)], None


def inspect_vm_lines(root) -> list[str]:
    """``kiln inspect`` lines for a VM executable: symbols, function signatures, the inputs and
    outputs of ``main``, constants and code size."""
    stats = root.stats()
    n = len(stats['vm_functions'])
    head = (f"executor: VM ({n} VM function{'s' if n != 1 else ''}, "
            f"{len(stats['kernels'])} kernels, {stats['instructions']} instructions, "
            f"{stats['code_words']} code words)")
    lines = [head]
    lines.append("symbols:")
    lines += [f"  {s.describe()}" for s in root.symbols] or ["  (none)"]
    lines.append("functions:")
    lines += [f"  {root.signature_text(f)}" for f in root.functions if f.is_vm]
    if MAIN in root.vm_function_names():
        sig = vm_signature(root)
        for kind, items in (("inputs", sig.inputs), ("outputs", sig.outputs)):
            lines.append(f"{kind}:")
            lines += [f"  {t.name}: {t.shape_text()} {t.dtype}" for t in items]
    from kiln.runtime import NDArray

    n_tensors = sum(1 for c in root.constants if isinstance(c, NDArray))
    nbytes = stats["constant_bytes"]
    lines.append(f"constants: {stats['constants']} ({n_tensors} tensors, {nbytes} bytes, "
                 f"{nbytes / 1e6:.2f} MB)")
    return lines
