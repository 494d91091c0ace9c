"""Everything Kiln ships in C, in one folder (``kiln runtime-dir``;
docs/decisions/030-one-c-tree.md).

What lives here: the Makefile of libkiln_runtime, Kiln's native runtime (load a ``.so``
exported by Kiln from C or C++ without Python: TVM's ``libtvm_runtime`` role, TVM's C API
names, the blob and import-tree loader, the graph executor factory and executor, the const
loader, the VM, the jit device), and ``kiln_run``; and every C source and header the compiler
ships with it::

    Makefile          libkiln_runtime.so/.a, kiln_run, include/ (only -I: include/)
    include/kiln/     the one include root: c_runtime_api.h (the ABI every kernel, support
                      source and runtime includes), runtime.h, runtime.hpp (native runtime API)
    src/              the native runtime (rt_*.c, its private rt_*.h, rt_embed.S)
    src/support/      linked into every exported library: backend.c, amx.c; device_server.c
    src/crt/          the C runtime (C99, kiln_crt*.c/.h): emitted C projects copy it flat;
                      the native runtime shares its graph executor and JSON reader
    src/byoc/         the BYOC backends' C pasted into their generated code (cblas)
    tools/            kiln_run

Nothing here is imported by the compiler: Python only reads the paths below. The folder builds
wherever it is copied (no path leaves it). See docs/decisions/022-native-runtime.md.

May import: kiln.errors only.
"""

from __future__ import annotations

from pathlib import Path

#: the folder holding the Makefile (``make -C RUNTIME_DIR BUILD=...``)
RUNTIME_DIR = Path(__file__).resolve().parent
#: the one include root (``-I``): ``kiln/c_runtime_api.h``, ``kiln/runtime.h``, ``kiln/runtime.hpp``
INCLUDE_DIR = RUNTIME_DIR / "include"
#: the support sources linked into exported libraries, and the device server
SUPPORT_DIR = RUNTIME_DIR / "src" / "support"
#: the C runtime's sources and headers (kiln.crt.project copies them into a C project's crt/)
CRT_DIR = RUNTIME_DIR / "src" / "crt"
#: C that BYOC codegens paste into their generated sources (``cblas_kernels.c``)
BYOC_DIR = RUNTIME_DIR / "src" / "byoc"

__all__ = ["BYOC_DIR", "CRT_DIR", "INCLUDE_DIR", "RUNTIME_DIR", "SUPPORT_DIR"]
