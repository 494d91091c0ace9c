"""Code generators: packed-API loop-IR PrimFuncs → runtime modules.

``c``: one C translation unit per group of kernels (a ``CSourceModule``, compiled by the system
C compiler at export time). ``llvm`` (+ ``llvm_func``, ``llvm_module``): LLVM IR built with
llvmlite, optimized and emitted as an ELF object per group (an ``LLVMModule``, linked as ``.o``),
for any triple LLVM knows; ``llvm_machine`` (the target machine, the optimization of one module)
is all that the ``llvm_worker`` processes import. Both map the same loop-IR vocabulary and the same
packed
ABI (``kiln.tir.transform.make_packed_api``), and both outline parallel loops into lambdas for
``TVMBackendParallelLaunch`` (``outline``: what a lambda captures). llvmlite is imported only
by the llvm files.

May import: kiln.tir, kiln.target, kiln.runtime (and kiln.errors).
"""
