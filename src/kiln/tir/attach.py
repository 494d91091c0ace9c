"""Lowering of ``Stage.compute_at`` (kiln.tir.lower): a producer computed one slice of its first
axis at a time inside a loop of its consumer (TVM's ``compute_at``, restricted to that form).

The weight-quantized dense ops dequantize a panel of their packed weight — the ``K × b`` floats
of one block of ``b`` output channels — under the loop over those blocks, then stream every
block of rows through it (docs/decisions/053): the producer ``[N/b, K, b]`` is never
materialized whole, and each weight is dequantized once per call instead of once per row block.
"""

from __future__ import annotations

from kiln.errors import ScheduleError
from kiln.tir import loop as L
from kiln.tir.transform.simplify import _Simplifier


def _find_loop(s: L.Stmt, name: str) -> L.For | None:
    for x in L.walk_stmts(s):
        if isinstance(x, L.For) and x.var.name == name:
            return x
    return None


def _to_slice(buf: L.Buffer, local: L.Buffer, var: L.Var, what: str):
    """An expression / statement mapper: ``buf[var, *rest]`` → ``local[*rest]``; any other
    first index of ``buf`` raises ScheduleError."""

    def check(indices: list[L.PrimExpr]) -> list[L.PrimExpr]:
        if indices[0] is not var:
            raise ScheduleError(f"compute_at: {what} reads {buf.name} at first index "
                                f"{indices[0]!r}, not the loop variable {var.name}")
        return list(indices[1:])

    def fexpr(e: L.PrimExpr) -> L.PrimExpr:
        def visit(x: L.PrimExpr) -> L.PrimExpr:
            if isinstance(x, L.BufferLoad) and x.buffer is buf:
                return L.BufferLoad(local, check(x.indices))
            return x
        return L.map_expr(e, visit)

    def fstmt(s: L.Stmt) -> L.Stmt:
        if isinstance(s, L.BufferStore) and s.buffer is buf:
            return L.BufferStore(local, s.value, check(s.indices))
        return s

    return fexpr, fstmt


def attach(nest: L.Stmt, loop_name: str, buf: L.Buffer, producer_nest: L.Stmt) -> L.Stmt:
    """``nest`` (the consumer's) with ``producer_nest`` (the producer's own nest, its first axis
    outermost, writing ``buf``) computed under the loop named ``loop_name``, one slice a
    iteration, into a local buffer of ``buf``'s shape without its first axis.

    Raises
    ------
    ScheduleError
        If ``nest`` has no such loop, the producer's nest does not start with the loop over its
        first axis, or the consumer reads ``buf`` at another first index than the loop's
        variable (after the index arithmetic is simplified).
    """
    loop = _find_loop(nest, loop_name)
    if loop is None:
        raise ScheduleError(f"compute_at: no loop {loop_name} in the consumer of {buf.name}")
    if not isinstance(producer_nest, L.For):
        raise ScheduleError(f"compute_at: {buf.name}'s nest does not start with a loop")
    local = L.Buffer(f"{buf.name}_slice", tuple(buf.shape[1:]), buf.dtype, scope="local")
    fexpr, fstmt = _to_slice(buf, local, loop.var, f"the consumer of {buf.name}")
    last = loop.extent.value - 1 if isinstance(loop.extent, L.IntImm) else float("inf")
    body = _Simplifier().stmt(loop.body, {loop.var: (0, last)})
    body = L.map_stmt(body, fexpr, fstmt)
    produce = L.substitute_stmt(producer_nest.body, {producer_nest.var: loop.var})
    produce = L.map_stmt(produce, lambda e: e, _to_slice(buf, local, loop.var, buf.name)[1])
    new_loop = L.For(loop.var, loop.min, loop.extent, loop.kind,
                     L.Allocate(local, L.seq(produce, body)))
    return L.map_stmt(nest, lambda e: e, lambda s: new_loop
                      if isinstance(s, L.For) and s.var is loop.var else s)
