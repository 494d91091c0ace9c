"""Temporary files of the toolchain paths: private (``tempfile.mkdtemp``, mode 0700), removed on
success and on failure, and never left next to the output."""

from __future__ import annotations

import json
import os
import stat
import tempfile

import pytest
from fuzz_mutators import graph_docs, graph_params
from fuzz_runtime import SO_KERNELS

import kiln.runtime as rt
from kiln.errors import ToolchainError
from kiln.runtime.toolchain import compiler as toolchain

FUNCS = ["fused_add", "fused_mul"]


def _factory(code: str = SO_KERNELS) -> rt.GraphExecutorFactoryModule:
    doc = graph_docs()[0]
    return rt.GraphExecutorFactoryModule(json.dumps(doc), rt.CSourceModule(code, FUNCS),
                                         graph_params(doc))


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """A fresh system temp folder (``tempfile.gettempdir()``) to inspect afterwards."""
    tmp = tmp_path / "systmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp


def test_export_leaves_no_temp_files(tmp_path, tmpdir_env):
    out = tmp_path / "out"
    out.mkdir()
    seen = []
    real = rt.cross_compiler(toolchain.find_cc())

    def fcompile(output, sources, options=None):
        work = os.path.dirname(sources[0])
        seen.append((work, stat.S_IMODE(os.stat(work).st_mode), os.path.dirname(output)))
        real(output, sources, options)

    _factory().export_library(str(out / "m.so"), fcompile=fcompile)
    (work, mode, out_dir), = seen
    assert os.path.dirname(work) == str(tmpdir_env) and mode == 0o700
    assert out_dir == str(out)  # linked next to the target, then renamed into place
    assert os.listdir(tmpdir_env) == [] and os.listdir(out) == ["m.so"]

    # failure in the compiler
    with pytest.raises(ToolchainError):
        _factory(SO_KERNELS + "\nnot C;\n").export_library(str(out / "bad.so"))
    assert os.listdir(tmpdir_env) == [] and os.listdir(out) == ["m.so"]

    # failure of any other kind (here: in a custom fcompile)
    def boom(output, sources, options=None):
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        _factory().export_library(str(out / "m.so"), fcompile=boom)
    assert os.listdir(tmpdir_env) == [] and os.listdir(out) == ["m.so"]
    rt.load_module(str(out / "m.so"))  # the earlier library is intact


def test_jit_compile_leaves_only_the_cached_library(tmp_path, tmpdir_env):
    mod = rt.CSourceModule(SO_KERNELS + f"\n/* {tmp_path.name} */\n", FUNCS)
    assert mod.get_function("fused_add") is not None
    assert os.listdir(tmpdir_env) == []
    cache = tmp_path / "cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    # the size cap's ledger (kiln.runtime.toolchain.cache_limit) is the one dot file
    names = sorted(os.listdir(cache))
    assert names[0] == ".cache-size"
    names = names[1:]
    assert len(names) == 2 and names[0].startswith("csource-") and names[0].endswith(".so")
    # and the compile cache's objects (kiln.runtime.toolchain.compile_cache), whole entries only:
    # the
    # kernels' and each support source's, each with its manifest
    # (kiln.runtime.toolchain.cc_manifest)
    assert names[1] == "objects"
    kinds = sorted(n.rsplit(".", 1)[1] for n in os.listdir(cache / "objects"))
    sources = 1 + len(toolchain.SUPPORT_SOURCES)
    assert kinds == ["manifest"] * sources + ["o"] * sources
