"""Vectorized min / max reductions outside row fusion (TVM's ``rfactor`` of a reduction axis).

A reduction the tensor-level schedule leaves alone lowers to ``acc = min(acc, x[..., r])``
over serial loops: one scalar ``minss`` per element, each waiting for the previous one (a
latency chain: DynamicQuantizeLinear's range over a [1, 32, 384] MiniLM activation took
~9 µs per min or max on the AVX2 EPYC, ~12 k dependent ops). :func:`vectorize_reductions`
keeps ``CHAINS`` vectors of partial results for the whole nest, updated over the innermost
axis in blocks of vectors (its tail into ``acc``), and combines them once after the nest by
halvings (vector ops) — TVM's ``rfactor`` of the innermost reduction axis, with the partial
results hoisted out of the outer reduction loops (onnxruntime's DynamicQuantizeLinear keeps
vectors of minima and maxima the same way, MLAS's ``MlasReduceMinimumMaximumF32Kernel``).

Only float ``min`` / ``max``: they are exact in any order, so the result is bit for bit the
serial one (NaN aside). Float sums stay serial (reassociating them changes the rounding of a
ReduceSum / ReduceMean that users compare). Only loops whose loads are contiguous in the
reduction variable (it is the last index of every load that uses it, with unit step):
a reduction over a non-last axis would vectorize into gathers.
"""

from __future__ import annotations

import math

from kiln.target import Target
from kiln.tir import loop as L

#: combiners that give the same value in any order, and their identities
EXACT_OPS = {"min": math.inf, "max": -math.inf}
#: independent vector accumulators (a min / max has 3-4 cycles of latency: two chains keep
#: more than one in flight, as MLAS's reductions do)
CHAINS = 2
#: vector lanes when no target is current (the loop-IR interpreter, tests): AVX2's float32
DEFAULT_LANES = 8


def _lanes(dtype: str) -> int:
    target = Target.current()
    if target is None or target.vector_bits() < 128:
        return DEFAULT_LANES
    return target.vector_lanes(dtype)


def vectorize_reductions(func: L.PrimFunc) -> L.PrimFunc:
    """``func`` with its float min / max reductions split into vector partial results.

    Each perfect nest of serial loops around ``acc[0] = min(acc[0], f)`` (or max) into a local
    scalar accumulator, over loads contiguous in the innermost loop, keeps CHAINS (2) vectors
    of partial results for the whole nest, updated over the innermost axis in blocks of CHAINS
    vectors (``r_o`` serial, ``r_c`` unrolled, ``r_l`` vectorized; the tail into ``acc``), and
    combines them once after the nest by halvings (:func:`_rfactor_nest`). Others unchanged (an
    innermost loop shorter than two blocks, or symbolic, stays as it is). Target property: the
    lanes, ``Target.current().vector_lanes(dtype)`` (DEFAULT_LANES = 8 with no target or
    ``vector_bits() < 128``).

    Parameters
    ----------
    func : PrimFunc
        A lowered kernel.

    Returns
    -------
    PrimFunc
        ``func`` itself when nothing changed.
    """

    def fstmt(st: L.Stmt) -> L.Stmt:
        if not (isinstance(st, L.For) and st.kind == "serial"):
            return st
        return _rfactor_nest(st) or st

    body = L.map_stmt(func.body, lambda e: e, fstmt)
    if body is func.body:
        return func
    return L.PrimFunc(func.name, func.params, body, dict(func.attrs))


def _nest(loop: L.For) -> list[L.For]:
    """The perfectly nested serial loops from ``loop`` down."""
    loops = [loop]
    while isinstance(loops[-1].body, L.For) and loops[-1].body.kind == "serial":
        loops.append(loops[-1].body)
    return loops


def _rfactor_nest(top: L.For) -> L.Stmt | None:
    """``for r1..rn: acc[0] = op(acc[0], f)`` as ``CHAINS`` vectors of partial results: set
    once, updated over the innermost axis in blocks of ``CHAINS`` vectors (that axis's tail
    into ``acc``), combined into ``acc`` once after the whole nest. None when ``top`` is not
    such a nest (or its innermost loop is shorter than two blocks, or symbolic)."""
    loops = _nest(top)
    inner = loops[-1]
    st = inner.body
    if not (isinstance(st, L.BufferStore) and st.buffer.scope == "local"
            and st.buffer.shape == (1,) and isinstance(st.value, L.Binary)
            and st.value.op in EXACT_OPS and L.is_float(st.value.dtype)
            and isinstance(st.value.a, L.BufferLoad) and st.value.a.buffer is st.buffer):
        return None
    acc, op, value = st.buffer, st.value.op, st.value.b
    loads = _loads(value)
    if any(ld.buffer is acc for ld in loads) or \
            not all(_contiguous(ld, inner.var) for ld in loads):
        return None
    lanes = _lanes(acc.dtype)
    width = CHAINS * lanes
    if not isinstance(inner.extent, L.IntImm) or inner.extent.value < 2 * width:
        return None
    full, rest = divmod(inner.extent.value, width)
    part = L.Buffer(f"{acc.name}_rf", (width,), acc.dtype, "local")
    name = inner.var.name
    ro, chain, lane = L.Var(f"{name}_o"), L.Var(f"{name}_c"), L.Var(f"{name}_l")
    rt, lane0 = L.Var(f"{name}_t"), L.Var(f"{name}_l0")  # each loop binds its own
    init = L.For(lane0, L.IntImm(0), L.IntImm(width), "vectorized",
                 L.BufferStore(part, L.const(EXACT_OPS[op], acc.dtype), [lane0]))
    at = chain * lanes + lane
    # the unrolled chain loop is a register block: LLVM codegen then keeps the ro loop rolled
    # (fully unrolling a short ro loop under an outer loop, e.g. 24 blocks of a 384 row,
    # sent LLVM 15's optimizer into minutes of work)
    update = L.For(ro, L.IntImm(0), L.IntImm(full), "serial", L.For(
        chain, L.IntImm(0), L.IntImm(CHAINS), "unrolled", L.For(
            lane, L.IntImm(0), L.IntImm(lanes), "vectorized",
            L.BufferStore(part, L.Binary(op, part[at], L.substitute(
                value, {inner.var: ro * width + at})), [at]))))
    tail = None if rest == 0 else L.For(
        rt, L.IntImm(0), L.IntImm(rest), "serial",
        L.BufferStore(acc, L.Binary(op, acc[0], L.substitute(
            value, {inner.var: L.IntImm(full * width) + rt})), [L.IntImm(0)]))
    body: L.Stmt = L.seq(update, tail)
    for lp in reversed(loops[:-1]):
        body = L.For(lp.var, lp.min, lp.extent, lp.kind, body)
    return L.Allocate(part, L.seq(init, body, *_fold(part, acc, op, L.Var(f"{name}_h"))))


def _fold(part: L.Buffer, acc: L.Buffer, op: str, lane: L.Var) -> list[L.Stmt]:
    """``acc[0] = op(acc[0], part[0..n))`` as halvings, ``part[l] = op(part[l], part[l + h])``
    for h = n/2, n/4 .. 1 (vector ops; ``n`` a power of two), then one scalar op."""
    out = []
    half = part.shape[0] // 2
    while half >= 1:
        lv = L.Var(f"{lane.name}_{half}")
        out.append(L.For(lv, L.IntImm(0), L.IntImm(half), "vectorized" if half > 1 else
                         "serial", L.BufferStore(part, L.Binary(op, part[lv], part[
                             lv + L.IntImm(half)]), [lv])))
        half //= 2
    out.append(L.BufferStore(acc, L.Binary(op, acc[0], part[0]), [L.IntImm(0)]))
    return out


def _loads(e: L.PrimExpr) -> list[L.BufferLoad]:
    return [x for x in L.walk_exprs(e) if isinstance(x, L.BufferLoad)]


def _contiguous(load: L.BufferLoad, v: L.Var) -> bool:
    """``v`` appears only in the last index, as ``v`` or ``v + c`` / ``c + v``; or not at
    all (a value the loop broadcasts)."""
    *lead, last = load.indices or [L.IntImm(0)]
    if any(L.uses_var(i, v) for i in lead):
        return False
    if last is v or not L.uses_var(last, v):
        return True
    return (isinstance(last, L.Binary) and last.op == "+"
            and ((last.a is v and not L.uses_var(last.b, v))
                 or (last.b is v and not L.uses_var(last.a, v))))
