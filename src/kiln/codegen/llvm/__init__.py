"""The LLVM code generator (TVM's ``src/target/llvm/``), through llvmlite.

``build`` is the entry point (``build_llvm``: kernels split into groups, one LLVM module and
ELF object each); ``func`` lowers one packed function (with ``expr`` for expressions,
``vector`` for explicit SIMD, ``ir`` for shared IR building blocks); ``machine`` is the target
machine and the optimization of one module, all that the ``worker`` processes import;
``module`` is the compiler's side of the ``llvm`` runtime module; ``multi_level`` builds one
library for several x86-64 levels. Nothing here is imported at package import time: workers
start on ``machine`` alone.
"""
