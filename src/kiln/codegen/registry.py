"""Code generators by target kind (TVM's ``target.build.<kind>`` functions and the
``codegen.CSourceModuleCreate`` / ``LLVMModuleCreate`` pair of the system library).

Every place that turns kernels into a runtime module — ``kiln.build``, the tuner's candidate
builds, the C runtime's system library — asks :func:`get_codegen` for the target's kind, so
a new code generator is one :class:`Codegen` and one :func:`register_codegen` call. The
built-in kinds are ``llvm`` (:mod:`kiln.codegen.llvm.build`, LLVM objects through llvmlite), ``c``
(:mod:`kiln.codegen.c.source`, C source compiled at export time) and ``jit`` (the same C, kept in
the artifact and compiled where the model runs: :mod:`kiln.runtime.jit.device_module`).
Multi-level libraries (``llvm -mcpu=portable``) compile one kernel list per level and are
built by :mod:`kiln.codegen.llvm.multi_level`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kiln.codegen.target_info  # noqa: F401 (registers codegen.target_info for export)
from kiln.errors import CompileError
from kiln.target import Target

# Kernels per generated C file (on average; files are balanced by estimated compile cost, see
# kiln.codegen.partition): several files let the C compiler run in parallel and keep the
# compile cache's unit small.
KERNELS_PER_FILE = 4


@dataclass(frozen=True)
class Codegen:
    """One target kind's code generator.

    Attributes
    ----------
    build : ``(kernels: Sequence[PrimFunc], target: Target, jobs: int | None) -> Module``
        Packed-API kernels (``kiln.tir.transform.make_packed_api``) → the kernel library's
        root module; ``jobs`` bounds parallel compile workers (None: the default).
    system_lib_registry : ``(names, symbols, prefix, target) -> Module``
        The C runtime's function table for the system library (``kiln.codegen.system_lib``):
        ``names`` the graph's kernel names, ``symbols`` name → defined symbol.
    stage : str
        What the progress display says while ``build`` runs.
    """

    build: Callable[..., Any]
    system_lib_registry: Callable[..., Any]
    stage: str


def c_compile_options(target: Target) -> list[str]:
    """C compiler flags for ``target``: ``-mcpu=X`` → ``-march=X`` (``native``: this CPU)."""
    cpu = target.options.get("mcpu")
    return [f"-march={cpu}"] if isinstance(cpu, str) else []


def _build_c(kernels: Sequence, target: Target, jobs: int | None = None):
    """One C source module per group of kernels (groups of similar compile cost, independent
    of the machine); the first imports the rest."""
    from kiln.codegen.c.source import build_c_source
    from kiln.codegen.partition import partition
    from kiln.runtime import CSourceModule

    options = c_compile_options(target)
    mods = [CSourceModule(build_c_source(c), [k.name for k in c], compile_options=options)
            for c in partition(kernels, KERNELS_PER_FILE)]
    for m in mods:  # for the library's __kiln_target_info (kiln.codegen.target_info)
        m.target = str(target)
    for m in mods[1:]:
        mods[0].import_module(m)
    return mods[0]


def _build_jit(kernels: Sequence, target: Target, jobs: int | None = None):
    """The kernels as C source (translation units grouped as for the ``c`` target, compiled in
    parallel at run time), kept as source in the artifact and compiled where the model runs.
    Kernels of ``lower_primitive`` write one output, their last argument."""
    from kiln.codegen.c.source import build_c_source
    from kiln.codegen.partition import partition
    from kiln.runtime.jit.device_module import DeviceFunction, SourceDeviceModule

    funcs = [DeviceFunction(k.name, tuple(b.dtype for b in k.params), 1) for k in kernels]
    units = [build_c_source(u) for u in partition(kernels, KERNELS_PER_FILE)]
    return SourceDeviceModule(units, funcs)


def _build_llvm(kernels: Sequence, target: Target, jobs: int | None = None):
    from kiln.codegen.llvm.build import build_llvm

    return build_llvm(kernels, target, jobs=jobs)


def _c_registry(names: list[str], symbols: Mapping[str, str], prefix: str, target: Target):
    from kiln.codegen.system_lib import c_registry_source
    from kiln.runtime import CSourceModule

    return CSourceModule(c_registry_source(names, symbols, prefix), [])


def _llvm_registry(names: list[str], symbols: Mapping[str, str], prefix: str, target: Target):
    from kiln.codegen.llvm.machine import compile_ir, target_machine
    from kiln.codegen.llvm.module import LLVMModule
    from kiln.codegen.system_lib import llvm_registry_ir

    layout = str(target_machine(target).target_data)
    text = llvm_registry_ir(names, symbols, prefix, target.triple, layout)
    obj, ir = compile_ir(text, target, what="the system library registry")
    return LLVMModule(obj, [], target, ir)


_CODEGENS: dict[str, Codegen] = {
    "llvm": Codegen(_build_llvm, _llvm_registry, "Generating code with LLVM"),
    "c": Codegen(_build_c, _c_registry, "Generating C"),
    "jit": Codegen(_build_jit, _c_registry, "Generating C for the jit device"),
}


def register_codegen(kind: str, codegen: Codegen) -> None:
    """Register the code generator of target kind ``kind`` (replacing none: registering a
    kind twice raises CompileError)."""
    if kind in _CODEGENS:
        raise CompileError(f"a code generator for target kind {kind!r} is already registered")
    _CODEGENS[kind] = codegen


def get_codegen(kind: str) -> Codegen:
    """The code generator of target kind ``kind``.

    Raises
    ------
    CompileError
        No code generator is registered for ``kind`` (the message lists those that are).
    """
    try:
        return _CODEGENS[kind]
    except KeyError:
        raise CompileError(f"no code generator for target kind {kind!r}; registered: "
                           f"{', '.join(sorted(_CODEGENS))}") from None
