"""Damaged files through the native runtime's loader (libkiln_runtime, src/kiln/native/),
built with its sources under AddressSanitizer and UndefinedBehaviorSanitizer: the loader
fuzzer's mutations (tests/helpers/fuzz_runtime.py, tests/helpers/fuzz_mutators.py: truncations, bit
flips,
bad lengths, bad import trees, in-place blob damage inside a real .so) fed to
tests/helpers/native_fuzz_driver.c. A case passes when loading returns (an error is what a
damaged file should give); any sanitizer report, crash or hang (10 s) fails the run, naming the
case.

Targets: ``blob`` — payloads (the real library's, the generic corpus of blobs, and blobs with a
``const_loader``, a ``kiln_jit`` module and ``kiln_json`` functions behind a const loader),
mutated with resizing, unpacked in-process over the real library's kernels, then executor
creation (which hands the kiln_json functions their constants);
``file`` — whole libraries (in-place blob damage, truncation at any length) loaded by
``TVMModLoadFromFile`` in a child process each; ``run`` — kiln_json functions whose graph JSON
is damaged (tokens or values: :func:`json_case`) loaded as ``blob``, then the executor run
(the interpreter checks every argument, so a damaged graph must be an error there too). Default
suite: :data:`QUICK` cases per target;
``make fuzz``: ``$KILN_FUZZ_CASES`` (default 5000) per target, twice that for ``blob``.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess

import numpy as np
import pytest
from backend_helpers import HELPERS
from fuzz_mutators import (
    blob_corpus,
    graph_docs,
    graph_params,
    json_runtime_corpus,
    mutate_bytes,
    mutate_doc,
    mutate_text,
)
from fuzz_runtime import SoCorpus, build_so, so_file_mutation
from test_native_json import json_factory

import kiln.runtime as rt
from kiln.runtime.blob import pack_imports
from kiln.runtime.jit.device_module import DeviceFunction

QUICK = {"blob": 300, "file": 100, "run": 300}
SEED = int(os.environ.get("KILN_FUZZ_SEED", "0"))
HERE = HELPERS  # the C drivers
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]


@pytest.fixture(scope="module")
def fuzz_setup(native_rt_asan, tmp_path_factory):
    folder = tmp_path_factory.mktemp("native-fuzz")
    so = build_so(str(folder / "model.so"))
    build = native_rt_asan  # the runtime's own Makefile, instrumented
    driver = folder / "native_fuzz_driver"
    subprocess.run(["cc", "-std=gnu11", "-g", "-O1", *SANITIZE, f"-I{build / 'include'}", "-o",
                    str(driver), str(HERE / "native_fuzz_driver.c"),
                    str(build / "libkiln_runtime.a"), "-ldl", "-lpthread"],
                   check=True, capture_output=True, text=True, timeout=300)
    return folder, so, driver


def native_blob_corpus() -> list[bytes]:
    """Payloads with the other modules the native runtime loads: a const_loader in front of
    the kernels, and a kiln_jit device module (parsed and linked; nothing is compiled before a
    call, and the fuzz driver makes none)."""
    doc = graph_docs()[0]
    lib = rt.CSourceModule("", ["fused_add", "fused_mul"])
    consts = rt.ConstLoaderModule({"w": np.ones((2, 3), "float32"), "v": np.zeros(4, "int8")},
                                  {"fused_add": ["w"], "fused_mul": ["w", "v"]})
    consts.import_module(lib)
    jit = rt.SourceDeviceModule(["int kiln_fuzz;\n", "/* two units */\n"], [
        DeviceFunction("fused_add", ("float32", "float32", "float32"), 1),
        DeviceFunction("fused_mul", ("float32", "float32", "float32"), 1)])
    return [*(pack_imports(rt.GraphExecutorFactoryModule(json.dumps(doc), m,
                                                         graph_params(doc)))[8:]
              for m in (consts, jit)), *kiln_json_blobs()]


def kiln_json_blobs() -> list[bytes]:
    """Payloads with kiln_json functions (fuzz_mutators' corpus: a conv + pool graph with
    constants, an add + relu graph without) behind a const loader, each called by a graph."""
    out = []
    for data in json_runtime_corpus():
        ext = rt.JSONRuntimeModule.load_from_binary(data)
        graph = json.loads(ext.graph_json)
        rng = np.random.default_rng(0)
        consts = {n["name"]: rng.standard_normal(n["attrs"]["shape"][0]).astype("float32")
                  for n in graph["nodes"] if n["op"] == "const"}
        out.append(pack_imports(json_factory(graph, consts, ext.symbol))[8:])
    return out


def json_case(rng: random.Random) -> bytes:
    """A kiln_json function whose graph JSON is damaged (tokens, or values at any place of
    the document: wrong types, ids, shapes), behind an intact const loader and calling graph."""
    data = rng.choice(json_runtime_corpus())
    ext = rt.JSONRuntimeModule.load_from_binary(data)
    graph = json.loads(ext.graph_json)
    consts = {n["name"]: np.ones(n["attrs"]["shape"][0], "float32")
              for n in graph["nodes"] if n["op"] == "const"}
    if rng.random() < 0.5:
        text, _ = mutate_text(rng, ext.graph_json.encode())
    else:
        text, _ = mutate_doc(rng, graph)

    def damage(m: rt.JSONRuntimeModule) -> None:
        m.graph_json = text.decode("utf-8", "replace")

    return pack_imports(json_factory(graph, consts, ext.symbol, damage))[8:]


def _cases(kind: str, so: SoCorpus, count: int) -> list[bytes]:
    corpus = [so.payload, *blob_corpus(), *native_blob_corpus()]
    out = []
    for i in range(count):
        rng = random.Random(f"native_{kind}:{SEED}:{i}")
        if kind == "run":
            out.append(json_case(rng))
            continue
        if kind == "blob":
            data, _ = mutate_bytes(rng, corpus[0] if rng.random() < 0.5 else rng.choice(corpus))
        else:
            data, _ = so_file_mutation(rng, so)
        out.append(data)
    return out


def run_fuzz(fuzz_setup, kind: str, count: int) -> str:
    folder, so_path, driver = fuzz_setup
    cases = _cases(kind, SoCorpus(so_path), count)
    corpus = folder / f"{kind}-{count}.corpus"
    corpus.write_bytes(b"".join(struct.pack("<Q", len(c)) + c for c in cases))
    env = {**os.environ, "ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=1:"
                                         "abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1", "KILN_NUM_THREADS": "1"}
    proc = subprocess.run([str(driver), kind, so_path, str(corpus)], capture_output=True,
                          text=True, timeout=3600, env=env, check=False)
    assert proc.returncode == 0, (proc.stderr or proc.stdout)[-4000:]
    assert proc.stdout.startswith(f"cases {count} "), proc.stdout
    print(f"native loader fuzz {kind} seed={SEED}: {proc.stdout.strip()}, 0 crashes")
    return proc.stdout


def test_good_library_loads(fuzz_setup):
    """The unmutated library and payload load without an error (the corpus is valid)."""
    folder, so_path, driver = fuzz_setup
    so = SoCorpus(so_path)
    for kind, cases in (("blob", [so.payload, *kiln_json_blobs()]), ("file", [so.data])):
        corpus = folder / f"good-{kind}.corpus"
        corpus.write_bytes(b"".join(struct.pack("<Q", len(c)) + c for c in cases))
        proc = subprocess.run([str(driver), kind, so_path, str(corpus)], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "ASAN_OPTIONS": "allocator_may_return_null=1"},
                              check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == f"cases {len(cases)} errors 0", (
            proc.stderr + proc.stdout)


@pytest.mark.parametrize("kind", ["blob", "file", "run"])
def test_native_fuzz_quick(fuzz_setup, kind):
    run_fuzz(fuzz_setup, kind, QUICK[kind])


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", ["blob", "file", "run"])
def test_native_fuzz_large(fuzz_setup, kind):
    count = int(os.environ.get("KILN_FUZZ_CASES", "5000"))
    run_fuzz(fuzz_setup, kind, 2 * count if kind == "blob" else count)
