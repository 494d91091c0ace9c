"""libkiln_runtime: Kiln's native runtime, in C, shipped as sources (``kiln runtime-dir``).

What lives here: the C sources, headers and Makefile of the library that loads a ``.so``
exported by Kiln from C or C++ without Python (TVM's ``libtvm_runtime`` role: TVM's C API
names, the blob and import-tree loader, the graph executor factory and executor, the const
loader), the header-only C++ wrapper ``kiln/runtime.hpp``, and ``kiln_run``. The graph executor
and its JSON reader are the C runtime's (``kiln/crt/``), shared. Nothing here is imported by
the compiler; Python only reads :data:`RUNTIME_DIR`. See docs/decisions/022-native-runtime.md.
"""

from __future__ import annotations

from pathlib import Path

#: the folder holding the Makefile (``make -C RUNTIME_DIR BUILD=...``)
RUNTIME_DIR = Path(__file__).resolve().parent

__all__ = ["RUNTIME_DIR"]
