"""Fuzzing the loaders over a real exported ``.so`` (needs the C compiler). Targets (see
``tests/helpers/fuzz_runtime.py``):

- ``so_blob``: the library's own ``__tvm_dev_mblob`` payload, mutated (any mutation, resizing
  included) and unpacked in-process over the library's real kernels, then executor creation;
- ``elf``: the file's ELF header and program headers mutated, or the file truncated, then the
  pre-``dlopen`` checks (``elf.check_loadable``) — never ``dlopen`` itself;
- ``so_file``: whole files through ``load_module`` in worker processes, so a crash or a hang is
  one failed case, not a lost test run. Mutations are restricted to **in-place changes of the
  blob bytes inside the valid .so** (``u64 nbytes`` included) plus **truncation of the file**:
  bytes inserted or deleted in the middle of a library move every later section, and corrupt
  ELF structures crash ``dlopen`` itself — a ``.so`` is code and must be trusted
  (docs/decisions/004-loading-untrusted-artifacts.md).

The default suite runs :data:`QUICK` cases per target; ``make fuzz`` runs ``$KILN_FUZZ_CASES``
(default :data:`LARGE`) per target; ``$KILN_FUZZ_SEED`` (default 0) changes the sequence.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fuzz_runtime import build_so, make_targets, run, run_in_workers

import kiln.runtime as rt
from kiln.graph_executor import GraphModule

QUICK = 100
LARGE = 5000
SEED = int(os.environ.get("KILN_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def so_path(tmp_path_factory) -> str:
    return build_so(str(tmp_path_factory.mktemp("fuzz") / "model.so"))


def test_so_corpus_loads(so_path):
    """Fuzzing starts from a library that loads and runs."""
    gm = GraphModule(rt.load_module(so_path)["default"](rt.cpu()))
    x = np.ones((2, 3), "float32")
    gm.run(x=x, y=x)
    p0 = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + x) * p0 + x)


def _check(so_path: str, name: str, count: int) -> None:
    if name == "so_file":
        report = run_in_workers(name, SEED, count, so_path)
    else:
        report = run(make_targets(so_path)[name], SEED, count, replay_args=f"--so {so_path}")
    print(report.summary())
    assert report.cases == count
    assert not report.failures, report.summary()


@pytest.mark.parametrize("name", ["so_blob", "elf", "so_file"])
def test_fuzz_so_quick(so_path, name):
    _check(so_path, name, QUICK)


@pytest.mark.fuzz
@pytest.mark.parametrize("name", ["so_blob", "elf", "so_file"])
def test_fuzz_so_large(so_path, name):
    _check(so_path, name, int(os.environ.get("KILN_FUZZ_CASES", LARGE)))
