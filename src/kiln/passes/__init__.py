"""Compiler passes, one concept per module: ``graph`` (graph IR → graph IR) and ``loop`` (loop IR
→ loop IR). A pass is a plain function ``IR -> IR`` with a ``name`` attribute, so pass lists can
be printed, dumped stage by stage and tested one pass at a time. May import kiln.ir, kiln.ops and
kiln.errors — never kiln.runtime or kiln.frontend.
"""
