"""What an outlined parallel loop captures: the buffers and variables its body uses but does not
define. Both codegens outline each ``parallel`` loop into an ``FTVMParallelLambda`` whose
closure holds exactly these (TVM's ``CodeGenCPU::CreateParallelLaunch`` collects the same with
``UndefinedVars``), so the C and LLVM targets run on the one pool of the support code.
"""

from __future__ import annotations

from kiln.tir import loop as L


def free_refs(body: L.Stmt) -> tuple[list[L.Buffer], list[L.Var]]:
    """Buffers and variables ``body`` uses but does not define (first use first)."""
    bufs: dict[L.Buffer, None] = {}
    vars_: dict[L.Var, None] = {}
    defined_bufs: set[int] = set()
    defined_vars: set[int] = set()
    for s in L.walk_stmts(body):
        if isinstance(s, (L.For, L.LetStmt)):
            defined_vars.add(id(s.var))
        elif isinstance(s, L.Allocate):
            defined_bufs.add(id(s.buffer))
        elif isinstance(s, L.BufferStore):
            bufs.setdefault(s.buffer)
        for x in L.walk_exprs(L.stmt_exprs(s)):
            if isinstance(x, L.Var):
                vars_.setdefault(x)
            elif isinstance(x, L.BufferLoad):
                bufs.setdefault(x.buffer)
    for buf in list(bufs):  # symbolic shapes: their variables are used by the addressing
        for d in buf.shape:
            if isinstance(d, L.PrimExpr):
                for v in L.expr_vars(d):
                    vars_.setdefault(v)
    return ([b for b in bufs if id(b) not in defined_bufs],
            [v for v in vars_ if id(v) not in defined_vars])
