"""Kiln's C runtime (CRT) and the C projects that use it: deployment without Python.

What lives here: the Python that writes C projects and static libraries from a build
(:mod:`kiln.crt.project`), including the AOT executor's factory
(:class:`kiln.crt.aot_factory.AotExecutorFactory`). It may import ``kiln.runtime`` and the
AOT codegen's descriptions of a graph (``kiln.backend.aot_codegen``); the code generators
themselves have run in ``kiln.build`` already.

The runtime's C sources (``kiln_crt*.c``/``.h``, C99, no allocation beyond a caller's arena: the
system-library registry lookup, packed calls, the graph executor with its JSON reader, the
backend callbacks kernels need) live with all of Kiln's C in ``kiln/native/src/crt/``
(:data:`CRT_DIR`; docs/decisions/030-one-c-tree.md); a C project gets them in its ``crt/``.

May import: kiln.backend, kiln.runtime, kiln.native (and kiln.errors).
"""

from __future__ import annotations

from kiln.native import CRT_DIR

#: the backend callbacks: every CRT program and every AOT program needs them
BACKEND_SOURCES = ("kiln_crt.h", "kiln_crt_graph.h", "kiln_crt_backend.c", "kiln_crt_arena.c")
#: the graph executor and system-library lookup, on top of the backend
GRAPH_SOURCES = (*BACKEND_SOURCES, "kiln_crt_registry.c", "kiln_crt_json.h", "kiln_crt_json.c",
                 "kiln_crt_graph_executor.c")

__all__ = ["BACKEND_SOURCES", "CRT_DIR", "GRAPH_SOURCES"]
