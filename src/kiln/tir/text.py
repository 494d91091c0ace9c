"""A readable text form of loop-IR PrimFuncs (for KILN_DUMP_IR and error messages)."""

from __future__ import annotations

from kiln.tir import loop as L


def astext(func: L.PrimFunc) -> str:
    params = ", ".join(repr(b) for b in func.params)
    lines = [f"primfn {func.name}({params}) {{"]
    _stmt(func.body, 1, lines)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _stmt(s: L.Stmt, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(s, L.For):
        out.append(f"{pad}for {s.var} in range({s.min}, {s.min} + {s.extent}) [{s.kind}]:")
        _stmt(s.body, depth + 1, out)
    elif isinstance(s, L.BufferStore):
        out.append(f"{pad}{s.buffer.name}[{', '.join(map(repr, s.indices))}] = {s.value!r}")
    elif isinstance(s, L.SeqStmt):
        for x in s.stmts:
            _stmt(x, depth, out)
    elif isinstance(s, L.Allocate):
        out.append(f"{pad}allocate {s.buffer!r} ({s.buffer.scope}):")
        _stmt(s.body, depth + 1, out)
    elif isinstance(s, L.IfThenElse):
        out.append(f"{pad}if {s.cond!r}:")
        _stmt(s.then_case, depth + 1, out)
        if s.else_case is not None:
            out.append(f"{pad}else:")
            _stmt(s.else_case, depth + 1, out)
    elif isinstance(s, L.AssertStmt):
        out.append(f"{pad}assert {s.cond!r}, {s.message!r}")
        _stmt(s.body, depth, out)
    elif isinstance(s, L.LetStmt):
        out.append(f"{pad}let {s.var.name} = {s.value!r}")
        _stmt(s.body, depth, out)
    elif isinstance(s, L.Evaluate):
        out.append(f"{pad}{s.value!r}")
