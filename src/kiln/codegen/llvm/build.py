"""The LLVM target: packed-API PrimFuncs → LLVM IR → LLVM's O3 pipeline for the target machine
→ an ELF object (TVM's ``codegen.build_llvm``, src/target/llvm/llvm_module.cc).

``build_llvm(funcs, target)`` is the entry point: the kernels are split into groups of similar
compile cost (one LLVM module each, like the C target's files: :mod:`kiln.codegen.partition`),
each group's IR is built by :mod:`kiln.codegen.llvm.func`, taken from the compile cache
(:mod:`kiln.runtime.toolchain.compile_cache`, keyed by the IR text and the target machine) or
optimized and
emitted — in worker processes when several groups miss (:mod:`kiln.codegen.llvm.worker`:
llvmlite runs one LLVM call at a time per process), else here — and the result is a
:class:`~kiln.codegen.llvm.module.LLVMModule` per group, the first importing the rest. The target
machine comes from the :class:`~kiln.target.Target`: triple, CPU (``native``
resolved), features, ABI, ``-opt-level``; relocations are PIC (the objects go into a shared
library) with the small code model (:mod:`kiln.codegen.llvm.machine`).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kiln.codegen.llvm.machine import compile_ir, machine_identity, target_machine
from kiln.codegen.partition import partition
from kiln.errors import CompileError
from kiln.runtime.toolchain import compile_cache
from kiln.runtime.toolchain.compiler import cpu_count
from kiln.target import Target
from kiln.tir import loop as L

#: kernels per LLVM module (on average; modules are balanced by estimated compile cost); several
#: modules compile in parallel, and each is one compile-cache entry
KERNELS_PER_MODULE = 4


def function_attributes(target: Target) -> tuple[str, ...]:
    """Attributes for every generated function: on x86 with AVX-512, LLVM's default tuning
    prefers 256-bit vectors ("prefer-256-bit" on Skylake-AVX512 and later); ask for the full
    width the target reports, as schedules assume it."""
    if target.arch == "x86_64" and target.vector_bits() == 512:
        return ('"prefer-vector-width"="512"',)
    return ()


def codegen_ir(funcs: Sequence[L.PrimFunc], target: Target, name: str = "kiln",
               data_layout: str | None = None) -> str:
    """LLVM IR text (before optimization) of a module holding the packed functions ``funcs``.

    Raises
    ------
    CompileError
        A function was not passed through MakePackedAPI or uses an unsupported dtype,
        intrinsic or statement (the message names it).
    """
    from kiln.codegen.llvm.func import ModuleCodegen

    with _collector_paused():
        if data_layout is None:
            data_layout = str(target_machine(target).target_data)
        scalable = (target.arch == "riscv64" and target.vector_bits() > 0) or (
            target.arch == "aarch64" and target.has_feature("sve"))
        mc = ModuleCodegen(name, target.triple, data_layout, target.vector_bits(), scalable,
                           function_attributes(target), target.int8_dot())
        for f in funcs:
            mc.add_function(f)
        text = str(mc.module)
        del mc  # garbage now: llvmlite's values, blocks and functions refer to each other
    return text


#: builds in progress in this process, and whether the collector was on when the first began
_pause_lock = threading.Lock()
_pause_depth = 0
_pause_resumes = False


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Run the body with Python's cyclic garbage collector paused, then collect the youngest
    generation once (nothing changes when the collector was already off).

    Why: a module being built is hundreds of thousands of llvmlite objects that all live until
    its text is printed. The collector kept scanning them, promoting them and running full
    collections over the whole compiler heap (1.7 of the 6 s of main-process CPU of an int8
    ResNet-50 build). Paused, they stay young, and once the module is dropped one collection
    of the youngest generation frees its reference cycles: the memory peak is the module's, as
    before. The switch is process-wide (``gc`` has no per-thread one): builds in several threads
    share one pause (a count under a lock), which the last one to end lifts; other threads
    meanwhile collect later, and a ``gc.enable``/``gc.disable`` they call during a build is
    overridden when the pause is lifted.
    """
    global _pause_depth, _pause_resumes
    with _pause_lock:
        if _pause_depth == 0:
            _pause_resumes = gc.isenabled()
            gc.disable()
        _pause_depth += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause_depth -= 1
            resume = _pause_depth == 0 and _pause_resumes
            if resume:
                gc.enable()
        if resume:
            gc.collect(0)


def build_llvm(funcs: Sequence[L.PrimFunc], target: str | Target = "llvm",
               jobs: int | None = None):
    """Compile packed PrimFuncs for an ``llvm`` target.

    Parameters
    ----------
    funcs : list of PrimFunc
        Kernels after MakePackedAPI (distinct names).
    target : str or Target
        An ``llvm`` target.
    jobs : int, optional
        Parallel LLVM compilations (worker processes; default: the CPUs this process may
        use, ``kiln.runtime.toolchain.compiler.cpu_count``).

    Returns
    -------
    LLVMModule
        The first group's module; the other groups are its imports.

    Raises
    ------
    CompileError
        Not an llvm target, an unknown triple, or a kernel the codegen cannot handle.
    """
    from kiln.codegen.llvm.module import LLVMModule
    from kiln.codegen.llvm.worker import compile_in_workers

    tgt = Target(target)
    if tgt.kind != "llvm":
        raise CompileError(f"build_llvm: target '{tgt}' is not an llvm target")
    groups = partition(funcs, KERNELS_PER_MODULE)
    layout = str(target_machine(tgt).target_data)
    texts = [codegen_ir(g, tgt, f"kiln_lib{i}", layout) for i, g in enumerate(groups)]
    whats = [f"kernels {[f.name for f in g][:4]}{' ...' if len(g) > 4 else ''}"
             for g in groups]
    results: list[tuple[bytes, str] | None] = [None] * len(texts)
    keys: list[str | None] = [None] * len(texts)
    if compile_cache.enabled():
        identity = machine_identity(tgt)
        for i, text in enumerate(texts):
            key = keys[i] = compile_cache.make_key("kiln-llvm-object-v1", identity, text)
            hit = compile_cache.load(key, "llvm", what=whats[i])
            if hit is not None and len(hit) == 2:
                results[i] = (hit[0], hit[1].decode())
    misses = [i for i, r in enumerate(results) if r is None]
    workers = min(len(misses), jobs or cpu_count())
    done = None
    if workers > 1:
        done = compile_in_workers([(texts[i], whats[i]) for i in misses], str(tgt), workers)
    if done is None:
        done = [compile_ir(texts[i], tgt, what=whats[i]) for i in misses]
    for i, (obj, ir) in zip(misses, done, strict=True):
        results[i] = (obj, ir)
        if keys[i] is not None:
            compile_cache.store(str(keys[i]), "llvm", [obj, ir.encode()], what=whats[i])
    mods = [LLVMModule(r[0], [f.name for f in g], tgt, r[1])
            for r, g in zip(results, groups, strict=True) if r is not None]
    for m in mods[1:]:
        mods[0].import_module(m)
    return mods[0]
