"""The LLVM target: packed-API PrimFuncs → LLVM IR → LLVM's O3 pipeline for the target machine
→ an ELF object (TVM's ``codegen.build_llvm``, src/target/llvm/llvm_module.cc).

``build_llvm(funcs, target)`` is the entry point: the kernels are split into groups of similar
compile cost (one LLVM module each, like the C target's files: :mod:`kiln.codegen.partition`),
each group's IR is built by :mod:`kiln.codegen.llvm_func`, taken from the compile cache
(:mod:`kiln.runtime.compile_cache`, keyed by the IR text and the target machine) or optimized and
emitted — in worker processes when several groups miss (:mod:`kiln.codegen.llvm_worker`:
llvmlite runs one LLVM call at a time per process), else here — and the result is a
:class:`~kiln.codegen.llvm_module.LLVMModule` per group, the first importing the rest. The target machine comes from the :class:`~kiln.target.Target`: triple, CPU (``native``
resolved), features, ABI, ``-opt-level``; relocations are PIC (the objects go into a shared
library) with the small code model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from kiln.codegen.partition import partition
from kiln.errors import CompileError
from kiln.ir import loop as L
from kiln.runtime import compile_cache
from kiln.runtime.toolchain import cpu_count
from kiln.target import Target

#: kernels per LLVM module (on average; modules are balanced by estimated compile cost); several
#: modules compile in parallel, and each is one compile-cache entry
KERNELS_PER_MODULE = 4
#: the optimization pipeline of :func:`compile_ir`, part of the compile-cache key (change it
#: with the pipeline)
PIPELINE = "kiln-llvm-v1: new pass manager, speed_level=opt_level, loop+slp vectorize, unroll"

#: x86 tuning on by default (a later ``-mattr=-prefer-no-gather`` turns it off): LLVM's cost model
#: prices AVX2/AVX-512 gathers and scatters as cheap and vectorizes reduction loops across rows
#: with them; squeezenet's 1x1 convolutions ran 5x slower with ``-mcpu=native`` on an AVX-512
#: host than without (measured: 125 ms vs 26 ms at one thread).
X86_TUNING = ("+prefer-no-gather", "+prefer-no-scatter")

_init_lock = threading.Lock()
_initialized = False


def llvm_binding() -> Any:
    """``llvmlite.binding`` with every target, asm printer and the native asm parser
    initialized (once).

    Raises
    ------
    CompileError
        If llvmlite is not installed.
    """
    global _initialized
    try:
        import llvmlite.binding as llvm
    except ImportError:
        raise CompileError("the llvm target needs llvmlite (pip install llvmlite)") from None
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            llvm.initialize_native_asmparser()
            _initialized = True
    return llvm


def target_machine(target: Target) -> Any:
    """The ``llvmlite.binding.TargetMachine`` for ``target``.

    Raises
    ------
    CompileError
        If LLVM does not know the triple, cannot create the machine, or the target is not
        64-bit (the packed ABI here assumes LP64).
    """
    llvm = llvm_binding()
    triple = target.triple
    try:
        tgt = llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise CompileError(f"target '{target}': LLVM does not support triple {triple!r}: "
                           f"{str(err).strip()}") from None
    try:
        tm = tgt.create_target_machine(**_machine_args(target))
    except RuntimeError as err:
        raise CompileError(f"target '{target}': LLVM cannot create a target machine "
                           f"(cpu {target.mcpu!r}): {err}") from None
    layout = str(tm.target_data)
    if "-p:32" in layout or layout.startswith("p:32"):
        raise CompileError(f"target '{target}': 32-bit targets are not supported (Kiln's "
                           "packed ABI is LP64)")
    return tm


def _machine_args(target: Target) -> dict[str, Any]:
    """``create_target_machine`` arguments for ``target`` (``native`` CPU and features
    resolved)."""
    features = (X86_TUNING if target.arch == "x86_64" else ()) + target.mattr
    return {"cpu": target.mcpu, "features": ",".join(features), "opt": target.opt_level,
            "reloc": "pic", "codemodel": "default", "abiname": target.mabi}


def machine_identity(target: Target) -> str:
    """Everything besides the IR text that decides :func:`compile_ir`'s output: the triple,
    the target machine's arguments, the pass pipeline and the llvmlite and LLVM versions."""
    import llvmlite

    llvm = llvm_binding()
    args = sorted(_machine_args(target).items())
    return (f"triple={target.triple} {args!r} {PIPELINE} llvmlite={llvmlite.__version__} "
            f"llvm={'.'.join(map(str, llvm.llvm_version_info))}")


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
    from kiln.codegen.llvm_func import ModuleCodegen

    if data_layout is None:
        data_layout = str(target_machine(target).target_data)
    scalable = (target.arch == "riscv64" and target.vector_bits() > 0) or (
        target.arch == "aarch64" and target.has_feature("sve"))
    mc = ModuleCodegen(name, target.triple, data_layout, target.vector_bits(), scalable,
                       function_attributes(target), target.int8_dot())
    for f in funcs:
        mc.add_function(f)
    return str(mc.module)


def compile_ir(text: str, target: Target, what: str = "module") -> tuple[bytes, str]:
    """Parse, verify, optimize (``-opt-level``, default 3) and emit ``text`` in a fresh LLVM
    context; returns (ELF object bytes, optimized IR text). Thread-safe.

    Raises
    ------
    CompileError
        If the IR does not parse or verify (a codegen bug: the message names ``what``).
    """
    llvm = llvm_binding()
    tm = target_machine(target)
    ctx = llvm.create_context()
    try:
        mod = llvm.parse_assembly(text, context=ctx)
        mod.verify()
    except RuntimeError as err:
        raise CompileError(f"LLVM rejected the IR of {what}: {err}") from None
    if target.opt_level > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=target.opt_level)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod), str(mod)


def emit_assembly(text: str, target: Target) -> str:
    """Assembly of (already optimized) IR ``text`` for ``target``, without further passes."""
    llvm = llvm_binding()
    mod = llvm.parse_assembly(text, context=llvm.create_context())
    return target_machine(target).emit_assembly(mod)


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
        use, ``kiln.runtime.toolchain.cpu_count``).

    Returns
    -------
    LLVMModule
        The first group's module; the other groups are its imports.

    Raises
    ------
    CompileError
        Not an llvm target, an unknown triple, or a kernel the codegen cannot handle.
    """
    from kiln.codegen.llvm_module import LLVMModule
    from kiln.codegen.llvm_worker import compile_in_workers

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
