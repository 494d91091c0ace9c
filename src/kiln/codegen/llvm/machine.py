"""The LLVM target machine and the optimization of one module: what the LLVM worker processes
(:mod:`kiln.codegen.llvm.worker`) run, split from :mod:`kiln.codegen.llvm.build` so that a worker
imports llvmlite, :mod:`kiln.target` and :mod:`kiln.errors` only.

A worker that imported :mod:`kiln.codegen.llvm.build` also loaded the loop IR, the partitioner and
``kiln.runtime`` (numpy, ctypes, the module system) that it never uses: 0.46–0.59 s of CPU per
worker start against 0.17–0.20 s for llvmlite alone, and a build that misses the compile cache on
two or more kernel groups starts one worker per CPU.
"""

from __future__ import annotations

import threading
from typing import Any

from kiln.errors import CompileError
from kiln.target import Target

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
