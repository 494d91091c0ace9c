"""``kiln run``: load a compiled library, feed inputs (.npz or seeded random), time, save outputs."""

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

from kiln.cli_graph import TensorInfo, graph_info
from kiln.errors import KilnError, ShapeError

FACTORY_NAME = "default"


def open_library(path: str):
    """Load ``path``; return ``(root module, GraphInfo, params {name: NDArray})``.

    Raises
    ------
    ModuleLoadError
        If the library cannot be loaded or is not a graph-executor factory.
    """
    import kiln
    from kiln.errors import ModuleLoadError

    root = kiln.runtime.load_module(path)
    fn_json = root.get_function("get_graph_json")
    fn_params = root.get_function("get_graph_params")
    if fn_json is None or fn_params is None:
        raise ModuleLoadError(f"{path}: root module {root.type_key!r} is not a graph executor "
                              f"factory (no get_graph_json/get_graph_params)")
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


def load_inputs(path: str, inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    """Read graph inputs from an ``.npz`` whose keys are the input names.

    Raises
    ------
    KilnError
        Unreadable file, a missing or unknown key.
    ShapeError
        An array whose shape differs from the graph's (dtypes are cast when safe).
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise KilnError(f"cannot read inputs {path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise KilnError(f"cannot read inputs {path}: {err}") from None
    names = [t.name for t in inputs]
    missing = [n for n in names if n not in arrays]
    extra = [k for k in arrays if k not in names]
    if missing or extra:
        raise KilnError(f"{path}: keys {sorted(arrays)} do not match the graph inputs {names}"
                        + (f"; missing {missing}" if missing else "")
                        + (f"; unknown {extra}" if extra else ""))
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
                dump_outputs: str | None = None) -> dict[str, np.ndarray]:
    """Run a compiled library once per ``repeat``; print output shapes and timing.

    Parameters
    ----------
    library : str
        Path of a ``.so`` written by ``kiln compile`` / ``export_library``.
    inputs : str, optional
        ``.npz`` with one array per graph input; random inputs (seeded) when absent.
    outputs : str, optional
        ``.npz`` to write the outputs to, keyed by the model's output names.
    seed : int
        Seed for random inputs.
    repeat : int
        Timed runs; min/median/max are printed (ms, wall clock). With ``profile``: measurements
        per node.
    echo : callable
        Receives each printed line.
    profile : bool
        Run with the debug executor (the factory's ``debug_create``) and print the per-node
        table (``kiln.debug_executor.DebugReport.table``: slowest node first).
    dump_outputs : str, optional
        Folder for every node's output (``.npy`` per output, ``nodes.json``); implies
        ``profile``.

    Returns
    -------
    dict
        ``{output name: array}``.

    Raises
    ------
    KilnError
        Unloadable library, bad input file, shape mismatch, unwritable dump folder.
    """
    import kiln

    root, info, _ = open_library(library)
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
        report_lines = [_timing(times)]
    result = {t.name: gmod.get_output(k).numpy() for k, t in enumerate(info.outputs)}
    source = inputs if inputs else f"random (seed {seed})"
    echo(f"inputs: {source}")
    for name, arr in result.items():
        echo(f"output {name}: shape {tuple(arr.shape)} {arr.dtype}")
    for line in report_lines:
        echo(line)
    if dump_outputs:
        echo(f"wrote node outputs to {dump_outputs}")
    if outputs:
        save_npz(outputs, result)
        echo(f"wrote {outputs}")
    return result


def _timing(times: list[float]) -> str:
    if len(times) == 1:
        return f"run: {times[0]:.2f} ms"
    return (f"run ×{len(times)}: median {statistics.median(times):.2f} ms "
            f"(min {min(times):.2f}, max {max(times):.2f})")

