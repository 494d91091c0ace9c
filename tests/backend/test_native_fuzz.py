"""Damaged files through the native runtime's loader (libkiln_runtime, src/kiln/native/),
built with its sources under AddressSanitizer and UndefinedBehaviorSanitizer: the loader
fuzzer's mutations (tests/fuzz_runtime.py, tests/fuzz_mutators.py: truncations, bit flips,
bad lengths, bad import trees, in-place blob damage inside a real .so) fed to
tests/backend/native_fuzz_driver.c. A case passes when loading returns (an error is what a
damaged file should give); any sanitizer report, crash or hang (10 s) fails the run, naming the
case.

Targets: ``blob`` — payloads (the real library's, the generic corpus of blobs, and blobs with a
``const_loader`` and a ``kiln_jit`` module), mutated with resizing, unpacked in-process over the real library's kernels, then executor creation;
``file`` — whole libraries (in-place blob damage, truncation at any length) loaded by
``TVMModLoadFromFile`` in a child process each. Default suite: :data:`QUICK` cases per target;
``make fuzz``: ``$KILN_FUZZ_CASES`` (default 5000) per target, twice that for ``blob``.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fuzz_mutators import blob_corpus, graph_docs, graph_params, mutate_bytes
from fuzz_runtime import SoCorpus, build_so, so_file_mutation

import kiln.runtime as rt
from kiln.runtime.blob import pack_imports
from kiln.runtime.device_module import DeviceFunction

QUICK = {"blob": 300, "file": 100}
SEED = int(os.environ.get("KILN_FUZZ_SEED", "0"))
HERE = Path(__file__).resolve().parent
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
    return [pack_imports(rt.GraphExecutorFactoryModule(json.dumps(doc), m,
                                                       graph_params(doc)))[8:]
            for m in (consts, jit)]


def _cases(kind: str, so: SoCorpus, count: int) -> list[bytes]:
    corpus = [so.payload, *blob_corpus(), *native_blob_corpus()]
    out = []
    for i in range(count):
        rng = random.Random(f"native_{kind}:{SEED}:{i}")
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
    for kind, data in (("blob", so.payload), ("file", so.data)):
        corpus = folder / f"good-{kind}.corpus"
        corpus.write_bytes(struct.pack("<Q", len(data)) + data)
        proc = subprocess.run([str(driver), kind, so_path, str(corpus)], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "ASAN_OPTIONS": "allocator_may_return_null=1"},
                              check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == "cases 1 errors 0", proc.stderr


@pytest.mark.parametrize("kind", ["blob", "file"])
def test_native_fuzz_quick(fuzz_setup, kind):
    run_fuzz(fuzz_setup, kind, QUICK[kind])


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", ["blob", "file"])
def test_native_fuzz_large(fuzz_setup, kind):
    count = int(os.environ.get("KILN_FUZZ_CASES", "5000"))
    run_fuzz(fuzz_setup, kind, 2 * count if kind == "blob" else count)
