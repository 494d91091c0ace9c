"""The files ``kiln`` commands read and write: compiled libraries (opened with a clear error),
inputs (``.npz`` checked against a graph's inputs, or seeded random ones), outputs written
atomically, and the one-line timing summary ``kiln run`` prints.

Shared by ``kiln run``, ``kiln inspect`` and ``kiln compile`` (:mod:`kiln.cli.run`,
:mod:`kiln.cli.vm`, :mod:`kiln.cli.inspect`, :mod:`kiln.cli.compile`).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kiln.cli.graph_info import TensorInfo, graph_info
from kiln.errors import KilnError, ShapeError

#: the tags an ONNX ModelProto starts with: ir_version (field 1, a varint), then usually
#: producer_name, producer_version, domain, model_version, doc_string, graph or opset_import
_ONNX_FIRST_TAG = 0x08
_ONNX_SECOND_TAGS = frozenset((0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42))


def is_onnx_file(path: str) -> bool:
    """Whether ``path`` is (most likely) an ONNX model rather than a library: not ELF, and
    named ``.onnx`` or starting the way a serialized ModelProto does."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    if head.startswith(b"\x7fELF"):
        return False
    if Path(path).suffix.lower() == ".onnx":
        return True
    return (len(head) >= 3 and head[0] == _ONNX_FIRST_TAG and 0 < head[1] < 0x80
            and head[2] in _ONNX_SECOND_TAGS)


def load_library(path: str):
    """``kiln.runtime.load_module(path)``, after telling an ONNX model from a library.

    Raises
    ------
    ModuleLoadError
        ``path`` is an ONNX model (saying to compile it first), or cannot be loaded.
    """
    import kiln

    refuse_onnx(path)
    return kiln.runtime.load_module(path)


def refuse_onnx(path: str) -> None:
    """Raise ModuleLoadError, saying to compile it first, when ``path`` is an ONNX model
    (:func:`is_onnx_file`) given where a compiled library is expected."""
    from kiln.errors import ModuleLoadError

    if is_onnx_file(path):
        so = Path(path).with_suffix(".so")
        raise ModuleLoadError(f"{path} is an ONNX model, not a compiled library: kiln compile "
                              f"{path} -o {so} first")


def open_library(path: str, root=None):
    """Load ``path`` (or use its loaded ``root``); return ``(root module, GraphInfo, params
    {name: NDArray})``.

    Raises
    ------
    ModuleLoadError
        If the library cannot be loaded or is not a graph-executor factory.
    """
    from kiln.errors import ModuleLoadError

    root = root if root is not None else load_library(path)
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


def check_dtype(name: str, arr: np.ndarray, dtype: str, path: str) -> None:
    """Refuse an ``.npz`` array whose dtype is not the input's (its byte order aside).

    Raises
    ------
    ShapeError
        Naming the input, the file, both dtypes and the cast that fixes the file.
    """
    if arr.dtype.newbyteorder("=") != np.dtype(dtype):
        raise ShapeError(f"input {name!r}: {path} has dtype {arr.dtype}, the library expects "
                         f"{dtype} (save it with .astype('{dtype}'))")


def load_inputs(path: str, inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    """Read graph inputs from an ``.npz`` whose keys are the input names.

    Raises
    ------
    KilnError
        Unreadable file, a missing or unknown key.
    ShapeError
        An array whose shape or dtype differs from the graph's (nothing is cast, as
        onnxruntime refuses a float64 array for a float32 input).
    """
    arrays = read_npz(path, [t.name for t in inputs])
    out = {}
    for t in inputs:
        arr = arrays[t.name]
        if tuple(arr.shape) != t.shape:
            raise ShapeError(f"input {t.name!r}: {path} has shape {tuple(arr.shape)}, "
                             f"the library expects {t.shape}")
        check_dtype(t.name, arr, t.dtype, path)
        out[t.name] = np.ascontiguousarray(arr, dtype=t.dtype)
    return out


def check_output_file(path: str) -> None:
    """Check, before any work, that a file can be written at ``path`` (as :func:`write_atomic`
    will): its directory exists and is writable, and ``path`` is not a directory.

    Raises
    ------
    KilnError
        Naming what is wrong.
    """
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise KilnError(f"cannot write {path}: directory {folder} does not exist")
    if target.is_dir():
        raise KilnError(f"cannot write {path}: it is a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KilnError(f"cannot write {path}: directory {folder} is not writable")


def check_output_dir(path: str) -> None:
    """Check, before any work, that ``path`` is a writable directory or can be made one (as
    ``mkdir -p``): it is not a file, and its nearest existing ancestor is a writable directory.

    Raises
    ------
    KilnError
        Naming what is wrong.
    """
    target = Path(path)
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise KilnError(f"cannot write to {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise KilnError(f"cannot write to {path}: directory {existing} is not writable")


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


def format_timing(times: list[float]) -> str:
    """``run: 1.23 ms`` or ``run ×N: median … ms (min …, max …)``."""
    if len(times) == 1:
        return f"run: {times[0]:.2f} ms"
    return (f"run ×{len(times)}: median {statistics.median(times):.2f} ms "
            f"(min {min(times):.2f}, max {max(times):.2f})")
