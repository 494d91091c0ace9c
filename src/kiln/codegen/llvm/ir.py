"""LLVM IR building blocks shared by the LLVM code generator (``llvm_expr``, ``llvm_func``):
the types of loop-IR dtypes and of the DLPack structs (LP64 layout, docs/formats.md §3.1), the
module being built (:class:`ModuleCodegen`: declarations, string constants, loop metadata, the
``kiln_is_compact`` helper) and the function being filled (:class:`Frame`). Built with
``llvmlite.ir`` (opaque pointers: LLVM 22).
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from kiln.errors import CompileError
from kiln.tir import loop as L

I1, I8, I16, I32, I64 = (ir.IntType(b) for b in (1, 8, 16, 32, 64))
PTR = ir.PointerType()
F32, F64 = ir.FloatType(), ir.DoubleType()
# DLPack structs, LP64 (docs/formats.md §3.1): natural layout, DLTensor is 48 bytes.
DLDEVICE = ir.LiteralStructType([I32, I32])
DLDATATYPE = ir.LiteralStructType([I8, I8, I16])
DLTENSOR = ir.LiteralStructType([PTR, DLDEVICE, I32, DLDATATYPE, PTR, PTR, I64])
T_DATA, T_DEVICE, T_NDIM, T_DTYPE, T_SHAPE, T_STRIDES, T_BYTE_OFFSET = range(7)
PARALLEL_ENV = ir.LiteralStructType([PTR, I32])  # TVMParallelGroupEnv {sync_handle, num_task}
TENSOR_ALIGN = 64
ERROR_BUFFER = 512

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64,
             "uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}


def value_type(dtype: str) -> ir.Type:
    """The LLVM type of a value of ``dtype`` in registers (bool: ``i1``).

    Raises
    ------
    CompileError
        For a dtype the LLVM codegen does not support.
    """
    if dtype == "float16":
        return ir.HalfType()
    if dtype == "float32":
        return F32
    if dtype == "float64":
        return F64
    if dtype == "bool":
        return I1
    if dtype in _INT_BITS:
        return ir.IntType(_INT_BITS[dtype])
    raise CompileError(f"LLVM codegen: dtype {dtype} is not supported")


def memory_type(dtype: str) -> ir.Type:
    """The LLVM type of a ``dtype`` element in memory (bool: one byte, as DLPack's kDLBool)."""
    return I8 if dtype == "bool" else value_type(dtype)


def dtype_bits(dtype: str) -> int:
    """Bits of a ``dtype`` element in memory."""
    if dtype == "bool":
        return 8
    if dtype in _INT_BITS:
        return _INT_BITS[dtype]
    value_type(dtype)  # raises for an unsupported dtype
    return {"float16": 16, "float32": 32}.get(dtype, 64)


def is_unsigned(dtype: str) -> bool:
    return dtype.startswith("uint") or dtype == "bool"


def int_const(value: int, bits: int) -> int:
    """``value`` wrapped into the signed range of ``bits`` (LLVM prints constants signed)."""
    if bits == 1:
        return 1 if value else 0
    half = 1 << (bits - 1)
    return ((value + half) % (1 << bits)) - half


class _Attrs(ir.values.FunctionAttributes):
    """Function attributes that also accept LLVM's newer spellings (``memory(none)``,
    ``"key"="value"`` string attributes) that llvmlite's list does not know."""

    def add(self, name: str) -> None:
        if name in self._known:
            super().add(name)
        else:
            set.add(self, name)


class _LoopID(ir.values.MDValue):
    """A self-referential ``!llvm.loop`` node (LangRef: "Loop metadata nodes")."""

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


class ModuleCodegen:
    """One LLVM module being built: declarations, string constants, shared helpers.

    Parameters
    ----------
    name : str
        The module name.
    triple, data_layout : str
        From the target machine (the vectorizer's cost model needs both).
    vector_bits : int
        SIMD width for ``llvm.loop.vectorize.width`` of vectorized loops (0: no hint).
    scalable : bool
        The target has scalable vectors (RVV, SVE): vectorized loops get no fixed width, so
        LLVM may pick a scalable factor (a fixed width would disable scalable vectorization).
    function_attrs : sequence of str
        Attributes for every defined function (e.g. ``"prefer-vector-width"="512"``).
    int8_dot : str
        How vectors of ``dot_u8i8x4`` are emitted (:meth:`kiln.target.Target.int8_dot`): "vnni256",
        "vnni512", "avx512bw", "avx2" or "" (plain integer IR).
    """

    def __init__(self, name: str, triple: str, data_layout: str, vector_bits: int = 0,
                 scalable: bool = False, function_attrs: Sequence[str] = (),
                 int8_dot: str = ""):
        self.module = ir.Module(name=name)
        self.module.triple = triple
        self.module.data_layout = data_layout
        self.vector_bits = vector_bits
        self.scalable = scalable
        self.function_attrs = tuple(function_attrs)
        self.int8_dot = int8_dot
        self._strings: dict[bytes, ir.GlobalVariable] = {}
        self._is_compact: ir.Function | None = None
        self.func_names: list[str] = []

    def add_function(self, func: L.PrimFunc) -> None:
        """Generate the packed function ``func`` (and its helpers).

        Raises
        ------
        CompileError
            If ``func`` was not passed through MakePackedAPI or uses an unsupported construct;
            the message names the kernel.
        """
        if not func.attrs.get("packed"):
            raise CompileError(f"LLVM codegen: {func.name} needs MakePackedAPI first")
        if func.name in self.module.globals:
            raise CompileError(f"LLVM codegen: two kernels named {func.name}")
        from kiln.codegen.llvm.func import FuncCodegen  # (it imports this file)

        try:
            FuncCodegen(self, func).emit()
        except CompileError as err:
            msg = str(err)
            raise CompileError(msg if func.name in msg else f"{func.name}: {msg}") from None
        except Exception as err:  # a codegen bug, but name the kernel the user can report
            raise CompileError(f"LLVM codegen of {func.name} failed: {type(err).__name__}: "
                               f"{err}") from err
        self.func_names.append(func.name)

    def define(self, name: str, ret: ir.Type, args: Sequence[ir.Type],
               internal: bool = True) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(ret, list(args)), name)
        fn.attributes = _Attrs(["nounwind", *self.function_attrs])
        if internal:
            fn.linkage = "internal"
        return fn

    def declare(self, name: str, ret: ir.Type, args: Sequence[ir.Type], var_arg: bool = False,
                attrs: Sequence[str] = ("nounwind",)) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, list(args), var_arg=var_arg),
                             name)
            fn.attributes = _Attrs(attrs)
        return fn

    def intrinsic(self, name: str, ty: ir.Type) -> ir.Function:
        return self.module.declare_intrinsic(name, [ty])

    def vector_intrinsic(self, name: str, ty: ir.VectorType, nargs: int) -> ir.Function:
        """``name`` (an overloaded math intrinsic such as ``llvm.exp``) on vectors ``ty``
        (llvmlite's ``declare_intrinsic`` mangles scalar types only)."""
        mangled = f"{name}.v{ty.count}{ty.element.intrinsic_name}"
        return self.declare(mangled, ty, [ty] * nargs, attrs=("nounwind",))

    def cstring(self, text: str) -> ir.GlobalVariable:
        """A private NUL-terminated string constant."""
        data = text.encode() + b"\0"
        g = self._strings.get(data)
        if g is None:
            ty = ir.ArrayType(I8, len(data))
            g = ir.GlobalVariable(self.module, ty, name=f".str.{len(self._strings)}")
            g.linkage = "private"
            g.global_constant = True
            g.unnamed_addr = True
            g.initializer = ir.Constant(ty, bytearray(data))
            g.type = PTR  # referenced as an opaque pointer
            self._strings[data] = g
        return g

    def loop_id(self, props: list[list]) -> ir.values.MDValue:
        """A distinct loop-ID node ``!{self, props...}``."""
        mod = self.module
        nodes = [mod.add_metadata([ir.MetaDataString(mod, p[0]), *p[1:]]) for p in props]
        md = _LoopID(mod, [], name=str(len(mod.metadata)))
        md.operands = (md, *nodes)
        return md

    def is_compact(self) -> ir.Function:
        """``i32 kiln_is_compact(DLTensor*)``: strides NULL, or row-major compact (dimensions of
        extent 1 may have any stride): the C codegen's ``kiln_is_compact``."""
        if self._is_compact is not None:
            return self._is_compact
        fn = self.define("kiln_is_compact", I32, [PTR])
        t = fn.args[0]
        entry, walk, step, check, yes, no = (fn.append_basic_block(n) for n in (
            "entry", "walk", "step", "check", "yes", "no"))
        b = ir.IRBuilder(entry)
        strides = b.load(b.gep(t, [I32(0), I32(T_STRIDES)], source_etype=DLTENSOR), typ=PTR)
        ndim = b.sext(b.load(b.gep(t, [I32(0), I32(T_NDIM)], source_etype=DLTENSOR), typ=I32),
                      I64)
        shape = b.load(b.gep(t, [I32(0), I32(T_SHAPE)], source_etype=DLTENSOR), typ=PTR)
        last = b.sub(ndim, I64(1))
        b.cbranch(b.icmp_unsigned("==", strides, ir.Constant(PTR, None)), yes, walk)
        b.position_at_end(walk)
        i = b.phi(I64, "i")
        expect = b.phi(I64, "expect")
        i.add_incoming(last, entry)
        expect.add_incoming(I64(1), entry)
        b.cbranch(b.icmp_signed("<", i, I64(0)), yes, check)
        b.position_at_end(check)
        extent = b.load(b.gep(shape, [i], source_etype=I64), typ=I64)
        stride = b.load(b.gep(strides, [i], source_etype=I64), typ=I64)
        bad = b.and_(b.icmp_signed("!=", extent, I64(1)), b.icmp_signed("!=", stride, expect))
        b.cbranch(bad, no, step)
        b.position_at_end(step)
        i.add_incoming(b.sub(i, I64(1)), step)
        expect.add_incoming(b.mul(expect, extent), step)
        b.branch(walk)
        b.position_at_end(yes)
        b.ret(I32(1))
        b.position_at_end(no)
        b.ret(I32(0))
        self._is_compact = fn
        return fn


class Frame:
    """The LLVM function being filled: its builder, its alloca block, and the values bound to
    loop-IR variables and buffers."""

    def __init__(self, fn: ir.Function, packed: tuple | None = None):
        self.fn = fn
        self.entry = fn.append_basic_block("entry")
        self.builder = ir.IRBuilder(fn.append_basic_block("start"))
        self.vars: dict[L.Var, ir.Value] = {}
        self.bufs: dict[L.Buffer, ir.Value] = {}
        self.packed = packed  # (args, type_codes, num_args) in the packed entry only
        self._err: ir.Value | None = None

    def alloca(self, ty: ir.Type, count: int | None, name: str, align: int = 0) -> ir.Value:
        b = ir.IRBuilder(self.entry)
        ptr = b.alloca(ty, size=None if count is None else I64(count), name=name)
        ptr.type = PTR  # llvmlite types allocas as typed pointers; LLVM 22 has opaque ones
        if align:
            ptr.align = align
        return ptr

    def error_buffer(self) -> ir.Value:
        if self._err is None:
            self._err = self.alloca(ir.ArrayType(I8, ERROR_BUFFER), None, "kiln_err")
        return self._err

    def block(self, name: str) -> ir.Block:
        return self.fn.append_basic_block(name)

    def finish(self) -> None:
        ir.IRBuilder(self.entry).branch(self.fn.blocks[1])
