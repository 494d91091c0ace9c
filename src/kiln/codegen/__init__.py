"""Code generators: packed-API loop-IR PrimFuncs → runtime modules.

Two built in, one folder each, chosen by target kind in ``registry`` (TVM's
``target.build.<kind>``): ``c/`` (one C translation unit per group of kernels, a
``CSourceModule`` compiled by the system C compiler at export time; the ``jit`` target keeps the
same C in the artifact) and ``llvm/`` (LLVM IR built with llvmlite, optimized and emitted as an
ELF object per group, an ``LLVMModule`` linked as ``.o``, for any triple LLVM knows). Both map
the same loop-IR vocabulary and the same packed ABI (``kiln.tir.transform.make_packed_api``),
and both outline parallel loops into lambdas for ``TVMBackendParallelLaunch`` (``outline``:
what a lambda captures). ``partition`` splits kernels into compilation units, ``system_lib``
writes the C runtime's function table. llvmlite is imported only under ``llvm/``.

May import: kiln.tir, kiln.target, kiln.runtime (and kiln.errors).
"""
