"""``kiln run``: load a compiled library, feed inputs (.npz or seeded random), time, save outputs.

Graph-executor libraries here; VM libraries (symbolic shapes) through :mod:`kiln.cli.vm`."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kiln.cli.graph_info import TensorInfo, graph_info
from kiln.errors import KilnError, ShapeError

FACTORY_NAME = "default"


def open_library(path: str, root=None):
    """Load ``path`` (or use its loaded ``root``); return ``(root module, GraphInfo, params
    {name: NDArray})``.

    Raises
    ------
    ModuleLoadError
        If the library cannot be loaded or is not a graph-executor factory.
    """
    import kiln
    from kiln.errors import ModuleLoadError

    root = root if root is not None else kiln.runtime.load_module(path)
    fn_json = root.get_function("get_graph_json")
    fn_params = root.get_function("get_graph_params")
    if fn_json is None or fn_params is None:
        raise ModuleLoadError(f"{path}: root module {root.type_key!r} is not a graph executor "
                              f"factory (no get_graph_json/get_graph_params) nor a VM executable")
    params = fn_params()
    return root, graph_info(fn_json(), set(params)), params


def random_inputs(inputs: list[TensorInfo], seed: int) -> dict[str, np.ndarray]:
    """Seeded random arrays for graph inputs: N(0, 1) for floats, 0..9 for integers.

    Parameters
    ----------
    inputs : list of TensorInfo
        The graph inputs (name, shape, dtype).
    seed : int
        Seed of :func:`numpy.random.default_rng`.

    Returns
    -------
    dict
        ``{name: array}`` with the inputs' shapes and dtypes.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for t in inputs:
        dtype = np.dtype(t.dtype)
        if np.issubdtype(dtype, np.floating):
            out[t.name] = rng.standard_normal(t.shape).astype(dtype)
        elif dtype == np.bool_:
            out[t.name] = rng.integers(0, 2, t.shape).astype(dtype)
        else:
            out[t.name] = rng.integers(0, 10, t.shape).astype(dtype)
    return out


def read_npz(path: str, names: list[str]) -> dict[str, np.ndarray]:
    """Read an ``.npz`` whose keys must be exactly ``names`` (the model's inputs).

    Raises
    ------
    KilnError
        Unreadable file, a missing or unknown key.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise KilnError(f"cannot read inputs {path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise KilnError(f"cannot read inputs {path}: {err}") from None
    missing = [n for n in names if n not in arrays]
    extra = [k for k in arrays if k not in names]
    if missing or extra:
        raise KilnError(f"{path}: keys {sorted(arrays)} do not match the graph inputs {names}"
                        + (f"; missing {missing}" if missing else "")
                        + (f"; unknown {extra}" if extra else ""))
    return arrays


def load_inputs(path: str, inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    """Read graph inputs from an ``.npz`` whose keys are the input names.

    Raises
    ------
    KilnError
        Unreadable file, a missing or unknown key.
    ShapeError
        An array whose shape differs from the graph's (dtypes are cast when safe).
    """
    arrays = read_npz(path, [t.name for t in inputs])
    out = {}
    for t in inputs:
        arr = arrays[t.name]
        if tuple(arr.shape) != t.shape:
            raise ShapeError(f"input {t.name!r}: {path} has shape {tuple(arr.shape)}, "
                             f"the library expects {t.shape}")
        if not np.can_cast(arr.dtype, t.dtype, casting="same_kind"):
            raise ShapeError(f"input {t.name!r}: {path} has dtype {arr.dtype}, "
                             f"the library expects {t.dtype}")
        out[t.name] = np.ascontiguousarray(arr, dtype=t.dtype)
    return out


def write_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Create or replace ``path`` atomically: ``write(f)`` fills a temporary file in the same
    directory, which is renamed over ``path`` only when it succeeds.

    Raises
    ------
    KilnError
        If the directory does not exist or is not writable.
    """
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise KilnError(f"cannot write {path}: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically (:func:`write_atomic`).

    Raises
    ------
    KilnError
        If the directory does not exist or is not writable.
    """
    write_atomic(path, lambda f: np.savez(f, **arrays))


def run_library(library: str, inputs: str | None = None, outputs: str | None = None,
                seed: int = 0, repeat: int = 1, echo=print, profile: bool = False,
                dump_outputs: str | None = None,
                input_shapes: list[tuple[str, tuple[int, ...]]] | None = None
                ) -> dict[str, np.ndarray]:
    """Run a compiled library once per ``repeat``; print input and output shapes and timing.

    Parameters
    ----------
    library : str
        Path of a ``.so`` written by ``kiln compile`` / ``export_library``: a graph-executor
        factory, or a VM executable (models with symbolic dims; :mod:`kiln.cli.vm`).
    inputs : str, optional
        ``.npz`` with one array per graph input; random inputs (seeded) when absent. A VM
        library takes any shape its signature allows.
    outputs : str, optional
        ``.npz`` to write the outputs to, keyed by the model's output names.
    seed : int
        Seed for random inputs.
    repeat : int
        Timed runs; min/median/max are printed (ms, wall clock). With ``profile``: measurements
        per node (the graph executor) or profiled calls whose per-kernel medians are shown
        (the VM). The VM is timed after one untimed call (the call that gives the outputs).
    echo : callable
        Receives each printed line.
    profile : bool
        Print the per-node table (graph executor: ``debug_create``,
        ``kiln.debug_executor.DebugReport.table``, slowest node first) or the VM's per-kernel
        table (``kiln.vm.VirtualMachine.profile``, in call order).
    dump_outputs : str, optional
        Folder for every node's output (``.npy`` per output, ``nodes.json``); implies
        ``profile``; graph-executor libraries only.
    input_shapes : list of (name, shape), optional
        ``--input-shape``: shapes of random inputs. For a VM library they size the inputs'
        symbols (other inputs sharing a symbol follow; a symbol no shape sets takes its
        smallest allowed value, see :mod:`kiln.cli.vm`); for a graph library they must equal
        the compiled shapes.

    Returns
    -------
    dict
        ``{output name: array}``.

    Raises
    ------
    KilnError
        Unloadable library, bad input file, ``--input-shape`` with ``--inputs``, an unknown
        input name, unwritable dump folder, ``--dump-outputs`` on a VM library.
    ShapeError
        Graph: an input shape that differs from the library's. VM: the VM's checks (rank,
        dtype, a symbol with two values, a value outside the symbol's bounds).
    """
    import kiln
    from kiln.cli.vm import is_vm_library

    given = shape_dict(input_shapes)
    if inputs and given:
        raise KilnError("--input-shape sets the shapes of random inputs; with --inputs the "
                        "arrays' own shapes are used")
    root = kiln.runtime.load_module(library)
    if is_vm_library(root):
        if dump_outputs is not None:
            raise KilnError("--dump-outputs needs a graph-executor library (the VM profiler "
                            "reports kernel times, not node outputs)")
        result, lines = _run_vm_library(root, inputs, seed, repeat, profile, given)
    else:
        result, lines = _run_graph_library(library, root, inputs, seed, repeat, profile,
                                           dump_outputs, given)
    for line in lines:
        echo(line)
    if outputs:
        save_npz(outputs, result)
        echo(f"wrote {outputs}")
    return result


def shape_dict(input_shapes: list[tuple[str, tuple[int, ...]]] | None
               ) -> dict[str, tuple[int, ...]]:
    """``--input-shape`` pairs as a dict.

    Raises
    ------
    KilnError
        The same input given two different shapes.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in input_shapes or []:
        named = [d for d in shape if isinstance(d, str)]
        if named:
            raise KilnError(f"--input-shape {name}: give sizes, not symbol names "
                            f"({', '.join(named)}), to make inputs")
        if name in shapes and shapes[name] != shape:
            raise KilnError(f"--input-shape given twice for {name!r}: {shapes[name]} and {shape}")
        shapes[name] = tuple(shape)
    return shapes


def _output_lines(result: dict[str, np.ndarray]) -> list[str]:
    return [f"output {name}: shape {tuple(arr.shape)} {arr.dtype}" for name, arr in result.items()]


def _run_vm_library(root, inputs: str | None, seed: int, repeat: int, profile: bool,
                    given: dict[str, tuple[int, ...]]):
    """A VM library: ``.npz`` or random inputs of the shapes ``given`` picks; see
    :func:`kiln.cli.vm.run_vm`."""
    from kiln.cli.vm import cast_inputs, concrete, input_shapes, run_vm, vm_signature

    sig = vm_signature(root)
    lines = []
    if inputs:
        feed = cast_inputs(read_npz(inputs, [t.name for t in sig.inputs]), sig)
        lines.append(f"inputs: {inputs}")
    else:
        shapes, defaulted = input_shapes(sig, given)
        feed = random_inputs(concrete(sig, shapes), seed)
        lines.append(f"inputs: random (seed {seed})")
        if defaulted:
            lines.append("symbols at their smallest value (--input-shape NAME:SHAPE sets "
                         f"them): {', '.join(f'{k}={v}' for k, v in defaulted.items())}")
    lines += [f"input {name}: shape {tuple(arr.shape)} {arr.dtype}" for name, arr in feed.items()]
    result, report = run_vm(root, feed, sig, repeat=repeat, profile=profile)
    return result, [*lines, *_output_lines(result), *report]


def _check_graph_shapes(info, given: dict[str, tuple[int, ...]]) -> None:
    names = {t.name: t.shape for t in info.inputs}
    for name, shape in given.items():
        if name not in names:
            raise KilnError(f"--input-shape for unknown input {name!r}; the inputs are "
                            f"{list(names)}")
        if shape != names[name]:
            raise ShapeError(f"--input-shape {name}:{'x'.join(map(str, shape))}: the library "
                             f"was compiled for input {name!r} of shape {names[name]} (recompile "
                             "with symbolic dims for other shapes)")


def _run_graph_library(library: str, root, inputs: str | None, seed: int, repeat: int,
                       profile: bool, dump_outputs: str | None,
                       given: dict[str, tuple[int, ...]]):
    """A graph-executor library: the graph executor, or the debug executor (``profile``)."""
    import kiln

    _, info, _ = open_library(library, root)
    _check_graph_shapes(info, given)
    feed = load_inputs(inputs, info.inputs) if inputs else random_inputs(info.inputs, seed)
    profile = profile or dump_outputs is not None
    create = root.get_function("debug_create" if profile else FACTORY_NAME)
    if create is None:
        raise KilnError(f"{library}: no {'debug_create' if profile else FACTORY_NAME!r} "
                        "executor factory function")
    if profile:
        from kiln.debug_executor import GraphModuleDebug

        gmod = GraphModuleDebug(create(FACTORY_NAME, kiln.cpu()), dump_root=dump_outputs)
        for name, value in feed.items():
            gmod.set_input(name, value)
        report_lines = gmod.run(repeat=repeat).table().splitlines()
    else:
        gmod = kiln.graph_executor.GraphModule(create(kiln.cpu()))
        for name, value in feed.items():
            gmod.set_input(name, value)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            gmod.run()
            times.append((time.perf_counter() - start) * 1e3)
        report_lines = [format_timing(times)]
    result = {t.name: gmod.get_output(k).numpy() for k, t in enumerate(info.outputs)}
    source = inputs if inputs else f"random (seed {seed})"
    lines = [f"inputs: {source}", *_output_lines(result), *report_lines]
    if dump_outputs:
        lines.append(f"wrote node outputs to {dump_outputs}")
    return result, lines


def format_timing(times: list[float]) -> str:
    """``run: 1.23 ms`` or ``run ×N: median … ms (min …, max …)``."""
    if len(times) == 1:
        return f"run: {times[0]:.2f} ms"
    return (f"run ×{len(times)}: median {statistics.median(times):.2f} ms "
            f"(min {min(times):.2f}, max {max(times):.2f})")

