"""Explicit SIMD code for ``vectorized`` loops (TVM's ``VectorizeLoop`` pass with its ``Ramp`` and
``Broadcast`` nodes, src/tir/transforms/vectorize_loop.cc, done here at code generation).

A ``vectorized`` loop ``for v in [0, E)`` whose body is a sequence of stores (under ``LetStmt``
bindings, which become vector values when they depend on ``v``) is emitted as E / W
chunks of W-lane vector instructions when every store moves with ``v`` contiguously (flat offset
``base + v``) and every load does, or does not move at all (a scalar, broadcast to all lanes), or
moves otherwise (one scalar load per lane, inserted into a vector: a gather): loads and stores
become ``<W x T>`` loads and stores, arithmetic becomes vector arithmetic (float and integer, casts
between float and integer lanes of the same width, loads widened to the lane width where no
store reads its own buffer, bit reinterpretation, comparisons as lane masks and selects on
them). W is the target's lanes for the element type, or the largest power
of two dividing E below that. Anything else (a store that is not contiguous, ``v`` used as a
value, a load indexed by a lane-dependent binding, a lane-dependent select whose side may
trap, bool or mixed-width elements, integer division) keeps the scalar loop with LLVM's
vectorizer hints (:mod:`kiln.codegen.llvm.func`).

Why not leave it all to LLVM's loop vectorizer: after full unrolling of the register block, its
choices depend on the whole kernel. A 1×1 convolution with a fused residual add came out with
accumulators shifted by one lane (a peeled first iteration and shuffles in the inner loop) and
ran 2.9× slower than the same convolution without the add (MobileNetV2's 576→96 projection:
380 µs vs 132 µs on one core). Emitting the vectors ourselves makes the register block's code
the same whatever the epilogue.
"""

from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from kiln.codegen.llvm.expr import (
    _LLVM_INTRINSICS,
    dot_i16x2_generic,
    dot_u8i8x4_generic,
    dot_u8i8x4_sat16_generic,
    sides_may_trap,
)
from kiln.codegen.llvm.ir import I64, Frame, dtype_bits, memory_type, value_type
from kiln.codegen.llvm.vector_widen import widens
from kiln.tir import intrin_int8 as loop_int8
from kiln.tir import loop as L

#: Float binary operators that have a lane-wise vector form here.
_FLOAT_OPS = ("+", "-", "*", "/", "min", "max")
#: Integer ones (no division: its scalar form guards against traps and rounds to the floor).
_INT_OPS = ("+", "-", "*", "&", "|", "^", "<<", ">>", "min", "max")
_CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")
#: Chunks emitted as straight-line code (more become a loop).
MAX_UNROLLED_CHUNKS = 8


def lane_coefficient(e: L.PrimExpr, v: L.Var) -> int | None:
    """``d e / d v`` when ``e`` is affine in ``v`` with an integer coefficient, else None."""
    if isinstance(e, L.Var):
        return 1 if e is v else 0
    if isinstance(e, (L.IntImm, L.FloatImm)):
        return 0
    if isinstance(e, L.Binary) and e.op in ("+", "-", "*"):
        a, b = lane_coefficient(e.a, v), lane_coefficient(e.b, v)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if a == 0 and b == 0:
            return 0
        if a == 0 and isinstance(e.a, L.IntImm):
            return e.a.value * b
        if b == 0 and isinstance(e.b, L.IntImm):
            return a * e.b.value
        return None
    if isinstance(e, L.Cast) and not L.is_float(e.dtype):
        return lane_coefficient(e.value, v)
    return 0 if not L.uses_var(e, v) else None




class Lanes(NamedTuple):
    """What varies across the lanes of a vectorized loop: its variable ``var``, and ``vars``:
    it and the ``LetStmt`` variables bound (in the loop body) to lane-dependent values;
    ``widen``: loads narrower than the lanes may be widened (:func:`~kiln.codegen.llvm.
    vector_widen.widens`)."""

    var: L.Var
    vars: frozenset[L.Var]
    widen: bool = False


def flat_coefficient(buf: L.Buffer, indices: list[L.PrimExpr], v: L.Var) -> int | None:
    """How far the row-major element offset of ``buf[indices]`` moves per step of ``v``."""
    total, stride = 0, 1
    for extent, idx in zip(reversed(buf.shape), reversed(indices)):
        c = lane_coefficient(idx, v)
        if c is None or (c and stride is None):
            return None
        if c:
            total += c * stride
        stride = stride * extent if isinstance(extent, int) and stride is not None else None
    return total


def _lets_and_stores(body: L.Stmt) -> tuple[list[L.LetStmt], list[L.BufferStore]] | None:
    """A loop body of ``LetStmt``s (FastExp's bindings) around a store or a sequence of
    stores, split into the two; None for any other body."""
    lets = []
    while isinstance(body, L.LetStmt):
        lets.append(body)
        body = body.body
    if isinstance(body, L.BufferStore):
        return lets, [body]
    if isinstance(body, L.SeqStmt) and all(isinstance(s, L.BufferStore) for s in body.stmts):
        return lets, list(body.stmts)
    return None


def _lane_wise(e: L.PrimExpr, lanes: Lanes, bits: int) -> bool:
    """Whether ``e`` has a vector form: lane-invariant, or built lane-wise from contiguous loads
    of ``bits``-wide elements and lane-dependent ``LetStmt`` variables with operators of the
    same width — float arithmetic, integer arithmetic and shifts, float/int casts and
    ``reinterpret`` between ``bits``-wide types, comparisons (lane masks) and selects on them,
    intrinsics. (What FastExp's expansion of ``exp`` needs: :mod:`kiln.tir.transform.fast_exp`.)"""
    if not L.uses_var(e, lanes.vars):
        return True
    if isinstance(e, L.Var):  # a lane-dependent binding (the loop variable itself as a value:
        return e is not lanes.var  # no)
    if isinstance(e, L.BufferLoad):  # contiguous, or one element per lane (a gather)
        return (e.dtype != "bool" and dtype_bits(e.dtype) == bits
                and not any(L.uses_var(i, lanes.vars - {lanes.var}) for i in e.indices))
    if isinstance(e, L.Binary):
        if e.op in _CMP_OPS:  # a mask: its operands must be lane values
            ok = _lane_value(e.a, bits)
        elif L.is_float(e.dtype):
            ok = e.op in _FLOAT_OPS
        else:
            ok = e.op in _INT_OPS and _lane_value(e, bits)
        return ok and _lane_wise(e.a, lanes, bits) and _lane_wise(e.b, lanes, bits)
    if isinstance(e, L.Select):
        # A lane-dependent condition needs both sides evaluated (a vector select).
        cond_ok = not L.uses_var(e.cond, lanes.vars) or (
            e.cond.dtype == "bool" and not sides_may_trap(e) and _lane_wise(e.cond, lanes, bits))
        return (cond_ok and _lane_wise(e.true_value, lanes, bits)
                and _lane_wise(e.false_value, lanes, bits))
    if isinstance(e, L.Cast) and isinstance(e.value, L.BufferLoad) and lanes.widen and \
            L.is_float(e.dtype) and _lane_value(e, bits) and e.value.dtype != "bool" and \
            dtype_bits(e.value.dtype) < bits:  # float16 scales, int8 weights, to float lanes
        return not any(L.uses_var(i, lanes.vars - {lanes.var}) for i in e.value.indices)
    if isinstance(e, L.Cast):
        return (_lane_value(e, bits) and _lane_value(e.value, bits)
                and L.is_float(e.dtype) != L.is_float(e.value.dtype)
                and _lane_wise(e.value, lanes, bits))
    if isinstance(e, L.Call) and e.name == "reinterpret":
        return (_lane_value(e, bits) and _lane_value(e.args[0], bits)
                and _lane_wise(e.args[0], lanes, bits))
    if isinstance(e, L.Call) and e.name in (loop_int8.DOT_U8I8X4, loop_int8.DOT_U8I8X4_SAT16):
        return bits == 32 and all(_lane_wise(a, lanes, bits) for a in e.args)
    if isinstance(e, L.Call) and e.name == loop_int8.LOAD_U8X4:  # words 4 bytes apart: contiguous
        (load,) = e.args
        return bits == 32 and flat_coefficient(load.buffer, load.indices, lanes.var) == 4 and \
            not any(L.uses_var(i, lanes.vars - {lanes.var}) for i in load.indices)
    if isinstance(e, L.Call) and e.name == loop_int8.DOT_I16X2:
        return bits == 32 and all(_narrow_lane_wise(a, lanes) for a in e.args)
    if isinstance(e, L.Call):
        return (e.name in _LLVM_INTRINSICS and L.is_float(e.dtype)
                and all(_lane_wise(a, lanes, bits) for a in e.args))
    return False


def _narrow_lane_wise(e: L.PrimExpr, lanes: Lanes) -> bool:
    """Whether an int16 operand of ``dot_i16x2`` in a 32-bit loop has a vector form: 8- and
    16-bit integer loads (one element per lane), widened to int16 and combined with int16
    ``+ - *`` and selects on a lane-invariant condition (a padding guard)."""
    if not L.uses_var(e, lanes.vars):
        return True
    if isinstance(e, L.BufferLoad):
        return (e.dtype in ("int8", "uint8", "int16")
                and not any(L.uses_var(i, lanes.vars - {lanes.var}) for i in e.indices))
    if isinstance(e, L.Cast) and e.dtype in ("int16", "int8") and e.value.dtype == "int32":
        return _lane_wise(e.value, lanes, 32)  # a half or a byte of a 32-bit word
    if isinstance(e, L.Cast):
        return e.dtype == "int16" and e.value.dtype in ("int8", "uint8", "int16") and \
            _narrow_lane_wise(e.value, lanes)
    if isinstance(e, L.Binary):
        return e.op in ("+", "-", "*") and e.dtype == "int16" and \
            _narrow_lane_wise(e.a, lanes) and _narrow_lane_wise(e.b, lanes)
    if isinstance(e, L.Select):
        return not L.uses_var(e.cond, lanes.vars) and _narrow_lane_wise(e.true_value, lanes) and \
            _narrow_lane_wise(e.false_value, lanes)
    return False


def _word_halves(lo: L.PrimExpr, hi: L.PrimExpr) -> L.PrimExpr | None:
    """``W`` when ``lo = int16(W)`` and ``hi = int16(W >> 16)`` of one int32 expression
    (:func:`kiln.relay.op.integer.pack_tap_pairs`'s words); None otherwise."""
    if not (isinstance(lo, L.Cast) and isinstance(hi, L.Cast) and lo.value.dtype == "int32"):
        return None
    shift = hi.value
    if isinstance(shift, L.Binary) and shift.op == ">>" and isinstance(shift.b, L.IntImm) and \
            shift.b.value == 16 and repr(shift.a) == repr(lo.value):
        return lo.value
    return None


def _word_bytes(lo: L.PrimExpr, hi: L.PrimExpr) -> tuple[L.PrimExpr, int] | None:
    """``(W, s)`` when ``lo = int16(int8(W >> s))`` and ``hi = int16(int8(W >> (s + 16)))``
    of one int32 expression, ``s`` 0 or 8 (``W >> 0`` written ``W``): bytes ``s / 8`` and
    ``s / 8 + 2`` of each word sign-extended, which are the word's 16-bit halves shifted
    (the int8 dense's quad weights on AVX2, :func:`kiln.topi.integer._dense_pairs`); None
    otherwise."""
    def byte(e: L.PrimExpr) -> tuple[L.PrimExpr, int] | None:
        if not (isinstance(e, L.Cast) and e.dtype == "int16" and isinstance(e.value, L.Cast)
                and e.value.dtype == "int8" and e.value.value.dtype == "int32"):
            return None
        v = e.value.value
        if isinstance(v, L.Binary) and v.op == ">>" and isinstance(v.b, L.IntImm):
            return v.a, v.b.value
        return v, 0
    a, c = byte(lo), byte(hi)
    if a is None or c is None or a[1] not in (0, 8) or c[1] != a[1] + 16 or \
            repr(a[0]) != repr(c[0]):
        return None
    return a


def _narrow_offset(e: L.PrimExpr) -> tuple[L.PrimExpr | None, int]:
    """``(X, k)`` when ``e`` is ``int16(X) - k`` (or ``int16(X)``, k = 0) with ``X`` 8 bits
    wide and ``k`` a constant; ``(None, 0)`` otherwise."""
    k = 0
    if isinstance(e, L.Binary) and e.op == "-" and isinstance(e.b, L.IntImm):
        e, k = e.a, e.b.value
    if isinstance(e, L.Cast) and e.dtype == "int16" and e.value.dtype in ("int8", "uint8"):
        return e.value, k
    return None, 0


def _contiguous(buf: L.Buffer, indices: list[L.PrimExpr], lanes: Lanes) -> bool:
    """Whether ``buf[indices]`` moves by one element per lane (and its indices read no
    lane-dependent binding: those are values, not addresses)."""
    others = lanes.vars - {lanes.var}
    return (flat_coefficient(buf, indices, lanes.var) == 1
            and not any(L.uses_var(i, others) for i in indices))


def _lane_value(e: L.PrimExpr, bits: int) -> bool:
    """Whether ``e``'s dtype can be a lane: a number (not bool) ``bits`` wide."""
    return e.dtype != "bool" and dtype_bits(e.dtype) == bits


def vector_width(s: L.For, vector_bits: int) -> int:
    """Lanes W for emitting loop ``s`` as explicit vectors, or 0 when it must stay scalar."""
    plan = _vector_plan(s, vector_bits)
    return plan[0] if plan else 0


def _vector_plan(s: L.For, vector_bits: int) -> tuple[int, Lanes] | None:
    """(W, lanes) for :func:`vector_width`, or None."""
    if vector_bits <= 0 or not (isinstance(s.min, L.IntImm) and s.min.value == 0
                                and isinstance(s.extent, L.IntImm)):
        return None
    split = _lets_and_stores(s.body)
    if not split:
        return None
    lets, stores = split
    if any(st.buffer.dtype == "bool" for st in stores):
        return None
    bits = dtype_bits(stores[0].buffer.dtype)
    if any(dtype_bits(st.buffer.dtype) != bits for st in stores):
        return None
    width = vector_bits // bits
    while width > 1 and s.extent.value % width:
        width //= 2
    if width < 4:
        return None
    lanes = Lanes(s.var, frozenset((s.var,)), widens(stores))
    for let in lets:
        if L.uses_var(let.value, lanes.vars):
            if not (_lane_value(let.var, bits) and _lane_wise(let.value, lanes, bits)):
                return None
            lanes = Lanes(s.var, lanes.vars | {let.var}, lanes.widen)
    for st in stores:
        if not _contiguous(st.buffer, st.indices, lanes):
            return None
        if not _lane_wise(st.value, lanes, bits):
            return None
    return width, lanes


class VectorLoopCodegen:
    """Mixin of :class:`~kiln.codegen.llvm.func.FuncCodegen`: the vector form of a loop that
    :func:`vector_width` accepted."""

    def vector_for(self, fr: Frame, s: L.For, vector_bits: int) -> bool:
        """Emit ``s`` as explicit vectors if :func:`vector_width` accepts it; whether it did."""
        plan = _vector_plan(s, vector_bits)
        if plan is None:
            return False
        width, lanes = plan
        chunks = s.extent.value // width
        var_type = value_type(s.var.dtype)
        lets, stores = _lets_and_stores(s.body)

        def chunk(base: ir.Value) -> None:
            fr.vars[s.var] = base
            for let in lets:  # lane-dependent bindings hold vectors
                fr.vars[let.var] = self.vexpr(fr, let.value, lanes, width)
            for st in stores:
                value = self.vexpr(fr, st.value, lanes, width)
                value = self._splat(fr, value, width)
                ptr = self.address(fr, st.buffer, st.indices)
                fr.builder.store(value, ptr, align=dtype_bits(st.buffer.dtype) // 8)
            for var in (s.var, *(let.var for let in lets)):
                del fr.vars[var]

        if chunks <= MAX_UNROLLED_CHUNKS:
            for c in range(chunks):
                chunk(ir.Constant(var_type, c * width))
            return True
        c = L.Var(f"{s.var.name}_chunk", s.var.dtype)
        self.loop(fr, c, ir.Constant(var_type, 0), ir.Constant(var_type, chunks),
                  lambda: chunk(fr.builder.mul(fr.vars[c], ir.Constant(var_type, width))))
        return True

    def _gather(self, fr: Frame, e: L.BufferLoad, lanes: Lanes, width: int) -> ir.Value:
        """A load that is not contiguous across lanes (attention's keys, read a sequence
        position per lane): one scalar load per lane, its address at that lane's value of the
        loop variable, inserted into a vector (the backend may fuse them into a gather)."""
        b = fr.builder
        base = fr.vars[lanes.var]
        vec: ir.Value = ir.Constant(ir.VectorType(memory_type(e.dtype), width), ir.Undefined)
        try:
            for k in range(width):
                fr.vars[lanes.var] = b.add(base, ir.Constant(base.type, k))
                value = b.load(self.address(fr, e.buffer, e.indices), typ=memory_type(e.dtype),
                               align=dtype_bits(e.dtype) // 8)
                vec = b.insert_element(vec, value, ir.Constant(ir.IntType(32), k))
        finally:
            fr.vars[lanes.var] = base
        return vec

    def vexpr(self, fr: Frame, e: L.PrimExpr, lanes: Lanes, width: int) -> ir.Value:
        """``e`` at lanes ``v .. v + width - 1`` (``v = lanes.var``): a vector, or a scalar when
        ``e`` does not depend on the lanes (callers splat it where a vector is needed)."""
        if not L.uses_var(e, lanes.vars):
            return self.expr(fr, e)
        b = fr.builder
        if isinstance(e, L.Var):
            return fr.vars[e]
        if isinstance(e, L.BufferLoad):
            if _contiguous(e.buffer, e.indices, lanes):
                ty = ir.VectorType(memory_type(e.dtype), width)
                return b.load(self.address(fr, e.buffer, e.indices), typ=ty,
                              align=dtype_bits(e.dtype) // 8)
            return self._gather(fr, e, lanes, width)
        if isinstance(e, L.Binary):
            fused = self._accumulated_dot(fr, e, lanes, width)
            if fused is not None:
                return fused
            x = self._splat(fr, self.vexpr(fr, e.a, lanes, width), width)
            y = self._splat(fr, self.vexpr(fr, e.b, lanes, width), width)
            return self.apply_binary(b, e.op, e.a.dtype, x, y)
        if isinstance(e, L.Select):
            return self._vselect(fr, e, lanes, width)
        if isinstance(e, L.Cast):
            return self.cast(fr, self.vexpr(fr, e.value, lanes, width), e.value.dtype, e.dtype)
        if isinstance(e, L.Call) and e.name == "reinterpret":
            x = self.vexpr(fr, e.args[0], lanes, width)
            return b.bitcast(x, ir.VectorType(value_type(e.dtype), width))
        if isinstance(e, L.Call) and e.name == loop_int8.DOT_U8I8X4:
            x, y = (self._splat(fr, self.vexpr(fr, a, lanes, width), width) for a in e.args)
            return self._dot_u8i8x4(fr, None, x, y)
        if isinstance(e, L.Call) and e.name == loop_int8.DOT_U8I8X4_SAT16:
            x, y = (self._splat(fr, self.vexpr(fr, a, lanes, width), width) for a in e.args)
            return self._dot_u8i8x4_sat16(fr, x, y)
        if isinstance(e, L.Call) and e.name == loop_int8.LOAD_U8X4:
            (load,) = e.args
            return b.load(self.address(fr, load.buffer, load.indices),
                          typ=ir.VectorType(ir.IntType(32), width), align=1)
        if isinstance(e, L.Call) and e.name == loop_int8.DOT_I16X2:
            return self._dot_i16x2(fr, e, lanes, width)
        if isinstance(e, L.Call):
            args = [self._splat(fr, self.vexpr(fr, a, lanes, width), width) for a in e.args]
            fn = self.mc.vector_intrinsic(_LLVM_INTRINSICS[e.name], args[0].type, len(args))
            return b.call(fn, args)
        raise AssertionError(f"not lane-wise: {e!r}")  # vector_width() rules it out

    def _accumulated_dot(self, fr: Frame, e: L.Binary, lanes: Lanes,
                         width: int) -> ir.Value | None:
        """``acc + dot_u8i8x4(x, y)`` as one ``vpdpbusd`` with the accumulator, on x86 with
        VNNI (``usdot`` per 128 bits on aarch64 with i8mm); None elsewhere (the sum is emitted
        as an add)."""
        kind = self.mc.int8_dot
        if e.op != "+" or not (kind.startswith("vnni") or kind in ("i8mm", "dotprod")):
            return None
        for dot, acc in ((e.b, e.a), (e.a, e.b)):
            if (isinstance(dot, L.Call) and dot.name == loop_int8.DOT_U8I8X4
                    and L.uses_var(dot, lanes.vars)):
                x, y = (self._splat(fr, self.vexpr(fr, a, lanes, width), width)
                        for a in dot.args)
                if width * 32 not in ((256, 512) if kind.startswith("vnni") else
                                      (128, 256, 512)):
                    return None
                c = self._splat(fr, self.vexpr(fr, acc, lanes, width), width)
                return self._dot_u8i8x4(fr, c, x, y)
        return None

    def _dot_u8i8x4(self, fr: Frame, acc: ir.Value | None, x: ir.Value,
                    y: ir.Value) -> ir.Value:
        """Vector ``[acc +] dot_u8i8x4(x, y)`` on ``<W x i32>``: x86 VNNI ``vpdpbusd`` (256 or
        512 bits); AVX2 / AVX-512BW: the even and odd bytes widened to 16 bits in their lanes
        (unsigned ``x``: masks; signed ``y``: 16-bit shifts) and two ``vpmaddwd``, exact (never
        ``vpmaddubsw``, whose 16-bit pair sums saturate); else plain integer IR."""
        b = fr.builder
        bits = x.type.count * 32
        kind = self.mc.int8_dot
        if kind.startswith("vnni") and bits in (256, 512):
            fn = self.mc.declare(f"llvm.x86.avx512.vpdpbusd.{bits}", x.type,
                                 [x.type, x.type, x.type])
            zero = ir.Constant(x.type, [0] * x.type.count)
            return b.call(fn, [zero if acc is None else acc, x, y])
        if kind in ("i8mm", "dotprod") and bits % 128 == 0:
            return self._usdot(fr, acc, x, y)
        name = {256: "llvm.x86.avx2.pmadd.wd", 512: "llvm.x86.avx512.pmaddw.d.512"}.get(bits)
        if kind and name and (bits == 256 or kind in ("avx512bw", "vnni512")):
            half = ir.VectorType(ir.IntType(16), 2 * x.type.count)
            mask = ir.Constant(x.type, [0x00FF00FF] * x.type.count)
            eight = ir.Constant(half, [8] * half.count)
            x_even = b.bitcast(b.and_(x, mask), half)
            x_odd = b.bitcast(b.and_(b.lshr(x, ir.Constant(x.type, [8] * x.type.count)), mask),
                              half)
            yh = b.bitcast(y, half)
            y_even, y_odd = b.ashr(b.shl(yh, eight), eight), b.ashr(yh, eight)
            fn = self.mc.declare(name, x.type, [half, half])
            value = b.add(b.call(fn, [x_even, y_even]), b.call(fn, [x_odd, y_odd]))
        else:
            value = dot_u8i8x4_generic(b, x, y)
        return value if acc is None else b.add(acc, value)

    def _dot_u8i8x4_sat16(self, fr: Frame, x: ir.Value, y: ir.Value) -> ir.Value:
        """Vector ``dot_u8i8x4_sat16(x, y)`` on ``<W x i32>``: on x86 with AVX2 (AVX-512BW for
        512 bits) ``vpmaddubsw`` of the bytes (unsigned ``x``, signed ``y``: int16 pair sums,
        saturated) and ``vpmaddwd`` of those with ones — per 256 bits, what onnxruntime MLAS's
        AVX2 U8S8 kernel issues per 32 products (docs/decisions/049); else plain integer IR
        with the clamps."""
        b = fr.builder
        bits = x.type.count * 32
        kind = self.mc.int8_dot
        names = {256: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
                 512: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")}
        if not kind or kind in ("i8mm", "dotprod") or bits not in names or \
                (bits == 512 and kind not in ("avx512bw", "vnni512")):
            return dot_u8i8x4_sat16_generic(b, x, y)
        maddubs, maddwd = names[bits]
        byte = ir.VectorType(ir.IntType(8), bits // 8)
        half = ir.VectorType(ir.IntType(16), bits // 16)
        pairs = b.call(self.mc.declare(maddubs, half, [byte, byte]),
                       [b.bitcast(x, byte), b.bitcast(y, byte)])
        ones = ir.Constant(half, [1] * half.count)
        return b.call(self.mc.declare(maddwd, x.type, [half, half]), [pairs, ones])

    def _dot_i16x2(self, fr: Frame, e: L.Call, lanes: Lanes, width: int) -> ir.Value:
        """Vector ``dot_i16x2`` → ``<W x i32>``: on x86 with AVX2 (AVX-512BW for 512 bits)
        the pairs interleaved, ``(a0[i], a1[i])`` and ``(b0[i], b1[i])`` adjacent, and one
        ``vpmaddwd`` per 256 (512) bits of result; else plain integer IR."""
        b = fr.builder
        kind = self.mc.int8_dot
        bits = {"avx2": 256, "vnni256": 256, "avx512bw": 512, "vnni512": 512}.get(kind, 0)
        if not bits or (width * 32) % bits:
            return dot_i16x2_generic(b, *(self._splat(fr, self.vexpr(fr, a, lanes, width), width)
                                          for a in e.args))
        a0, a1, b0, b1 = e.args
        a, w = self._pairs(fr, a0, a1, lanes, width), self._pairs(fr, b0, b1, lanes, width)
        half = ir.VectorType(ir.IntType(16), bits // 16)
        out = ir.VectorType(ir.IntType(32), bits // 32)
        name = "llvm.x86.avx2.pmadd.wd" if bits == 256 else "llvm.x86.avx512.pmaddw.d.512"
        fn = self.mc.declare(name, out, [half, half])
        step = bits // 16

        def chunk(v: ir.Value, k: int) -> ir.Value:
            if v.type.count == step:
                return v
            return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(
                ir.VectorType(ir.IntType(32), step), list(range(k * step, (k + 1) * step))))

        parts = [b.call(fn, [chunk(a, k), chunk(w, k)]) for k in range(2 * width // step)]
        while len(parts) > 1:  # concatenate pairs back to <W x i32>
            m = parts[0].type.count
            parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(
                ir.VectorType(ir.IntType(32), 2 * m), list(range(2 * m))))
                for i in range(0, len(parts), 2)]
        return parts[0]

    def _pairs(self, fr: Frame, x0: L.PrimExpr, x1: L.PrimExpr, lanes: Lanes,
               width: int) -> ir.Value:
        """``<2W x i16>`` of ``x0`` and ``x1`` interleaved. Where both are ``int16(X) [- k]``
        of 8-bit ``X`` of one dtype and the same ``k``, the bytes are interleaved first and
        widened once (``vpunpcklbw`` + one ``vpmovsxbw``/``vpmovzxbw``, then one ``vpsubw``),
        instead of widening and subtracting each and interleaving words."""
        b = fr.builder
        mask = ir.Constant(ir.VectorType(ir.IntType(32), 2 * width),
                           [k for i in range(width) for k in (i, width + i)])
        word = _word_halves(x0, x1)
        if word is not None:  # already (lo, hi) pairs, little-endian
            v = self._splat(fr, self.vexpr(fr, word, lanes, width), width)
            return b.bitcast(v, ir.VectorType(ir.IntType(16), 2 * width))
        bytes_of = _word_bytes(x0, x1)
        if bytes_of is not None:  # bytes (0, 2) or (1, 3) of each word, sign-extended
            word, shift = bytes_of
            v = b.bitcast(self._splat(fr, self.vexpr(fr, word, lanes, width), width),
                          ir.VectorType(ir.IntType(16), 2 * width))
            eight = ir.Constant(v.type, [8] * (2 * width))
            return b.ashr(v if shift else b.shl(v, eight), eight)
        (n0, k0), (n1, k1) = _narrow_offset(x0), _narrow_offset(x1)
        if n0 is not None and n1 is not None and n0.dtype == n1.dtype and k0 == k1:
            v0, v1 = (self._splat(fr, self.vexpr(fr, n, lanes, width), width) for n in (n0, n1))
            pairs = self.cast(fr, b.shuffle_vector(v0, v1, mask), n0.dtype, "int16")
            if k0:
                pairs = b.sub(pairs, ir.Constant(pairs.type, [k0] * (2 * width)))
            return pairs
        v0, v1 = (self._splat(fr, self.vexpr(fr, x, lanes, width), width) for x in (x0, x1))
        return b.shuffle_vector(v0, v1, mask)

    def _usdot(self, fr: Frame, acc: ir.Value | None, x: ir.Value, y: ir.Value) -> ir.Value:
        """aarch64 i8mm: ``llvm.aarch64.neon.usdot.v4i32.v16i8(acc, u8 bytes, s8 bytes)`` per
        128 bits (lane ``i`` += Σ_j ``u8(x)[4i+j] · s8(y)[4i+j]``: ``dot_u8i8x4`` per lane).

        ``+dotprod`` without i8mm has only same-sign ``sdot`` / ``udot`` (Arm ARM, SDOT (vector):
        signed bytes, four products a 32-bit lane, accumulating). Then, exactly,
        ``Σ u·s = Σ (u - 128)·s + 128·Σ s = sdot(acc, u ^ 0x80, s) - sdot(0, -128, s)``: the
        unsigned bytes offset into int8 by flipping their top bit, and the offset's products
        (-128 is an int8; +128 is not) subtracted; every partial sum fits int32
        (|4 · 128 · 128| per lane and step)."""
        b = fr.builder
        v4, v16 = ir.VectorType(ir.IntType(32), 4), ir.VectorType(ir.IntType(8), 16)
        signed = self.mc.int8_dot == "dotprod"
        name = "sdot" if signed else "usdot"
        fn = self.mc.declare(f"llvm.aarch64.neon.{name}.v4i32.v16i8", v4, [v4, v16, v16])
        n = x.type.count
        zero = ir.Constant(v4, [0] * 4)
        flip = ir.Constant(v16, [0x80] * 16)  # as int8: -128

        def dot(a: ir.Value | None, u: ir.Value, s: ir.Value) -> ir.Value:
            u, s = b.bitcast(u, v16), b.bitcast(s, v16)
            if not signed:
                return b.call(fn, [zero if a is None else a, u, s])
            value = b.call(fn, [zero if a is None else a, b.xor(u, flip), s])
            return b.sub(value, b.call(fn, [zero, flip, s]))

        def part(v: ir.Value, k: int) -> ir.Value:
            if n == 4:
                return v
            return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                    ir.Constant(v4, list(range(4 * k, 4 * k + 4))))

        parts = [dot(None if acc is None else part(acc, k), part(x, k), part(y, k))
                 for k in range(n // 4)]
        while len(parts) > 1:  # concatenate pairs back to <n x i32>
            parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(
                ir.VectorType(ir.IntType(32), 2 * parts[i].type.count),
                list(range(2 * parts[i].type.count)))) for i in range(0, len(parts), 2)]
        return parts[0]

    def _vselect(self, fr: Frame, e: L.Select, lanes: Lanes, width: int) -> ir.Value:
        b = fr.builder
        if L.uses_var(e.cond, lanes.vars):  # a lane mask (_lane_wise: sides_may_trap is false)
            return b.select(self.vexpr(fr, e.cond, lanes, width),
                            self._splat(fr, self.vexpr(fr, e.true_value, lanes, width), width),
                            self._splat(fr, self.vexpr(fr, e.false_value, lanes, width), width))
        cond = self.to_bool(fr, self.expr(fr, e.cond), e.cond.dtype)
        if not sides_may_trap(e):
            tv = self._splat(fr, self.vexpr(fr, e.true_value, lanes, width), width)
            fv = self._splat(fr, self.vexpr(fr, e.false_value, lanes, width), width)
            return b.select(cond, tv, fv)
        return self.branch_select(
            fr, cond, lambda: self._splat(fr, self.vexpr(fr, e.true_value, lanes, width), width),
            lambda: self._splat(fr, self.vexpr(fr, e.false_value, lanes, width), width))

    @staticmethod
    def _splat(fr: Frame, x: ir.Value, width: int) -> ir.Value:
        """``x`` broadcast to ``width`` lanes (vectors pass through)."""
        if isinstance(x.type, ir.VectorType):
            return x
        b = fr.builder
        vty = ir.VectorType(x.type, width)
        one = b.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(I64, 0))
        return b.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                ir.Constant(ir.VectorType(ir.IntType(32), width), None))
