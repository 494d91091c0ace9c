"""The loop-IR verifier: structural invariants every pass must keep.

Checked: every variable is bound by an enclosing loop; every buffer accessed is a parameter or
allocated by an enclosing ``Allocate``; loads and stores have one index per dimension and int64
indices; a store's value has its buffer's dtype; a loop variable is bound once; no parallel loop
encloses another, nor stores into a local buffer allocated outside it (its iterations would
share the buffer: a race). Run between passes when ``KILN_DEBUG`` is set, and always in tests.
"""

from __future__ import annotations

from kiln.errors import CompileError
from kiln.tir import loop as L


def verify(func: L.PrimFunc) -> None:
    """Raise CompileError naming the function and the first broken invariant."""
    _Verifier(func).stmt(func.body, set(), set(map(id, func.params)), False)


class _Verifier:
    def __init__(self, func: L.PrimFunc):
        self.func = func
        self.bound: set[int] = set()
        self.local: set[int] = set()  # ids of "local" buffers allocated so far
        self.shared_local: set[int] = set()  # local buffers visible from the parallel loop

    def fail(self, msg: str) -> None:
        raise CompileError(f"loop IR of {self.func.name} is invalid: {msg}")

    def stmt(self, s: L.Stmt, scope: set[int], buffers: set[int], in_parallel: bool) -> None:
        if isinstance(s, L.For):
            if id(s.var) in self.bound:
                self.fail(f"loop variable {s.var.name} is bound twice")
            self.bound.add(id(s.var))
            self.expr(s.min, scope, buffers)
            self.expr(s.extent, scope, buffers)
            if s.kind == "parallel" and in_parallel:
                self.fail(f"parallel loop {s.var.name} inside another parallel loop")
            if s.kind == "parallel":
                self.shared_local = buffers & self.local
            self.stmt(s.body, scope | {id(s.var)}, buffers, in_parallel or s.kind == "parallel")
            if s.kind == "parallel":
                self.shared_local = set()
        elif isinstance(s, L.BufferStore):
            if in_parallel and id(s.buffer) in self.shared_local:
                self.fail(f"parallel loop stores into local buffer {s.buffer.name} allocated "
                          "outside it (a race between its iterations)")
            self.access(s.buffer, s.indices, scope, buffers)
            self.expr(s.value, scope, buffers)
            if s.value.dtype != s.buffer.dtype:
                self.fail(f"store of {s.value.dtype} into {s.buffer.name}:{s.buffer.dtype}")
        elif isinstance(s, L.Allocate):
            if s.buffer.scope == "local":
                self.local.add(id(s.buffer))
            self.stmt(s.body, scope, buffers | {id(s.buffer)}, in_parallel)
        elif isinstance(s, L.SeqStmt):
            for x in s.stmts:
                self.stmt(x, scope, buffers, in_parallel)
        elif isinstance(s, L.IfThenElse):
            self.expr(s.cond, scope, buffers)
            self.stmt(s.then_case, scope, buffers, in_parallel)
            if s.else_case is not None:
                self.stmt(s.else_case, scope, buffers, in_parallel)
        elif isinstance(s, L.AssertStmt):
            self.expr(s.cond, scope, buffers)
            self.stmt(s.body, scope, buffers, in_parallel)
        elif isinstance(s, L.LetStmt):
            self.expr(s.value, scope, buffers)
            self.stmt(s.body, scope | {id(s.var)}, buffers, in_parallel)
        elif isinstance(s, L.Evaluate):
            self.expr(s.value, scope, buffers)
        else:
            self.fail(f"unknown statement {type(s).__name__}")

    def access(self, buf: L.Buffer, indices, scope, buffers) -> None:
        if id(buf) not in buffers:
            self.fail(f"buffer {buf.name} is neither a parameter nor allocated here")
        if len(indices) != len(buf.shape):
            self.fail(f"{buf.name} has {len(buf.shape)} dims, accessed with {len(indices)}")
        for i in indices:
            if i.dtype != L.INT:
                self.fail(f"index of {buf.name} has dtype {i.dtype}")
            self.expr(i, scope, buffers)

    def expr(self, e: L.PrimExpr, scope: set[int], buffers: set[int]) -> None:
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, L.Var) and id(x) not in scope:
                self.fail(f"variable {x.name} is used outside its loop")
            if isinstance(x, L.BufferLoad):
                self.access(x.buffer, x.indices, scope, buffers)
                continue
            if not isinstance(x, L.PrimExpr):
                self.fail(f"{type(x).__name__} is not a loop-IR expression")
            stack.extend(L.expr_children(x))
