"""Helpers of the ``jit`` device tests (tests/backend/runtime/test_device_jit.py,
tests/models/runtime/test_jit_models.py): the riscv64 toolchain they need, the device module of a
loaded library, and the RVV instructions in a kernel library's disassembly."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

import kiln.runtime as rt
from kiln.runtime.jit.device_module import SourceDeviceModule
from kiln.runtime.toolchain import compiler as toolchain

RISCV_CC = "clang-14 --target=riscv64-linux-gnu"
#: clang links riscv64 code with the GNU cross toolchain's crt files and the Debian sysroot
RISCV_TOOLS = ("clang-14", "qemu-riscv64", "riscv64-linux-gnu-gcc")
SYSROOT = "/usr/riscv64-linux-gnu"


def riscv_missing() -> str | None:
    """The first missing tool of the riscv64 device path, or None."""
    for tool in RISCV_TOOLS:
        if shutil.which(tool) is None:
            return tool
    return None if os.path.isdir(SYSROOT) else SYSROOT


def use_riscv_device(monkeypatch, cache: Path) -> None:
    """Skip unless the riscv64 device path is installed; else make ``jit`` kernels compile
    with :data:`RISCV_CC` into the fresh cache ``cache`` (no launcher, flags or cache opt-out
    from the environment)."""
    missing = riscv_missing()
    if missing:
        pytest.skip(f"the riscv64 device path needs {missing} (make test installs it)")
    for var in ("KILN_DEVICE_CFLAGS", "KILN_DEVICE_LAUNCHER", "KILN_NO_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    monkeypatch.setenv("KILN_DEVICE_CC", RISCV_CC)


def device_module(loaded: rt.Module) -> SourceDeviceModule:
    """The one ``kiln_jit`` module a loaded factory imports."""
    (dev,) = [m for m in loaded.imported_modules if isinstance(m, SourceDeviceModule)]
    return dev


def vector_ops(lib: str) -> list[str]:
    """The RVV instruction mnemonics in ``lib``'s disassembly (llvm-objdump with V enabled;
    skips the test when llvm-objdump is missing)."""
    tool = shutil.which("llvm-objdump-14") or shutil.which("llvm-objdump")
    if tool is None:
        pytest.skip("needs llvm-objdump (apt-get install llvm-14) to disassemble RVV")
    text = toolchain.run([tool, "-d", "--mattr=+v", lib])
    return re.findall(r"\t(v[a-z0-9]+(?:\.[a-z0-9]+)*)\t", text)
