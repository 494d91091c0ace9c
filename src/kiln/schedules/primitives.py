"""Loop-level schedule primitives over a lowered PrimFunc.

Each primitive is a pure function ``(func, loop, ...) -> func`` that checks its preconditions and
raises :class:`~kiln.errors.ScheduleError` when they do not hold. Loops are found by their loop
variable's name (:func:`get_loop`) or by walking (:func:`top_level_nests`).
"""

from __future__ import annotations

from kiln.errors import ScheduleError
from kiln.tir import loop as L


def get_loop(func: L.PrimFunc, var_name: str) -> L.For:
    """The first loop (in walk order) whose variable is named ``var_name``.

    Parameters
    ----------
    func : PrimFunc
        The lowered function.
    var_name : str
        The loop variable's name (``"y"``, ``"x_o"``...).

    Returns
    -------
    For

    Raises
    ------
    ScheduleError
        No loop of ``func`` has that variable.
    """
    for s in L.walk_stmts(func.body):
        if isinstance(s, L.For) and s.var.name == var_name:
            return s
    raise ScheduleError(f"{func.name}: no loop over '{var_name}'")


def top_level_nests(func: L.PrimFunc) -> list[L.For]:
    """The outermost loops of each statement nest of ``func``.

    Looks through SeqStmt, AssertStmt, LetStmt, IfThenElse (a kernel's shape-specialized
    versions) and global Allocate. Not through a ``local`` Allocate: the loops under it share
    the local buffer (an accumulator block whose spatial loops all had extent 1), so they are
    not nests of independent iterations.

    Parameters
    ----------
    func : PrimFunc

    Returns
    -------
    list of For
        In program order.
    """
    found: list[L.For] = []
    stack: list[L.Stmt] = [func.body]
    while stack:
        s = stack.pop()
        if isinstance(s, L.For):
            found.append(s)
        elif isinstance(s, L.SeqStmt):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, (L.AssertStmt, L.LetStmt)) or (isinstance(s, L.Allocate)
                                              and s.buffer.scope != "local"):
            stack.append(s.body)
        elif isinstance(s, L.IfThenElse):  # shape-specialized versions of a kernel
            stack.extend(x for x in (s.else_case, s.then_case) if x is not None)
    return found


def _replace(func: L.PrimFunc, target: L.For, new: L.Stmt) -> L.PrimFunc:
    replaced = {id(target): new}

    def rec(s: L.Stmt) -> L.Stmt:
        if id(s) in replaced:
            return replaced[id(s)]
        if isinstance(s, L.For):
            body = rec(s.body)
            return s if body is s.body else L.For(s.var, s.min, s.extent, s.kind, body)
        if isinstance(s, L.Allocate):
            body = rec(s.body)
            return s if body is s.body else L.Allocate(s.buffer, body)
        if isinstance(s, L.AssertStmt):
            body = rec(s.body)
            return s if body is s.body else L.AssertStmt(s.cond, s.message, s.args, body)
        if isinstance(s, L.LetStmt):
            body = rec(s.body)
            return s if body is s.body else L.LetStmt(s.var, s.value, body)
        if isinstance(s, L.SeqStmt):
            stmts = [rec(x) for x in s.stmts]
            return s if all(a is b for a, b in zip(stmts, s.stmts)) else L.SeqStmt(stmts)
        if isinstance(s, L.IfThenElse):
            t = rec(s.then_case)
            e = rec(s.else_case) if s.else_case else None
            # unchanged: the same object, so loops under it keep their identity for the next
            # primitive (a kernel's second version is found again after the first is fused)
            return s if t is s.then_case and e is s.else_case else L.IfThenElse(s.cond, t, e)
        return s

    return L.PrimFunc(func.name, func.params, rec(func.body), dict(func.attrs))


def _const_extent(loop: L.For, what: str) -> int:
    if not isinstance(loop.extent, L.IntImm) or not _is_zero(loop.min):
        raise ScheduleError(f"{what}: loop {loop.var.name} must start at 0 with a constant extent")
    return loop.extent.value


def _is_zero(e: L.PrimExpr) -> bool:
    return isinstance(e, L.IntImm) and e.value == 0


def annotate(func: L.PrimFunc, loop: L.For, kind: str) -> L.PrimFunc:
    """``func`` with ``loop``'s kind set: "parallel", "vectorized", "unrolled" or "serial".

    Parameters
    ----------
    func : PrimFunc
    loop : For
        A loop of ``func`` (found by identity).
    kind : str

    Returns
    -------
    PrimFunc

    Raises
    ------
    ScheduleError
        "parallel" on a loop that encloses a parallel loop.
    """
    if kind == "parallel":
        for s in L.walk_stmts(loop.body):
            if isinstance(s, L.For) and s.kind == "parallel":
                raise ScheduleError(f"parallel: {loop.var.name} encloses parallel loop "
                                    f"{s.var.name}")
    return _replace(func, loop, L.For(loop.var, loop.min, loop.extent, kind, loop.body))


def parallel(func: L.PrimFunc, loop: L.For) -> L.PrimFunc:
    """``func`` with ``loop`` parallel (outlined onto the support code's thread pool).

    Parameters
    ----------
    func : PrimFunc
    loop : For

    Returns
    -------
    PrimFunc

    Raises
    ------
    ScheduleError
        ``loop`` encloses a parallel loop.
    """
    return annotate(func, loop, "parallel")


def unroll(func: L.PrimFunc, loop: L.For) -> L.PrimFunc:
    """``func`` with ``loop`` unrolled.

    Parameters
    ----------
    func : PrimFunc
    loop : For
        From 0, of constant extent.

    Returns
    -------
    PrimFunc

    Raises
    ------
    ScheduleError
        A loop not from 0 or of symbolic extent.
    """
    _const_extent(loop, "unroll")
    return annotate(func, loop, "unrolled")


def vectorize(func: L.PrimFunc, loop: L.For) -> L.PrimFunc:
    """``func`` with ``loop`` vectorized.

    Parameters
    ----------
    func : PrimFunc
    loop : For
        An innermost loop (no loop in its body).

    Returns
    -------
    PrimFunc

    Raises
    ------
    ScheduleError
        ``loop`` is not innermost.
    """
    if any(isinstance(s, L.For) for s in L.walk_stmts(loop.body)):
        raise ScheduleError(f"vectorize: {loop.var.name} is not an innermost loop")
    return annotate(func, loop, "vectorized")


def peel_lets(s: L.Stmt) -> tuple[list[L.LetStmt], L.Stmt]:
    """The LetStmts heading ``s`` (outermost first) and the statement under them.

    Parameters
    ----------
    s : Stmt

    Returns
    -------
    tuple of (list of LetStmt, Stmt)
    """
    lets = []
    while isinstance(s, L.LetStmt):
        lets.append(s)
        s = s.body
    return lets, s


def fuse(func: L.PrimFunc, outer: L.For) -> tuple[L.PrimFunc, L.For]:
    """Fuse ``outer`` with the loop directly nested in it into one loop (TVM's ``fuse``).

    The inner loop may sit under the LetStmts an earlier fuse put there. Constant extents
    substitute the loop variables (``fused // n2``, ``fused % n2``) into the body, where the
    index arithmetic folds. A symbolic extent binds them once per iteration with LetStmts
    instead: its divisions cannot fold, and the C compiler does not hoist them out of the
    vectorized inner loops (squeezenet with a symbolic batch ran 50x slower).

    Parameters
    ----------
    func : PrimFunc
    outer : For
        A loop of ``func`` with extent ``n1`` over one loop of extent ``n2``, both from 0.

    Returns
    -------
    tuple of (PrimFunc, For)
        The new function and its fused loop (extent ``n1 * n2``, ``outer``'s kind).

    Raises
    ------
    ScheduleError
        ``outer`` is not perfectly nested over a loop, or a loop does not start at 0.
    """
    lets, inner = peel_lets(outer.body)
    if not isinstance(inner, L.For):
        raise ScheduleError(f"fuse: {outer.var.name} is not perfectly nested over a loop")
    if not (_is_zero(outer.min) and _is_zero(inner.min)):
        raise ScheduleError(f"fuse: loops {outer.var.name} and {inner.var.name} must start at 0")
    n1, n2 = outer.extent, inner.extent  # constants, or symbolic extents
    fused = L.Var(f"{outer.var.name}_{inner.var.name}_f")
    static = isinstance(n1, L.IntImm) and isinstance(n2, L.IntImm)
    body = inner.body
    for let in reversed(lets):  # bound from the outer variable only: still valid inside
        body = L.LetStmt(let.var, let.value, body)
    if static and not lets:
        body = L.substitute_stmt(body, {outer.var: fused // n2, inner.var: fused % n2})
    else:
        body = L.LetStmt(outer.var, fused // n2, L.LetStmt(inner.var, fused % n2, body))
    extent = L.IntImm(n1.value * n2.value) if static else n1 * n2
    new = L.For(fused, L.IntImm(0), extent, outer.kind, body)
    return _replace(func, outer, new), new


def split(func: L.PrimFunc, loop: L.For, factor: int) -> tuple[L.PrimFunc, L.For, L.For]:
    """Split ``loop`` into (outer, inner) with inner extent ``factor`` (guarded if ragged).

    Parameters
    ----------
    func : PrimFunc
    loop : For
        From 0, of constant extent ``n``.
    factor : int
        The inner extent, > 0.

    Returns
    -------
    tuple of (PrimFunc, For, For)
        The new function, the outer loop (extent ``ceil(n / factor)``, loop's kind) and the
        serial inner loop; when ``factor`` does not divide ``n`` the body runs under
        ``if outer * factor + inner < n``.

    Raises
    ------
    ScheduleError
        A loop not from 0 or of symbolic extent, or ``factor <= 0``.
    """
    n = _const_extent(loop, "split")
    if factor <= 0:
        raise ScheduleError(f"split: factor must be positive, got {factor}")
    vo, vi = L.Var(f"{loop.var.name}_o"), L.Var(f"{loop.var.name}_i")
    index = vo * factor + vi
    body = L.substitute_stmt(loop.body, {loop.var: index})
    if n % factor:
        body = L.IfThenElse(index < n, body)
    inner = L.For(vi, L.IntImm(0), L.IntImm(factor), "serial", body)
    outer = L.For(vo, L.IntImm(0), L.IntImm(-(-n // factor)), loop.kind, inner)
    return _replace(func, loop, outer), outer, inner
