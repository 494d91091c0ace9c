"""``ObjectModule``: packed functions compiled to a relocatable object file, DSO-exportable
(the runtime half of TVM's ``LLVMModuleNode``, src/target/llvm/llvm_module.cc, type_key ``llvm``).

The module holds only bytes and names: the ELF object, the packed functions it defines and,
for inspection, the LLVM IR text it came from. The code generator
(``kiln.codegen.llvm.module``) creates it, so this package never imports llvmlite.
``export_library`` saves it as ``lib<i>.o`` and hands the object straight to the linker. Before
export ``get_function`` still works when the object is for this host's machine: it is linked with
the backend support code into a private shared library cached by content hash (like
:class:`~kiln.runtime.source_module.CSourceModule`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

from kiln.errors import KilnError
from kiln.runtime.elf import ELF_MAGIC, host_elf, machine_name
from kiln.runtime.library_module import JitLibraryMixin, LibraryModule
from kiln.runtime.module import Module
from kiln.runtime.source_module import build_cached_library


def object_machine(obj: bytes) -> int | None:
    """The ELF ``e_machine`` of object bytes, or None when they are not ELF."""
    if len(obj) < 20 or obj[:4] != ELF_MAGIC:
        return None
    return struct.unpack_from("<H" if obj[5] == 1 else ">H", obj, 18)[0]


class ObjectModule(JitLibraryMixin, Module):
    """Compiled packed functions in an object file.

    Parameters
    ----------
    obj : bytes
        A relocatable ELF object defining each function in ``func_names`` with the packed ABI
        (``TVMBackendPackedCFunc``, default visibility). It may call the backend callbacks of
        ``include/kiln/c_runtime_api.h`` (workspace, errors, ``TVMBackendParallelLaunch``) and
        libm.
    func_names : sequence of str
        The packed functions the object defines.
    triple : str
        The target triple it was compiled for (for messages).
    ir : str, optional
        The LLVM IR text the object was compiled from (``get_source()``).
    target : str, optional
        The target string it was compiled for (``export_library`` builds the blob object for
        the same target).
    type_key : str
        ``"llvm"``.
    """

    is_dso_exportable = True
    export_suffix = "o"

    def __init__(self, obj: bytes, func_names: Sequence[str], triple: str = "", ir: str = "",
                 target: str = "", type_key: str = "llvm"):
        super().__init__()
        self.obj = bytes(obj)
        self.func_names = list(func_names)
        self.triple = triple
        self.ir = ir
        self.target = target
        self.type_key = type_key
        self._jit: LibraryModule | None = None

    def get_source(self, fmt: str = "") -> str:
        """The LLVM IR text (``fmt`` "" or "ll"); other formats need the compiler's subclass.

        Raises
        ------
        KilnError
            For another format (e.g. "asm" on a module not created by kiln.codegen).
        """
        if fmt in ("", "ll", "llvm"):
            return self.ir
        raise KilnError(f"{self.type_key} module: source format {fmt!r} is not available "
                        "(only 'll'); the compiler's LLVM module provides 'asm'")

    def save(self, path: str, fmt: str = "") -> None:
        """Write the object (``.o``, or ``fmt="o"``) or a source format (``.ll``, ``.s``).

        Raises
        ------
        KilnError
            For a format the module cannot produce.
        """
        fmt = fmt or os.path.splitext(str(path))[1].lstrip(".") or "o"
        if fmt in ("o", "obj"):
            with open(path, "wb") as f:
                f.write(self.obj)
            return
        text = self.get_source("asm" if fmt in ("s", "S", "asm") else fmt)
        with open(path, "w") as f:
            f.write(text)

    def list_function_names(self) -> list[str]:
        return list(self.func_names)

    @property
    def is_host_object(self) -> bool:
        """True when the object is for this host's machine (so it can run here)."""
        host = host_elf()
        return host is not None and object_machine(self.obj) == host.machine

    def _build_library(self) -> str:
        """Link the object and the backend support into a cached shared library; its path.

        Raises
        ------
        KilnError
            If the object is for another machine (export it with a cross compiler instead).
        ToolchainError
            If the C compiler is missing or the link fails.
        """
        host = host_elf()
        machine = object_machine(self.obj)
        if host is not None and machine != host.machine:
            got = machine_name(machine) if machine is not None else "a non-ELF format"
            raise KilnError(f"{self.type_key} module for {self.triple or got} cannot run on this "
                            f"host ({machine_name(host.machine)}): export_library it with "
                            "fcompile=cross_compiler(...) and run it on its target")

        def objects(work: Path) -> list[str]:
            obj = work / "lib0.o"
            obj.write_bytes(self.obj)
            return [str(obj)]

        return build_cached_library("object", (self.obj,), objects)

    def __repr__(self) -> str:
        return (f"<kiln.runtime.ObjectModule type_key={self.type_key!r} triple={self.triple!r} "
                f"functions={len(self.func_names)} imports={len(self._imports)}>")
