"""The virtual machine for models with symbolic shapes (TVM's Relax VM,
``src/runtime/relax_vm/``; docs/decisions/014-vm-executable.md).

``executable`` (``VMExecutable``, the runtime module) holds the bytecode, constants and
function table in the byte format of ``executable_format`` (a versioned section table) and
``bytecode`` (instruction words and their checks). ``virtual_machine`` runs it: ``builtins``
(``vm.builtin.*``, prepared once per call site; ``dynamic_builtins`` for data-dependent ops,
``list_builtins`` for run-time loops, ``kv_cache`` for caches that grow in place), ``storage``
(the arena), ``inputs`` (caller values to registers), ``trace`` and ``replay`` (a traced call
replayed for any shape-heap values), ``profile`` (time_evaluator and per-kernel profiles).
The user-facing wrapper is ``kiln.vm``; the C twin is ``kiln/native/src/rt_vm*.c``.
"""
