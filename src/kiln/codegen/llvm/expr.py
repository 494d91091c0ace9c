"""Loop-IR expressions → LLVM IR: the LLVM code generator's table of the loop-IR vocabulary
(TVM's ``CodeGenLLVM::VisitExpr_``, src/target/llvm/codegen_llvm.cc), and the ``kiln.*``
packed-argument reads of MakePackedAPI (``CodeGenCPU``'s ``tvm_struct_get``).

Semantics follow ``kiln.tir.interpreter``: ``//`` and ``%`` on integers are floor division and
modulo, ``/`` truncates; ``Select`` and ``and``/``or`` whose lazy side may trap (a load or an
integer division) become branches, as C's ``?:``, ``&&`` and ``||``; bool is ``i1`` in registers
and a byte in memory; casts to bool test ``!= 0``. Float ``+ - *`` carry the ``contract`` flag
(FMA allowed, as GCC's default ``-ffp-contract=fast``); nothing is reassociated. Intrinsics are
LLVM's (``llvm.exp``...; lowered to libm calls or instructions) except ``erf`` (libm).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kiln.codegen.llvm.ir import (
    DLTENSOR,
    F32,
    I1,
    I8,
    I16,
    I32,
    I64,
    PTR,
    T_DEVICE,
    T_DTYPE,
    T_NDIM,
    T_SHAPE,
    Frame,
    ModuleCodegen,
    dtype_bits,
    int_const,
    is_unsigned,
    memory_type,
    value_type,
)
from kiln.errors import CompileError
from kiln.tir import intrin_int8 as loop_int8
from kiln.tir import loop as L
from kiln.tir import speculation
from kiln.tir.index import merge_split_indices

_LLVM_INTRINSICS = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt",
                    "tanh": "llvm.tanh", "fabs": "llvm.fabs", "floor": "llvm.floor",
                    "ceil": "llvm.ceil", "nearbyint": "llvm.nearbyint", "pow": "llvm.pow",
                    "sin": "llvm.sin", "cos": "llvm.cos", "fence": "llvm.arithmetic.fence"}
# The rest come from libm: float32 names end in "f" (C99).
_LIBM = {(name, dtype): name + ("f" if dtype == "float32" else "")
         for name in ("erf", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                      "atanh", "fmod") for dtype in ("float32", "float64")}
_ICMP = ("<", "<=", ">", ">=", "==", "!=")


def sides_may_trap(e: L.Select) -> bool:
    """Whether evaluating both sides of ``e`` for any condition could fault
    (:func:`kiln.tir.speculation.may_trap`), except for loads the condition itself makes (FastExp's
    NaN test ``x != x ? x : f(x)`` loads
    what its sides load; a guarded load, padding's ``inside ? data[y - 1] : 0``, stays a
    branch)."""
    made = speculation.loads_in(e.cond)
    return any(speculation.may_trap(side, made) for side in (e.true_value, e.false_value))


class ExprCodegen:
    """Expressions of one PrimFunc into the current :class:`Frame` (``FuncCodegen`` adds the
    statements)."""

    mc: ModuleCodegen
    func: L.PrimFunc

    def expr(self, fr: Frame, e: L.PrimExpr) -> ir.Value:
        if isinstance(e, L.Var):
            try:
                return fr.vars[e]
            except KeyError:
                raise CompileError(f"LLVM codegen: variable {e.name} is used outside its "
                                   "loop") from None
        if isinstance(e, L.IntImm):
            ty = value_type(e.dtype)
            return ir.Constant(ty, int_const(e.value, ty.width))
        if isinstance(e, L.FloatImm):
            # LLVM takes a half constant only when it is exact: round it to half first.
            value = float(np.float16(e.value)) if e.dtype == "float16" else e.value
            return ir.Constant(value_type(e.dtype), value)
        if isinstance(e, L.Binary):
            return self.binary(fr, e)
        if isinstance(e, L.Select):
            return self.select(fr, e)
        if isinstance(e, L.Cast):
            return self.cast(fr, self.expr(fr, e.value), e.value.dtype, e.dtype)
        if isinstance(e, L.BufferLoad):
            value = fr.builder.load(self.address(fr, e.buffer, e.indices),
                                    typ=memory_type(e.dtype))
            if e.dtype == "bool":
                value = fr.builder.icmp_unsigned("!=", value, I8(0))
            return value
        if isinstance(e, L.Call):
            return self.call(fr, e)
        raise CompileError(f"LLVM codegen: unknown expression {type(e).__name__}")

    def call_extern(self, fr: Frame, e: L.Call) -> ir.Value:
        """:func:`kiln.tir.loop.call_extern`: an ``extern_weak`` declaration, called when the
        library defines it, else 1 (``handle`` arguments are pointers, the rest their type)."""
        b = fr.builder
        args = [self.expr(fr, a) for a in e.args]
        fn = self.mc.declare(e.name[len(L.EXTERN):], I32, [a.type for a in args])
        fn.linkage = "extern_weak"
        defined = b.icmp_unsigned("!=", b.ptrtoint(fn, I64), I64(0))
        with b.if_else(defined) as (then, otherwise):
            with then:
                value, called = b.call(fn, args), b.block
            with otherwise:
                absent = b.block
        result = b.phi(I32)
        result.add_incoming(value, called)
        result.add_incoming(I32(1), absent)
        return result

    def address(self, fr: Frame, buf: L.Buffer, indices: list[L.PrimExpr]) -> ir.Value:
        """Row-major element address (C codegen's ``access``)."""
        base = fr.bufs.get(buf)
        if base is None:
            raise CompileError(f"LLVM codegen: buffer {buf.name} is used outside its "
                               "allocation")
        b = fr.builder
        stride: int | ir.Value = 1
        const = 0
        terms: dict[int, list] = {}  # id(atom) -> [atom, factor]
        shape, indices = merge_split_indices(buf.shape, indices)  # [f // W, f % W] -> [f]
        for extent, idx in zip(reversed(shape), reversed(indices)):
            if isinstance(stride, int):
                c, parts = linear_index(idx)
                const += c * stride
                for atom, k in parts:
                    terms.setdefault(id(atom), [atom, 0])[1] += k * stride
            else:  # after a symbolic extent: a run-time stride
                terms[id(idx)] = [idx, stride]
            if isinstance(stride, int) and isinstance(extent, int):
                stride *= extent
            else:  # a symbolic extent: the stride is computed at run time
                ext = I64(extent) if isinstance(extent, int) else self.expr(fr, extent)
                stride = b.mul(I64(stride) if isinstance(stride, int) else stride, ext,
                               flags=("nsw",))
        offset = None
        for atom, factor in terms.values():
            if isinstance(factor, int) and factor == 0:
                continue
            term = self._to_i64(fr, self.expr(fr, atom), atom.dtype)
            if not isinstance(factor, int) or factor != 1:
                term = b.mul(term, I64(factor) if isinstance(factor, int) else factor,
                             flags=("nsw",))
            offset = term if offset is None else b.add(offset, term, flags=("nsw",))
        if const:
            offset = I64(const) if offset is None else b.add(offset, I64(const), flags=("nsw",))
        if offset is None:
            return base
        return b.gep(base, [offset], inbounds=True, source_etype=memory_type(buf.dtype))

    def binary(self, fr: Frame, e: L.Binary) -> ir.Value:
        if e.op in ("and", "or"):
            return self.logical(fr, e)
        return self.apply_binary(fr.builder, e.op, e.a.dtype, self.expr(fr, e.a),
                                 self.expr(fr, e.b))

    def apply_binary(self, b: ir.IRBuilder, op: str, dt: str, x: ir.Value,
                     y: ir.Value) -> ir.Value:
        """``x op y`` for operands of loop-IR dtype ``dt``: scalars, or vectors of the same
        lanes (the explicit vector path; it never asks for the float ``//`` and ``%``)."""
        if L.is_float(dt):
            fl = ("contract",)
            if op == "+":
                return b.fadd(x, y, flags=fl)
            if op == "-":
                return b.fsub(x, y, flags=fl)
            if op == "*":
                return b.fmul(x, y, flags=fl)
            if op == "/":
                return b.fdiv(x, y)
            if op in ("//", "%"):
                q = b.call(self.mc.intrinsic("llvm.floor", x.type), [b.fdiv(x, y)])
                return q if op == "//" else b.fsub(x, b.fmul(q, y))
            if op == "min":
                return b.select(b.fcmp_ordered("<", x, y), x, y)
            if op == "max":
                return b.select(b.fcmp_ordered(">", x, y), x, y)
            if op == "!=":
                return b.fcmp_unordered("!=", x, y)
            if op in _ICMP:
                return b.fcmp_ordered(op, x, y)
        else:
            unsigned = is_unsigned(dt)
            cmp = b.icmp_unsigned if unsigned else b.icmp_signed
            if op in _ICMP:
                return cmp(op, x, y)
            if op == "min":
                return b.select(cmp("<", x, y), x, y)
            if op == "max":
                return b.select(cmp(">", x, y), x, y)
            if dt == "bool":
                raise CompileError(f"LLVM codegen: operator {op} on bool")
            nsw = self._nsw(dt)
            if op == "+":
                return b.add(x, y, flags=nsw)
            if op == "-":
                return b.sub(x, y, flags=nsw)
            if op == "*":
                return b.mul(x, y, flags=nsw)
            if op == "/":
                return b.udiv(x, y) if unsigned else b.sdiv(x, y)
            if op == "&":
                return b.and_(x, y)
            if op == "|":
                return b.or_(x, y)
            if op == "^":
                return b.xor(x, y)
            if op == "<<":
                return b.shl(x, y)
            if op == ">>":
                return b.lshr(x, y) if unsigned else b.ashr(x, y)
            if op in ("//", "%"):
                if unsigned:
                    return b.udiv(x, y) if op == "//" else b.urem(x, y)
                return self.floor_divmod(b, x, y, op)
        raise CompileError(f"LLVM codegen: unknown operator {op} on {dt}")

    @staticmethod
    def floor_divmod(b: ir.IRBuilder, x: ir.Value, y: ir.Value, op: str) -> ir.Value:
        """Floor division / modulo from truncating ``sdiv``/``srem`` (the C codegen's
        ``kiln_floordiv``): adjust when the remainder is nonzero and its sign differs from
        the divisor's."""
        zero = ir.Constant(x.type, 0)
        q, r = b.sdiv(x, y), b.srem(x, y)
        adjust = b.and_(b.icmp_signed("!=", r, zero),
                        b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
        if op == "//":
            return b.sub(q, b.zext(adjust, x.type))
        return b.add(r, b.select(adjust, y, zero))

    def logical(self, fr: Frame, e: L.Binary) -> ir.Value:
        b = fr.builder
        x = self.to_bool(fr, self.expr(fr, e.a), e.a.dtype)
        if not speculation.may_trap(e.b):
            y = self.to_bool(fr, self.expr(fr, e.b), e.b.dtype)
            return b.and_(x, y) if e.op == "and" else b.or_(x, y)
        # Short-circuit, as C's && and ||.
        start, rhs, done = b.block, fr.block(f"{e.op}.rhs"), fr.block(f"{e.op}.done")
        if e.op == "and":
            b.cbranch(x, rhs, done)
        else:
            b.cbranch(x, done, rhs)
        b.position_at_end(rhs)
        y = self.to_bool(fr, self.expr(fr, e.b), e.b.dtype)
        rhs_end = b.block
        b.branch(done)
        b.position_at_end(done)
        phi = b.phi(I1)
        phi.add_incoming(I1(0 if e.op == "and" else 1), start)
        phi.add_incoming(y, rhs_end)
        return phi

    def select(self, fr: Frame, e: L.Select) -> ir.Value:
        b = fr.builder
        cond = self.to_bool(fr, self.expr(fr, e.cond), e.cond.dtype)
        if not sides_may_trap(e):
            return b.select(cond, self.expr(fr, e.true_value), self.expr(fr, e.false_value))
        return self.branch_select(fr, cond, lambda: self.expr(fr, e.true_value),
                                  lambda: self.expr(fr, e.false_value))

    @staticmethod
    def branch_select(fr: Frame, cond: ir.Value, true_value, false_value) -> ir.Value:
        """``cond ? true_value() : false_value()`` evaluating only the chosen side (C's ``?:``):
        a guarded load must not run out of bounds. SimplifyCFG turns this back into a select
        where speculation is safe."""
        b = fr.builder
        then, other, done = fr.block("sel.true"), fr.block("sel.false"), fr.block("sel.done")
        b.cbranch(cond, then, other)
        b.position_at_end(then)
        tv = true_value()
        then_end = b.block
        b.branch(done)
        b.position_at_end(other)
        fv = false_value()
        other_end = b.block
        b.branch(done)
        b.position_at_end(done)
        phi = b.phi(tv.type)
        phi.add_incoming(tv, then_end)
        phi.add_incoming(fv, other_end)
        return phi

    def cast(self, fr: Frame, v: ir.Value, src: str, dst: str) -> ir.Value:
        b = fr.builder
        if src == dst:
            return v
        if dst == "bool":
            return self.to_bool(fr, v, src)
        to = value_type(dst)
        if isinstance(v.type, ir.VectorType):  # the explicit vector path: lane-wise casts
            to = ir.VectorType(to, v.type.count)
        if L.is_float(src):
            if L.is_float(dst):
                return b.fpext(v, to) if dtype_bits(dst) > dtype_bits(src) else b.fptrunc(v, to)
            return b.fptoui(v, to) if is_unsigned(dst) else b.fptosi(v, to)
        if L.is_float(dst):
            return b.uitofp(v, to) if is_unsigned(src) else b.sitofp(v, to)
        width = 1 if src == "bool" else dtype_bits(src)
        if dtype_bits(dst) == width:
            return v
        if dtype_bits(dst) < width:
            return b.trunc(v, to)
        return b.zext(v, to) if is_unsigned(src) else b.sext(v, to)

    def to_bool(self, fr: Frame, v: ir.Value, dtype: str) -> ir.Value:
        if dtype == "bool":
            return v
        if L.is_float(dtype):
            return fr.builder.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
        return fr.builder.icmp_unsigned("!=", v, ir.Constant(v.type, 0))

    def call(self, fr: Frame, e: L.Call) -> ir.Value:
        if e.name.startswith("kiln."):
            return self.accessor(fr, e)
        if e.name.startswith(L.EXTERN):
            return self.call_extern(fr, e)
        if e.name == L.ADDRESS_OF:
            (load,) = e.args
            return self.address(fr, load.buffer, load.indices)
        if e.name == "reinterpret":
            return fr.builder.bitcast(self.expr(fr, e.args[0]), value_type(e.dtype))
        if e.name == loop_int8.DOT_U8I8X4:
            return dot_u8i8x4_generic(fr.builder, self.expr(fr, e.args[0]),
                                      self.expr(fr, e.args[1]))
        if e.name == loop_int8.DOT_U8I8X4_SAT16:
            return dot_u8i8x4_sat16_generic(fr.builder, self.expr(fr, e.args[0]),
                                            self.expr(fr, e.args[1]))
        if e.name == loop_int8.LOAD_U8X4:
            (load,) = e.args
            return fr.builder.load(self.address(fr, load.buffer, load.indices),
                                   typ=ir.IntType(32), align=1)
        if e.name == loop_int8.DOT_I16X2:
            return dot_i16x2_generic(fr.builder, *(self.expr(fr, a) for a in e.args))
        if not L.is_float(e.dtype) or e.name not in L.INTRINSICS:
            raise CompileError(f"LLVM codegen: intrinsic {e.name} on {e.dtype} is not "
                               "supported")
        args = [self.expr(fr, a) for a in e.args]
        ty = value_type(e.dtype)
        if e.name == "fence":  # llvmlite's declare_intrinsic does not know it
            fn = self.mc.declare(f"llvm.arithmetic.fence.{ty.intrinsic_name}", ty, [ty],
                                 attrs=("nounwind",))
            return fr.builder.call(fn, args)
        if e.name == "sigmoid":  # where FastExp left it: 1 / (1 + exp(-x))
            b, one = fr.builder, ir.Constant(ty, 1.0)
            exp = b.call(self.mc.intrinsic("llvm.exp", ty), [b.fneg(args[0])])
            return b.fdiv(one, b.fadd(one, exp))
        if e.dtype == "float16" and (e.name, "float32") in _LIBM:
            # libm has no half functions: call the float one and round back.
            b = fr.builder
            fn = self.mc.declare(_LIBM[(e.name, "float32")], F32, [F32] * len(args),
                                 attrs=("nounwind", "willreturn", "memory(none)"))
            return b.fptrunc(b.call(fn, [b.fpext(a, F32) for a in args]), ty)
        libm = _LIBM.get((e.name, e.dtype))
        if libm is not None:
            fn = self.mc.declare(libm, ty, [ty] * len(args),
                                 attrs=("nounwind", "willreturn", "memory(none)"))
        else:
            fn = self.mc.intrinsic(_LLVM_INTRINSICS[e.name], ty)
        return fr.builder.call(fn, args)

    # -------------------------------------------------------------------------- packed API
    def arg_tensor(self, fr: Frame, i: int) -> ir.Value:
        """``(DLTensor*)args[i].v_handle``."""
        b = fr.builder
        args = self._packed(fr)[0]
        return b.load(b.gep(args, [I64(i)], source_etype=I64), typ=PTR)

    def accessor(self, fr: Frame, e: L.Call) -> ir.Value:
        """The ``kiln.*`` packed-argument reads of MakePackedAPI (C codegen's ``_ACCESSORS``),
        each an int64."""
        b = fr.builder
        args, codes, num_args = self._packed(fr)
        field = e.name[len("kiln."):]
        idx = [a.value for a in e.args]

        def tensor_field(*path: int, ty: ir.Type) -> ir.Value:
            ptr = b.gep(self.arg_tensor(fr, idx[0]), [I32(0), *(I32(p) for p in path)],
                        source_etype=DLTENSOR)
            return b.load(ptr, typ=ty)

        if field == "num_args":
            return b.sext(num_args, I64)
        if field == "type_code":
            return b.sext(b.load(b.gep(codes, [I64(idx[0])], source_etype=I32), typ=I32), I64)
        if field == "handle_is_null":
            handle = b.load(b.gep(args, [I64(idx[0])], source_etype=I64), typ=PTR)
            return b.zext(b.icmp_unsigned("==", handle, ir.Constant(PTR, None)), I64)
        if field == "arg_ndim":
            return b.sext(tensor_field(T_NDIM, ty=I32), I64)
        if field == "arg_dtype_code":
            return b.zext(tensor_field(T_DTYPE, 0, ty=I8), I64)
        if field == "arg_dtype_bits":
            return b.zext(tensor_field(T_DTYPE, 1, ty=I8), I64)
        if field == "arg_dtype_lanes":
            return b.zext(tensor_field(T_DTYPE, 2, ty=I16), I64)
        if field == "arg_device_type":
            return b.sext(tensor_field(T_DEVICE, 0, ty=I32), I64)
        if field == "arg_shape":
            shape = tensor_field(T_SHAPE, ty=PTR)
            return b.load(b.gep(shape, [I64(idx[1])], source_etype=I64), typ=I64)
        if field == "arg_int":
            return b.load(b.gep(args, [I64(idx[0])], source_etype=I64), typ=I64)
        if field == "arg_compact":
            return b.sext(b.call(self.mc.is_compact(), [self.arg_tensor(fr, idx[0])]), I64)
        raise CompileError(f"LLVM codegen: unknown packed accessor {e.name}")

    def _packed(self, fr: Frame) -> tuple:
        if fr.packed is None:
            raise CompileError("LLVM codegen: packed-argument accessors outside the leading "
                               "argument checks")
        return fr.packed

    # -------------------------------------------------------------------------- helpers
    @staticmethod
    def _nsw(dtype: str) -> tuple[str, ...]:
        # int64 index arithmetic never wraps (C: signed overflow is undefined); narrower
        # integers wrap like numpy's.
        return ("nsw",) if dtype == "int64" else ()

    def _to_i64(self, fr: Frame, v: ir.Value, dtype: str) -> ir.Value:
        """``v`` (of ``dtype``) as an i64."""
        if v.type == I64:
            return v
        if L.is_float(dtype):
            return fr.builder.fptosi(v, I64)
        return self.cast(fr, v, dtype, "int64")

    @staticmethod
    def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
        return b.select(b.icmp_signed("<", x, y), x, y)


def linear_index(e: L.PrimExpr) -> tuple[int, list[tuple[L.PrimExpr, int]]]:
    """A signed integer index as ``c + Σ k · atom``: sums, differences and products by
    constants distributed, so that the pixels of an unrolled register block differ by a
    constant only. Written ``((xo * 14 + xi) * 2 + rx) * 32``, LLVM turned ``xo * 14 + 1``
    into an ``or`` it did not fold into the address: one pointer per pixel, spilled (a
    stride-2 int8 conv: 558 -> 270 us). An index of a valid access does not wrap, so the i64
    sum equals the int32 expression."""
    if isinstance(e, L.IntImm):
        return int(e.value), []
    if isinstance(e, L.Binary) and e.dtype in ("int32", "int64") and e.op in ("+", "-", "*"):
        if e.op == "*":
            for x, k in ((e.a, e.b), (e.b, e.a)):
                if isinstance(k, L.IntImm):
                    c, parts = linear_index(x)
                    return c * k.value, [(a, n * k.value) for a, n in parts]
            return 0, [(e, 1)]
        ca, pa = linear_index(e.a)
        cb, pb = linear_index(e.b)
        sign = 1 if e.op == "+" else -1
        return ca + sign * cb, pa + [(a, sign * n) for a, n in pb]
    return 0, [(e, 1)]


def dot_u8i8x4_generic(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """:func:`kiln.tir.intrin_int8.dot_u8i8x4` on int32 scalars or vectors with plain integer IR:
    per
    byte ``j``, ``(x >> 8j) & 255`` times ``(y << (24 - 8j)) >>s 24``, summed."""
    def splat(v: int) -> ir.Constant:
        if isinstance(x.type, ir.VectorType):
            return ir.Constant(x.type, [v] * x.type.count)
        return ir.Constant(x.type, v)

    total = None
    for j in range(4):
        u = b.and_(b.lshr(x, splat(8 * j)) if j else x, splat(255))
        s = b.ashr(b.shl(y, splat(24 - 8 * j)) if j < 3 else y, splat(24))
        term = b.mul(u, s)
        total = term if total is None else b.add(total, term)
    return total


def dot_u8i8x4_sat16_generic(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """:func:`kiln.tir.intrin_int8.dot_u8i8x4_sat16` on int32 scalars or vectors with plain
    integer IR: the products of :func:`dot_u8i8x4_generic`, each pair's sum clamped to
    [-32768, 32767] (compare and select), the two clamped sums added."""
    def splat(v: int) -> ir.Constant:
        if isinstance(x.type, ir.VectorType):
            return ir.Constant(x.type, [v] * x.type.count)
        return ir.Constant(x.type, v)

    def product(j: int) -> ir.Value:
        u = b.and_(b.lshr(x, splat(8 * j)) if j else x, splat(255))
        s = b.ashr(b.shl(y, splat(24 - 8 * j)) if j < 3 else y, splat(24))
        return b.mul(u, s)

    total = None
    for p in (0, 2):
        pair = b.add(product(p), product(p + 1))
        low, high = splat(-32768), splat(32767)
        pair = b.select(b.icmp_signed("<", pair, low), low, pair)
        pair = b.select(b.icmp_signed(">", pair, high), high, pair)
        total = pair if total is None else b.add(total, pair)
    return total


def dot_i16x2_generic(b: ir.IRBuilder, a0: ir.Value, a1: ir.Value, b0: ir.Value,
                      b1: ir.Value) -> ir.Value:
    """:func:`kiln.tir.intrin_int8.dot_i16x2` on int16 scalars or vectors with plain integer IR: the
    four sign-extended to int32, ``a0 · b0 + a1 · b1`` (LLVM's x86 backend may match
    ``vpmaddwd`` itself)."""
    wide = ir.IntType(32)
    if isinstance(a0.type, ir.VectorType):
        wide = ir.VectorType(wide, a0.type.count)
    x0, x1, y0, y1 = (b.sext(v, wide) for v in (a0, a1, b0, b1))
    return b.add(b.mul(x0, y0), b.mul(x1, y1))
