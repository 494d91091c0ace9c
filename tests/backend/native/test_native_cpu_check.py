"""The native runtime refuses a library built for CPU features this machine lacks before dlopen
(kiln_check_target_info, rt_blob.c; decision 031): ``kiln_run`` (TVMModLoadFromFile) exits with
the message ``TVMGetLastError()`` gives, never with SIGILL; built under AddressSanitizer (the
ELF symbol reader reads untrusted files). A library for this CPU and one with no record (written
before the record existed: the symbol renamed) still load. The Python runtime's check and the
records: tests/backend/runtime/test_cpu_features_check.py."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pytest
from test_cpu_features_check import build, foreign_cpu


def kiln_run(rt, lib, tmp_path) -> subprocess.CompletedProcess:
    x = tmp_path / "x.bin"
    np.ones((1, 64), np.float32).tofile(x)
    # kiln_run itself leaks its argument arrays when a load fails (tools/kiln_run.c): not this
    # check's memory
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    return subprocess.run([str(rt / "kiln_run"), str(lib), str(x), str(tmp_path / "y.bin")],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if os.uname().machine != "x86_64":
        pytest.skip("the foreign-CPU targets are x86-64 CPUs")
    folder = tmp_path_factory.mktemp("native-cpu-check")
    target, feature = foreign_cpu()
    return {"foreign": build(target, folder / "foreign.so"), "feature": feature,
            "target": target, "native": build("c -mcpu=native", folder / "native.so")}


def test_kiln_run_refuses_a_library_for_another_cpu(native_rt_asan, libs, tmp_path):
    proc = kiln_run(native_rt_asan, libs["foreign"], tmp_path)
    assert proc.returncode != -signal.SIGILL and proc.returncode != 128 + signal.SIGILL
    assert proc.returncode == 1, proc.stderr
    # the missing features first (one or several: skylake-avx512's on an AVX2 CPU), then the
    # features this CPU has
    assert f"{libs['foreign']} needs {libs['feature']}" in proc.stderr
    assert "; this CPU has sse4.2" in proc.stderr
    assert f"(target '{libs['target']}')" in proc.stderr
    assert "AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr


def test_kiln_run_loads_a_library_for_this_cpu(native_rt_asan, libs, tmp_path):
    proc = kiln_run(native_rt_asan, libs["native"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    y = np.fromfile(tmp_path / "y.bin", np.float32)
    np.testing.assert_allclose(y, np.maximum(1 + np.arange(64.0), 0))


def test_a_library_without_a_record_is_not_checked(native_rt_asan, libs, tmp_path):
    """Renaming the symbol (same length) makes a library as older exports were."""
    data = libs["foreign"].read_bytes()
    assert data.count(b"__kiln_target_info\0") >= 1
    old = tmp_path / "old.so"
    old.write_bytes(data.replace(b"__kiln_target_info\0", b"__kiln_target_xxxx\0"))
    proc = kiln_run(native_rt_asan, old, tmp_path)
    assert "needs" not in proc.stderr
    assert proc.returncode in (0, -signal.SIGILL), proc.stderr  # no check: it may run or trap
