"""Splitting kernels into compilation units (C files, LLVM modules) of similar compile cost.

The C compiler and LLVM compile one unit per process, so a model's build takes as long as its
slowest unit once the units outnumber the cores. Units are therefore balanced by an estimate of
their compile cost — the size of each kernel's loop IR, unrolled loops counted as many times as
they unroll (the compiler's work grows with the code it emits) — using the
longest-processing-time rule: kernels by decreasing cost, each into the cheapest unit so far.

The split depends only on the kernels (not on the machine's CPU count): the same model gives
the same sources and objects everywhere, which the compile cache
(:mod:`kiln.runtime.toolchain.compile_cache`) relies on.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.tir import loop as L


def stmt_cost(s: L.Stmt) -> int:
    """Estimated compile cost of ``s``: statements counted, unrolled loop bodies times their
    extent."""
    if isinstance(s, L.For):
        body = stmt_cost(s.body)
        if s.kind == "unrolled" and isinstance(s.extent, L.IntImm):
            body *= max(1, s.extent.value)
        return 1 + body
    if isinstance(s, L.SeqStmt):
        return 1 + sum(stmt_cost(x) for x in s.stmts)
    if isinstance(s, (L.Allocate, L.AssertStmt, L.LetStmt)):
        return 1 + stmt_cost(s.body)
    if isinstance(s, L.IfThenElse):
        other = stmt_cost(s.else_case) if s.else_case is not None else 0
        return 1 + stmt_cost(s.then_case) + other
    return 1


def partition(funcs: Sequence[L.PrimFunc], per_unit: int) -> list[list[L.PrimFunc]]:
    """``funcs`` in ``ceil(len / per_unit)`` units of balanced cost (at least one, possibly
    empty, unit); each unit keeps the kernels' original order. Deterministic."""
    funcs = list(funcs)
    n = max(1, -(-len(funcs) // max(1, per_unit)))
    costs = [stmt_cost(f.body) for f in funcs]
    loads = [0] * n
    members: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(funcs)), key=lambda k: (-costs[k], k)):
        u = min(range(n), key=lambda j: (loads[j], j))
        loads[u] += costs[i]
        members[u].append(i)
    units = [[funcs[i] for i in sorted(m)] for m in members]
    return [u for u in units if u] or [[]]
