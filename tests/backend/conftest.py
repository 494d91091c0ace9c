"""Backend test fixtures: the ``target`` of each code generator, ``check_model`` against
onnxruntime, the native runtime built once per session (helpers:
``tests/helpers/backend_helpers.py``).

Every test that takes the ``target`` fixture (directly or through ``check_model``) runs once per
code generator: ``c`` and ``llvm``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_helpers import TARGETS, assert_close_to_reference, compile_and_run, run_onnxruntime


@pytest.fixture(params=TARGETS)
def target(request) -> str:
    """The target string of each backend under test."""
    return request.param


@pytest.fixture
def check_model(tmp_path, target):
    """``check_model(model, inputs)``: Kiln's outputs, for ``target``, match onnxruntime's."""

    def check(model: onnx.ModelProto, inputs: dict[str, np.ndarray], rtol: float = 1e-4):
        got = compile_and_run(model, inputs, tmp_path, target)
        assert_close_to_reference(got, run_onnxruntime(model, inputs), rtol)
        return got

    return check


@pytest.fixture(scope="session")
def native_rt(build_once):
    """libkiln_runtime, kiln_run and the headers, built once per session (both xdist workers
    share it) from the shipped sources with the host compiler (tests/backend/test_native_*.py)."""
    import shutil

    from test_native_runtime import build_runtime

    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("the native runtime needs make and cc")
    return build_once("native-rt", build_runtime)


#: the flags of every sanitizer build of the native runtime
NATIVE_SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                   "-fno-omit-frame-pointer"]


@pytest.fixture(scope="session")
def native_rt_asan(build_once):
    """libkiln_runtime.a, kiln_run and the headers built once per session (both xdist workers
    share it) by the runtime's Makefile under AddressSanitizer + UndefinedBehaviorSanitizer
    (test_native_api, test_native_fuzz, test_native_vm link their drivers with it); skips where
    the compiler lacks the sanitizers."""
    import shutil
    import subprocess

    from kiln.native import RUNTIME_DIR

    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("the native runtime needs make and cc")

    def build_asan(folder):
        build = folder / "rt"
        flags = " ".join(["-g", "-O1", *NATIVE_SANITIZE])
        proc = subprocess.run(["make", "-s", "-j2", "-C", str(RUNTIME_DIR), f"BUILD={build}",
                               f"CFLAGS={flags}", f"LDFLAGS={NATIVE_SANITIZE[0]}",
                               f"{build}/libkiln_runtime.a", f"{build}/kiln_run",
                               f"{build}/include"],
                              capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0 and "sanitize" in proc.stderr:
            pytest.skip(f"the compiler lacks the sanitizers: {proc.stderr[:200]}")
        assert proc.returncode == 0, proc.stderr

    return build_once("native-rt-asan", build_asan) / "rt"


@pytest.fixture(scope="session")
def native_vm_drivers(native_rt_asan, build_once):
    """native_vm_test and native_fuzz_driver (tests/helpers/*.c) linked to the sanitizer runtime,
    once per session into a folder of their own. Linked per module into the shared runtime
    folder, one module's linker rewrote a driver while another worker ran it (EACCES)."""
    import subprocess

    from backend_helpers import HELPERS

    def link(folder):
        for name in ("native_vm_test", "native_fuzz_driver"):
            subprocess.run(["cc", "-std=gnu11", "-g", "-O1", *NATIVE_SANITIZE,
                            f"-I{native_rt_asan / 'include'}", "-o", str(folder / name),
                            str(HELPERS / f"{name}.c"), str(native_rt_asan / "libkiln_runtime.a"),
                            "-ldl", "-lpthread", "-lm"],
                           check=True, capture_output=True, text=True, timeout=300)

    return build_once("native-vm-drivers", link)
