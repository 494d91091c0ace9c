"""Explicit SIMD code for ``vectorized`` loops (TVM's ``VectorizeLoop`` pass with its ``Ramp`` and
``Broadcast`` nodes, src/tir/transforms/vectorize_loop.cc, done here at code generation).

A ``vectorized`` loop ``for v in [0, E)`` whose body is a sequence of stores is emitted as E / W
chunks of W-lane vector instructions when every access moves with ``v`` contiguously (flat offset
``base + v``) or not at all (a scalar, broadcast to all lanes): loads and stores become
``<W x T>`` loads and stores, arithmetic becomes vector arithmetic. W is the target's lanes for
the element type, or the largest power of two dividing E below that. Anything else (a strided or
indirect access, ``v`` used as a value, a lane-dependent condition, bool or mixed-width elements)
keeps the scalar loop with LLVM's vectorizer hints (:mod:`kiln.codegen.llvm_func`).

Why not leave it all to LLVM's loop vectorizer: after full unrolling of the register block, its
choices depend on the whole kernel. A 1×1 convolution with a fused residual add came out with
accumulators shifted by one lane (a peeled first iteration and shuffles in the inner loop) and
ran 2.9× slower than the same convolution without the add (MobileNetV2's 576→96 projection:
380 µs vs 132 µs on one core). Emitting the vectors ourselves makes the register block's code
the same whatever the epilogue.
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen.llvm_expr import _LLVM_INTRINSICS, may_trap
from kiln.codegen.llvm_ir import I64, Frame, dtype_bits, memory_type, value_type
from kiln.ir import loop as L

#: Float binary operators that have a lane-wise vector form here.
_FLOAT_OPS = ("+", "-", "*", "/", "min", "max")
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
    return 0 if not _uses(e, v) else None


def _uses(e: L.PrimExpr, v: L.Var) -> bool:
    stack = [e]
    while stack:
        x = stack.pop()
        if x is v:
            return True
        stack.extend(L.expr_children(x))
    return False


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


def _stores(body: L.Stmt) -> list[L.BufferStore] | None:
    if isinstance(body, L.BufferStore):
        return [body]
    if isinstance(body, L.SeqStmt) and all(isinstance(s, L.BufferStore) for s in body.stmts):
        return list(body.stmts)
    return None


def _lane_wise(e: L.PrimExpr, v: L.Var, bits: int) -> bool:
    """Whether ``e`` has a vector form: lane-invariant, or built from contiguous loads of
    ``bits``-wide elements with lane-wise float operators."""
    if not _uses(e, v):
        return True
    if isinstance(e, L.BufferLoad):
        return (e.dtype != "bool" and dtype_bits(e.dtype) == bits
                and flat_coefficient(e.buffer, e.indices, v) == 1)
    if isinstance(e, L.Binary):
        return (L.is_float(e.dtype) and e.op in _FLOAT_OPS
                and _lane_wise(e.a, v, bits) and _lane_wise(e.b, v, bits))
    if isinstance(e, L.Select):
        # A lane-invariant condition only: one branch for all lanes.
        return (not _uses(e.cond, v) and _lane_wise(e.true_value, v, bits)
                and _lane_wise(e.false_value, v, bits))
    if isinstance(e, L.Call):
        return (e.name in _LLVM_INTRINSICS and L.is_float(e.dtype)
                and all(_lane_wise(a, v, bits) for a in e.args))
    return False


def vector_width(s: L.For, vector_bits: int) -> int:
    """Lanes W for emitting loop ``s`` as explicit vectors, or 0 when it must stay scalar."""
    if vector_bits <= 0 or not (isinstance(s.min, L.IntImm) and s.min.value == 0
                                and isinstance(s.extent, L.IntImm)):
        return 0
    stores = _stores(s.body)
    if not stores or any(st.buffer.dtype == "bool" for st in stores):
        return 0
    bits = dtype_bits(stores[0].buffer.dtype)
    if any(dtype_bits(st.buffer.dtype) != bits for st in stores):
        return 0
    width = vector_bits // bits
    while width > 1 and s.extent.value % width:
        width //= 2
    if width < 4:
        return 0
    for st in stores:
        if flat_coefficient(st.buffer, st.indices, s.var) != 1:
            return 0
        if not _lane_wise(st.value, s.var, bits):
            return 0
    return width


class VectorLoopCodegen:
    """Mixin of :class:`~kiln.codegen.llvm_func.FuncCodegen`: the vector form of a loop that
    :func:`vector_width` accepted."""

    def vector_for(self, fr: Frame, s: L.For, width: int) -> None:
        chunks = s.extent.value // width
        var_type = value_type(s.var.dtype)

        def chunk(base: ir.Value) -> None:
            fr.vars[s.var] = base
            for st in _stores(s.body):
                value = self.vexpr(fr, st.value, s.var, width)
                value = self._splat(fr, value, width)
                ptr = self.address(fr, st.buffer, st.indices)
                fr.builder.store(value, ptr, align=dtype_bits(st.buffer.dtype) // 8)
            del fr.vars[s.var]

        if chunks <= MAX_UNROLLED_CHUNKS:
            for c in range(chunks):
                chunk(ir.Constant(var_type, c * width))
            return
        c = L.Var(f"{s.var.name}_chunk", s.var.dtype)
        self.loop(fr, c, ir.Constant(var_type, 0), ir.Constant(var_type, chunks),
                  lambda: chunk(fr.builder.mul(fr.vars[c], ir.Constant(var_type, width))))

    def vexpr(self, fr: Frame, e: L.PrimExpr, v: L.Var, width: int) -> ir.Value:
        """``e`` at lanes ``v .. v + width - 1``: a vector, or a scalar when ``e`` does not
        depend on ``v`` (callers splat it where a vector is needed)."""
        if not _uses(e, v):
            return self.expr(fr, e)
        b = fr.builder
        if isinstance(e, L.BufferLoad):
            ty = ir.VectorType(memory_type(e.dtype), width)
            return b.load(self.address(fr, e.buffer, e.indices), typ=ty,
                          align=dtype_bits(e.dtype) // 8)
        if isinstance(e, L.Binary):
            x = self._splat(fr, self.vexpr(fr, e.a, v, width), width)
            y = self._splat(fr, self.vexpr(fr, e.b, v, width), width)
            fl = ("contract",)
            if e.op == "+":
                return b.fadd(x, y, flags=fl)
            if e.op == "-":
                return b.fsub(x, y, flags=fl)
            if e.op == "*":
                return b.fmul(x, y, flags=fl)
            if e.op == "/":
                return b.fdiv(x, y)
            cmp = "<" if e.op == "min" else ">"
            return b.select(b.fcmp_ordered(cmp, x, y), x, y)
        if isinstance(e, L.Select):
            return self._vselect(fr, e, v, width)
        if isinstance(e, L.Call):
            args = [self._splat(fr, self.vexpr(fr, a, v, width), width) for a in e.args]
            fn = self.mc.vector_intrinsic(_LLVM_INTRINSICS[e.name], args[0].type, len(args))
            return b.call(fn, args)
        raise AssertionError(f"not lane-wise: {e!r}")  # vector_width() rules it out

    def _vselect(self, fr: Frame, e: L.Select, v: L.Var, width: int) -> ir.Value:
        b = fr.builder
        cond = self.to_bool(fr, self.expr(fr, e.cond), e.cond.dtype)
        if not (may_trap(e.true_value) or may_trap(e.false_value)):
            tv = self._splat(fr, self.vexpr(fr, e.true_value, v, width), width)
            fv = self._splat(fr, self.vexpr(fr, e.false_value, v, width), width)
            return b.select(cond, tv, fv)
        return self.branch_select(
            fr, cond, lambda: self._splat(fr, self.vexpr(fr, e.true_value, v, width), width),
            lambda: self._splat(fr, self.vexpr(fr, e.false_value, v, width), width))

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
