"""From fused graph to artifacts: lower primitive functions to kernels (``te_compiler``), plan
memory (``memory_plan``) and write the graph executor's JSON (``graph_codegen``).
May import kiln.ir, kiln.ops, kiln.schedules, kiln.passes, kiln.codegen and kiln.errors."""
