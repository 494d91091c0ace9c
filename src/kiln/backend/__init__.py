"""From fused graph to artifacts: lower primitive functions to kernels (``te_compiler``), plan
memory (``memory_plan``) and write the graph executor's JSON (``graph_codegen``) or the VM's
bytecode (``vm_codegen``: shape heap, arena over symbolic sizes, run-time Ifs; ``vm_dynamic``:
the builtin calls of data-dependent ops).

May import: kiln.relay, kiln.topi, kiln.tir, kiln.arith, kiln.schedules, kiln.codegen,
kiln.runtime, kiln.target (and kiln.errors).
"""
