"""Row fusion: the loop nests of a softmax-like kernel computed one row at a time, in cache
(TVM's x86 softmax schedule: ``compute_at`` of max, exp and sum at the output's outer axes).

A lowered softmax is a sequence of nests over the same leading (row) loops — max over each
row, exp of the row, its sum, the division — that communicate through whole-tensor buffers
(the exp of a [2, 12, 384, 384] attention is 14 MB). :func:`fuse_rows` merges the nests under
one copy of the row loops when every intermediate buffer and the output are accessed at the
current row only, then:

- writes the exp stage into the output row when the last nest reads it only where it writes
  the output (``out = e / s``: the division runs in place; MLAS's softmax does the same);
- shrinks the other intermediates to one row (the max and the sum become registers);
- marks the element-wise inner loops ``vectorized``;
- splits each row reduction (max, sum) into ``RFACTOR_LANES`` independent partial results
  (TVM's ``rfactor``), a vectorized loop, combined after the row: a float sum is reassociated
  (as every vectorized softmax does), a max is exact.

Blocks of rows: when the last row loop steps over blocks (``split(i, R)``: every nest accesses
the intermediates and the output at row ``start(row loops) + w``, ``w`` a loop of ``R`` inside
the nest, the same ``start`` everywhere), the nests fuse under the block loops and each
intermediate shrinks to ``R`` rows indexed by ``w`` (``nn.attention``'s query-row blocks, which
reuse each key and value row over ``R`` query rows: docs/decisions/025-fused-attention.md).

It is the loop-level part of the ``softmax_exp`` schedule (:mod:`kiln.schedules.nn_cpu`, which
sets ``attrs["fuse_rows"]``); symbolic row counts and lengths keep working (reduction tails).
"""

from __future__ import annotations

import math

from kiln.tir import loop as L

#: Partial results of a split row reduction: two AVX2 vectors, one AVX-512 vector.
RFACTOR_LANES = 16
#: Fuse only when the rows give the parallel loop this much work (as ``cpu.schedule_loops``).
MIN_ROWS = 16
_IDENTITY = {"+": 0.0, "max": -math.inf, "min": math.inf}


def fuse_rows(func: L.PrimFunc) -> L.PrimFunc:
    """``func`` with its top-level nests fused over their common row loops (module docstring).

    The loop-level half of the ``softmax_exp``, ``layer_norm_sqsum`` and ``attention_scores``
    schedules (they set ``attrs["fuse_rows"]``; :func:`kiln.schedules.cpu.schedule_loops`
    calls this). The nests fuse under the deepest common prefix of serial row loops (same
    extents) at which every intermediate buffer and the output are accessed at the current row
    (or block of rows) only; intermediates shrink to a row (local when static), the exp stage
    moves into the output where the last nest reads it only where it writes, element-wise inner
    loops are vectorized and row reductions split into RFACTOR_LANES (16) partial results. A
    body ``if extent < block: <small version> else: <blocked version>`` (a kernel with a
    version for small symbolic extents, ``te_compiler``) has each version fused on its own.

    Parameters
    ----------
    func : PrimFunc
        A lowered kernel: global Allocates over a sequence of loop nests; its last parameter
        the output.

    Returns
    -------
    PrimFunc
        Fused, or ``func`` unchanged when the nests share no row loops or give fewer than
        MIN_ROWS (16) rows.
    """
    if isinstance(func.body, L.IfThenElse) and func.body.else_case is not None:
        then, other = (fuse_rows(L.PrimFunc(func.name, func.params, case, dict(func.attrs))).body
                       for case in (func.body.then_case, func.body.else_case))
        return L.PrimFunc(func.name, func.params,
                          L.IfThenElse(func.body.cond, then, other), dict(func.attrs))
    allocs, nests = _split(func.body)
    if len(nests) < 2:
        return func
    out = func.params[-1]
    depth, block = _common_depth(nests, [*allocs, out])
    if depth == 0 or not _enough_rows(_prefix(nests[0], depth), block or 1):
        return func
    loops = _prefix(nests[0], depth)
    row_vars = [lp.var for lp in loops]
    inner = _renamed_bodies(nests, depth)
    body: L.Stmt = L.seq(*inner)
    for buf in list(allocs):
        if _in_place(buf, out, inner):
            body = _retarget(body, buf, out, lambda idx: idx)
            allocs.remove(buf)
    for buf in reversed(allocs):
        row = _row_buffer(buf, depth, block)
        body = L.Allocate(row, _retarget(body, buf, row, lambda idx, buf=buf:
                                         _row_index(buf, idx, row_vars, block)))
    body = _vectorize_rows(body)
    for lp in reversed(loops):
        body = L.For(lp.var, lp.min, lp.extent, lp.kind, body)
    return L.PrimFunc(func.name, func.params, body, dict(func.attrs))


def _split(body: L.Stmt) -> tuple[list[L.Buffer], list[L.For]]:
    """(global allocations, nests) of a body ``Allocate* (SeqStmt of For | For)``."""
    allocs = []
    while isinstance(body, L.Allocate) and body.buffer.scope != "local":
        allocs.append(body.buffer)
        body = body.body
    stmts = body.stmts if isinstance(body, L.SeqStmt) else [body]
    if not all(isinstance(s, L.For) for s in stmts):
        return allocs, []
    return allocs, list(stmts)


def _prefix(nest: L.Stmt, depth: int) -> list[L.For]:
    """The first ``depth`` loops of ``nest`` (perfectly nested, serial, from 0), or fewer."""
    loops: list[L.For] = []
    s = nest
    while len(loops) < depth and isinstance(s, L.For) and s.kind == "serial" \
            and isinstance(s.min, L.IntImm) and s.min.value == 0:
        loops.append(s)
        s = s.body
    return loops


def _renamed_bodies(nests: list[L.For], depth: int) -> list[L.Stmt]:
    """The body under each nest's first ``depth`` loops, its row variables renamed to the
    first nest's."""
    row_vars = [lp.var for lp in _prefix(nests[0], depth)]
    bodies = []
    for nest in nests:
        own = _prefix(nest, depth)
        vmap = {lp.var: v for lp, v in zip(own, row_vars)}
        bodies.append(L.substitute_stmt(own[-1].body, vmap))
    return bodies


def _common_depth(nests: list[L.For], tracked: list[L.Buffer]) -> tuple[int, int | None]:
    """The most leading loops the nests share (same extents) such that each nest touches the
    ``tracked`` buffers only at its own current row — or at its own current block of rows
    (module docstring) — and that block's row count (None: single rows)."""
    depth = min(len(_prefix(n, 64)) for n in nests)
    while depth > 0:
        heads = [_prefix(n, depth) for n in nests]
        same = all(repr(h[k].extent) == repr(heads[0][k].extent)
                   for h in heads for k in range(depth))
        if same:
            found = _row_local(_renamed_bodies(nests, depth),
                               [lp.var for lp in heads[0]], tracked)
            if found is not False:
                return depth, found
        depth -= 1
    return 0, None


def _row_local(bodies: list[L.Stmt], row: list[L.Var], tracked: list[L.Buffer]
               ) -> int | None | bool:
    """Whether ``bodies`` (under the row loops ``row``) access ``tracked`` at the current row
    only (None), at the current block of rows only (its row count), or not (False)."""
    ids = {id(b) for b in tracked}
    extents = {id(st.var): st.extent for b in bodies for st in L.walk_stmts(b)
               if isinstance(st, L.For)}
    starts: set[str] = set()
    rows: set[int | None] = set()
    for body in bodies:
        for buf, idx in _accesses(body):
            if id(buf) not in ids:
                continue
            if any(not _is_zero(i) for k, i in enumerate(idx) if k in _unit_dims(buf)):
                return False
            idx = _squeeze(buf, idx)
            if len(idx) < len(row) or any(i is not v for i, v in zip(idx, row[:-1])):
                return False
            if idx[len(row) - 1] is row[-1]:
                rows.add(None)
                continue
            split = _block_row(idx[len(row) - 1], row, extents)
            if split is None:
                return False
            start, w = split
            starts.add(repr(start))
            rows.add(extents[id(w)].value)
    if len(rows) > 1 or len(starts) > 1:
        return False
    return rows.pop() if rows else None


def _block_row(index: L.PrimExpr, row: list[L.Var], extents: dict
               ) -> tuple[L.PrimExpr, L.Var] | None:
    """``(start, w)`` when ``index`` is ``start + w``: ``start`` of the row variables (and
    constants or shape symbols) with the last one in it, ``w`` a loop of the body with a
    static extent."""
    if not (isinstance(index, L.Binary) and index.op == "+"):
        return None
    for start, w in ((index.a, index.b), (index.b, index.a)):
        if not (isinstance(w, L.Var) and isinstance(extents.get(id(w)), L.IntImm)):
            continue
        used = {id(v) for v in L.expr_vars(start)}
        if id(row[-1]) in used and not used & set(extents):
            return start, w
    return None


def _row_index(buf: L.Buffer, idx: list[L.PrimExpr], row: list[L.Var], block: int | None
               ) -> list[L.PrimExpr]:
    """The index into ``buf``'s row buffer (:func:`_row_buffer`) of the access ``buf[idx]``
    under the row loops ``row``: the rest of the index, after the block's row ``w`` of
    ``start + w`` (:func:`_block_row`) when rows come in blocks."""
    idx = _squeeze(buf, idx)
    depth = len(row)
    if block is None:
        return idx[depth:] or [L.IntImm(0)]
    at = idx[depth - 1]
    w = next(v for v in (at.b, at.a) if isinstance(v, L.Var) and all(v is not r for r in row))
    return [w, *idx[depth:]]


def _unit_dims(buf: L.Buffer) -> set[int]:
    """The positions of ``buf``'s static extent-1 dims, which have no loop (a batch of 1)."""
    return {k for k, d in enumerate(buf.shape) if isinstance(d, int) and d == 1}


def _squeeze(buf: L.Buffer, items: list) -> list:
    """``items`` (indices or dims of ``buf``) without its unit dims."""
    unit = _unit_dims(buf)
    return [x for k, x in enumerate(items) if k not in unit]


def _is_zero(e: L.PrimExpr) -> bool:
    return isinstance(e, L.IntImm) and e.value == 0


def _accesses(s: L.Stmt) -> list[tuple[L.Buffer, list[L.PrimExpr]]]:
    """Every (buffer, indices) that ``s`` stores or loads."""
    found = []
    for st in L.walk_stmts(s):
        if isinstance(st, L.BufferStore):
            found.append((st.buffer, st.indices))
        found.extend((x.buffer, x.indices) for x in L.walk_exprs(L.stmt_exprs(st))
                     if isinstance(x, L.BufferLoad))
    return found


def _enough_rows(loops: list[L.For], block: int) -> bool:
    """Whether the row loops ``loops`` (each iteration ``block`` rows) give MIN_ROWS rows."""
    n = block
    for lp in loops:
        if not isinstance(lp.extent, L.IntImm):
            return True  # a symbolic row count: as schedule_loops, assume enough
        n *= lp.extent.value
    return n >= MIN_ROWS


def _in_place(buf: L.Buffer, out: L.Buffer, nests: list[L.Stmt]) -> bool:
    """Whether ``buf`` may live in ``out``: same shape and dtype, ``out`` untouched before the
    last nest, which stores ``out`` once, does not store ``buf`` and reads it only at the
    element it stores."""
    if buf.dtype != out.dtype or repr(list(buf.shape)) != repr(list(out.shape)):
        return False
    if any(b is out for n in nests[:-1] for b, _ in _accesses(n)):
        return False
    last = nests[-1]
    stores = [st for st in L.walk_stmts(last) if isinstance(st, L.BufferStore)]
    if len(stores) != 1 or stores[0].buffer is not out:
        return False
    where = repr(stores[0].indices)
    return all(repr(idx) == where for b, idx in _accesses(last) if b is buf)


def _row_buffer(buf: L.Buffer, depth: int, block: int | None) -> L.Buffer:
    """``buf`` shrunk to one row (``block`` None) or to one block of ``block`` rows."""
    rest = tuple(_squeeze(buf, list(buf.shape))[depth:])
    shape = (block, *rest) if block is not None else rest or (1,)
    static = all(isinstance(d, int) for d in shape)
    return L.Buffer(buf.name, shape, buf.dtype, "local" if static else buf.scope)


def _retarget(s: L.Stmt, old: L.Buffer, new: L.Buffer, index) -> L.Stmt:
    """``s`` with every access of ``old`` made to ``new`` at ``index(indices)``."""

    def fexpr(e: L.PrimExpr) -> L.PrimExpr:
        return L.map_expr(e, lambda x: L.BufferLoad(new, index(x.indices))
                          if isinstance(x, L.BufferLoad) and x.buffer is old else x)

    def fstmt(st: L.Stmt) -> L.Stmt:
        if isinstance(st, L.BufferStore) and st.buffer is old:
            return L.BufferStore(new, st.value, index(st.indices))
        if isinstance(st, L.Allocate) and st.buffer is old:
            return st.body
        return st

    return L.map_stmt(s, fexpr, fstmt)


def _vectorize_rows(s: L.Stmt) -> L.Stmt:
    """Mark element-wise innermost loops vectorized and split row reductions."""

    def fstmt(st: L.Stmt) -> L.Stmt:
        if not isinstance(st, L.For) or st.kind != "serial":
            return st
        if isinstance(st.body, L.BufferStore) and _elementwise(st.body, st.var):
            return L.For(st.var, st.min, st.extent, "vectorized", st.body)
        return _rfactor(st) or st

    return L.map_stmt(s, lambda e: e, fstmt)


def _elementwise(store: L.BufferStore, v: L.Var) -> bool:
    """Each iteration writes its own element (the last index is ``v``) and reads the stored
    buffer only there."""
    if not store.indices or store.indices[-1] is not v:
        return False
    where = repr(store.indices)
    return all(repr(idx) == where for b, idx in _accesses(store) if b is store.buffer)


def _rfactor(loop: L.For) -> L.Stmt | None:
    """``for r: acc[0] = acc[0] op f(r)`` (acc local, op + / max / min) as RFACTOR_LANES
    partial results in a vectorized loop, the tail of the row into ``acc``, then the partial
    results combined into ``acc``; None when ``loop`` is not such a reduction."""
    st = loop.body
    if not (isinstance(st, L.BufferStore) and st.buffer.scope == "local"
            and st.buffer.shape == (1,) and isinstance(st.value, L.Binary)
            and st.value.op in _IDENTITY and L.is_float(st.value.dtype)):
        return None
    acc, op = st.buffer, st.value.op
    if not (isinstance(st.value.a, L.BufferLoad) and st.value.a.buffer is acc):
        return None
    value = st.value.b
    if any(b is acc for b, _ in _accesses(L.Evaluate(value))):
        return None
    lanes = RFACTOR_LANES
    static = isinstance(loop.extent, L.IntImm)
    if static and loop.extent.value < 2 * lanes:
        return None
    part = L.Buffer(f"{acc.name}_rf", (lanes,), acc.dtype, "local")
    name = loop.var.name
    lane, ro, rt = L.Var(f"{name}_l"), L.Var(f"{name}_o"), L.Var(f"{name}_t")
    lane0, lane1 = L.Var(f"{name}_l0"), L.Var(f"{name}_l1")  # each loop binds its own
    full = L.IntImm(loop.extent.value // lanes) if static else loop.extent // lanes
    done = L.IntImm(full.value * lanes) if static else full * lanes
    rest = L.IntImm(loop.extent.value - done.value) if static else loop.extent - done

    def combine(a: L.PrimExpr, b: L.PrimExpr) -> L.PrimExpr:
        return L.Binary(op, a, b)

    at = {loop.var: ro * lanes + lane}
    init = L.For(lane0, L.IntImm(0), L.IntImm(lanes), "vectorized",
                 L.BufferStore(part, L.const(_IDENTITY[op], acc.dtype), [lane0]))
    body = L.For(ro, L.IntImm(0), full, "serial", L.For(
        lane, L.IntImm(0), L.IntImm(lanes), "vectorized",
        L.BufferStore(part, combine(part[lane], L.substitute(value, at)), [lane])))
    tail = None if static and rest.value == 0 else L.For(
        rt, L.IntImm(0), rest, "serial",
        L.BufferStore(acc, combine(acc[0], L.substitute(value, {loop.var: done + rt})),
                      [L.IntImm(0)]))
    fold = L.For(lane1, L.IntImm(0), L.IntImm(lanes), "serial",
                 L.BufferStore(acc, combine(acc[0], part[lane1]), [L.IntImm(0)]))
    return L.Allocate(part, L.seq(init, body, tail, fold))
