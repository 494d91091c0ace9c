"""What ``kiln.build(..., executor="aot")`` returns (TVM's ``AOTExecutorFactoryModule``): the
kernel library and the AOT executor's generated sources, ready to become a C project or a
static library. Nothing here runs in Python: the model runs in the C program.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.backend.aot_codegen import AotSources
from kiln.runtime.module import Module


class AotExecutorFactory:
    """An AOT-compiled model.

    Attributes
    ----------
    lib : Module
        The kernel library (``c`` sources or ``llvm`` objects), symbols prefixed ``kiln_<m>_``.
    sources : AotSources
        ``kiln_<m>.c`` (the run function), its header, the linked params.
    mod_name : str
        The model name (``kiln_<m>_run``, with ``<m>`` this name as a C identifier).
    """

    def __init__(self, lib: Module, sources: AotSources, mod_name: str):
        self.lib = lib
        self.sources = sources
        self.mod_name = mod_name

    @property
    def workspace_bytes(self) -> int:
        """The static workspace: activations plus the kernels' workspace stack, in bytes."""
        return self.sources.workspace_bytes

    @property
    def params_bytes(self) -> int:
        """The linked params (``.rodata``), in bytes, 64-byte aligned each."""
        return self.sources.params_bytes

    @property
    def entry_function(self) -> str:
        return f"kiln_{self.sources.c_name}_run"

    def emit_c_project(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write a ready C project (see :mod:`kiln.crt.project`) to ``out_dir``.

        Raises
        ------
        KilnError
            ``out_dir`` exists and is not a project Kiln wrote.
        """
        from kiln.crt.project import aot_project, write_project

        return write_project(aot_project(self), out_dir)

    def export_library(self, file_name: str | os.PathLike[str], cc: list[str] | None = None
                       ) -> Path:
        """Build the static library ``file_name`` (``.a``): kernels, the run function, the
        linked params and the CRT backend callbacks; link it with ``-lm``.

        Raises
        ------
        ToolchainError
            The compiler or ``ar`` fails.
        """
        from kiln.crt.project import aot_project, build_static_library

        return build_static_library(aot_project(self), file_name, cc)

    def __repr__(self) -> str:
        return (f"<kiln.crt.AotExecutorFactory {self.entry_function} workspace="
                f"{self.workspace_bytes} params={self.params_bytes}>")
