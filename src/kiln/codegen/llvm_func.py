"""Loop IR → LLVM IR, one packed function at a time (TVM's ``CodeGenLLVM`` and ``CodeGenCPU``,
src/target/llvm/codegen_llvm.cc and codegen_cpu.cc), built with ``llvmlite.ir``.

Each packed PrimFunc ``f`` (after MakePackedAPI) becomes:

- ``f``: the packed-ABI entry (shared reference §3). It runs the leading ``AssertStmt``s (the
  argument checks), checks that every tensor's data is 64-byte aligned (Kiln's NDArrays always
  are; the check turns a foreign unaligned pointer into an error instead of undefined behaviour)
  and calls ``f_compute_`` with the data pointers.
- ``f_compute_``: internal; one ``noalias align 64`` pointer per parameter buffer (the C
  codegen's ``restrict``, TVM's compute scope), so LLVM knows buffers do not overlap.
- per ``parallel`` loop: ``f_parallel<k>``, an ``FTVMParallelLambda`` that unpacks the captured
  pointers and variables from its closure and runs a static chunk of the iterations
  (``[task_id * chunk, (task_id + 1) * chunk)``, chunk = ceil(extent / num_task)) through
  ``f_parallel<k>_body`` (noalias again); the loop itself becomes
  ``TVMBackendParallelLaunch(f_parallel<k>, &closure, 0)`` (TVM's ``CreateParallelLaunch``).

Semantics follow ``kiln.ir.loop_interp``: ``//`` and ``%`` on integers are floor division and
modulo, ``/`` truncates; ``Select`` and ``and``/``or`` whose lazy side may trap (a load or an
integer division) become branches, as C's ``?:``, ``&&`` and ``||``; bool is ``i1`` in registers
and a byte in memory. Float ``+ - *`` carry the ``contract`` flag (FMA allowed, as GCC's default
``-ffp-contract=fast``); nothing is reassociated. Local and small (≤ 1 KiB) allocations are
``alloca``s in the function's entry block so SROA/mem2reg promote them; larger ones use
``TVMBackendAllocWorkspace``.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from kiln.codegen.c import STACK_LIMIT
from kiln.errors import CompileError
from kiln.ir import loop as L
from kiln.passes.loop.make_packed_api import dl_dtype

I1, I8, I16, I32, I64 = (ir.IntType(b) for b in (1, 8, 16, 32, 64))
PTR = ir.PointerType()
F32, F64 = ir.FloatType(), ir.DoubleType()
# DLPack structs, LP64 (shared reference §3): natural layout, DLTensor is 48 bytes.
DLDEVICE = ir.LiteralStructType([I32, I32])
DLDATATYPE = ir.LiteralStructType([I8, I8, I16])
DLTENSOR = ir.LiteralStructType([PTR, DLDEVICE, I32, DLDATATYPE, PTR, PTR, I64])
T_DATA, T_DEVICE, T_NDIM, T_DTYPE, T_SHAPE, T_STRIDES, T_BYTE_OFFSET = range(7)
PARALLEL_ENV = ir.LiteralStructType([PTR, I32])  # TVMParallelGroupEnv {sync_handle, num_task}
TENSOR_ALIGN = 64
ERROR_BUFFER = 512

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64,
             "uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
_LLVM_INTRINSICS = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt",
                    "tanh": "llvm.tanh", "fabs": "llvm.fabs", "floor": "llvm.floor",
                    "ceil": "llvm.ceil", "pow": "llvm.pow"}
_LIBM = {("erf", "float32"): "erff", ("erf", "float64"): "erf"}
_ICMP = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
_PACKED_ARGS = 6


def value_type(dtype: str) -> ir.Type:
    """The LLVM type of a value of ``dtype`` in registers (bool: ``i1``).

    Raises
    ------
    CompileError
        For a dtype the LLVM codegen does not support (float16, like the C codegen).
    """
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
    return 32 if dtype == "float32" else 64


def _unsigned(dtype: str) -> bool:
    return dtype.startswith("uint") or dtype == "bool"


def _int_const(value: int, bits: int) -> int:
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


def _may_trap(e: L.PrimExpr) -> bool:
    """True when evaluating ``e`` speculatively could fault: a load, an integer division, or a
    packed-argument read."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, L.BufferLoad):
            return True
        if isinstance(x, L.Call) and x.name.startswith("kiln."):
            return True
        if isinstance(x, L.Binary) and x.op in ("/", "//", "%") and not L.is_float(x.dtype):
            return True
        stack.extend(L.expr_children(x))
    return False


def _exprs_of(s: L.Stmt) -> list[L.PrimExpr]:
    if isinstance(s, L.For):
        return [s.min, s.extent]
    if isinstance(s, L.BufferStore):
        return [s.value, *s.indices]
    if isinstance(s, L.IfThenElse):
        return [s.cond]
    if isinstance(s, L.AssertStmt):
        return [s.cond, *s.args]
    if isinstance(s, L.Evaluate):
        return [s.value]
    return []


def free_refs(body: L.Stmt) -> tuple[list[L.Buffer], list[L.Var]]:
    """Buffers and variables ``body`` uses but does not define (first use first)."""
    bufs: dict[L.Buffer, None] = {}
    vars_: dict[L.Var, None] = {}
    defined_bufs: set[int] = set()
    defined_vars: set[int] = set()
    for s in L.walk_stmts(body):
        if isinstance(s, L.For):
            defined_vars.add(id(s.var))
        elif isinstance(s, L.Allocate):
            defined_bufs.add(id(s.buffer))
        elif isinstance(s, L.BufferStore):
            bufs.setdefault(s.buffer)
        stack = _exprs_of(s)
        while stack:
            x = stack.pop()
            if isinstance(x, L.Var):
                vars_.setdefault(x)
            elif isinstance(x, L.BufferLoad):
                bufs.setdefault(x.buffer)
            stack.extend(L.expr_children(x))
    return ([b for b in bufs if id(b) not in defined_bufs],
            [v for v in vars_ if id(v) not in defined_vars])


def _max_bits(body: L.Stmt) -> int:
    """Widest element stored or loaded in ``body`` (sets the vectorization factor)."""
    bits = 8
    for s in L.walk_stmts(body):
        if isinstance(s, L.BufferStore):
            bits = max(bits, dtype_bits(s.buffer.dtype))
        stack = _exprs_of(s)
        while stack:
            x = stack.pop()
            if isinstance(x, L.BufferLoad):
                bits = max(bits, dtype_bits(x.dtype))
            stack.extend(L.expr_children(x))
    return bits


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
    """

    def __init__(self, name: str, triple: str, data_layout: str, vector_bits: int = 0,
                 scalable: bool = False, function_attrs: Sequence[str] = ()):
        self.module = ir.Module(name=name)
        self.module.triple = triple
        self.module.data_layout = data_layout
        self.vector_bits = vector_bits
        self.scalable = scalable
        self.function_attrs = tuple(function_attrs)
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
        try:
            FuncCodegen(self, func).emit()
        except CompileError as err:
            msg = str(err)
            raise CompileError(msg if func.name in msg else f"{func.name}: {msg}") from None
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


class _Frame:
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


class FuncCodegen:
    """The LLVM functions of one packed PrimFunc (see the module docstring)."""

    def __init__(self, mc: ModuleCodegen, func: L.PrimFunc):
        self.mc = mc
        self.func = func
        self.n_parallel = 0

    # -------------------------------------------------------------------------- functions
    def emit(self) -> None:
        f, mc = self.func, self.mc
        names = f.attrs.get("arg_names") or [b.name for b in f.params]
        entry = mc.define(f.name, I32, [PTR, PTR, I32, PTR, PTR, PTR], internal=False)
        for arg, name in zip(entry.args, ("args", "type_codes", "num_args", "out_ret_value",
                                          "out_ret_tcode", "resource_handle")):
            arg.name = name
        fr = _Frame(entry, packed=tuple(entry.args[:3]))
        body = f.body
        while isinstance(body, L.AssertStmt):
            self.assert_stmt(fr, body)
            body = body.body
        b = fr.builder
        ptrs = []
        for i, buf in enumerate(f.params):
            t = self.arg_tensor(fr, i)
            data = b.load(b.gep(t, [I32(0), I32(T_DATA)], source_etype=DLTENSOR), typ=PTR)
            off = b.load(b.gep(t, [I32(0), I32(T_BYTE_OFFSET)], source_etype=DLTENSOR),
                         typ=I64)
            ptr = b.gep(data, [off], source_etype=I8, name=buf.name)
            low = b.and_(b.ptrtoint(ptr, I64), I64(TENSOR_ALIGN - 1))
            self.check(fr, b.icmp_unsigned("==", low, I64(0)),
                       f"{f.name}: argument {i} ({names[i]}): data pointer is not "
                       f"{TENSOR_ALIGN}-byte aligned (LLVM kernels require aligned tensors)")
            ptrs.append(ptr)
        compute, cfr, _ = self.outline(f"{f.name}_compute_", list(f.params), [], [])
        self.stmt(cfr, body)
        cfr.builder.ret(I32(0))
        cfr.finish()
        b.ret(b.call(compute, ptrs))
        fr.finish()

    def outline(self, name: str, bufs: list[L.Buffer], vars_: list[L.Var],
                extra: list[ir.Type]) -> tuple[ir.Function, _Frame, list[ir.Argument]]:
        """An internal function over ``bufs`` (noalias, 64-byte aligned), ``vars_`` and
        ``extra`` arguments, returning i32; its frame binds the buffers and variables."""
        fn = self.mc.define(name, I32, [PTR] * len(bufs) + [value_type(v.dtype) for v in vars_]
                            + list(extra))
        fr = _Frame(fn)
        for arg, buf in zip(fn.args, bufs):
            arg.name = buf.name
            arg.add_attribute("noalias")
            arg.attributes.align = TENSOR_ALIGN
            fr.bufs[buf] = arg
        for arg, var in zip(fn.args[len(bufs):], vars_):
            arg.name = var.name
            fr.vars[var] = arg
        return fn, fr, list(fn.args[len(bufs) + len(vars_):])

    # -------------------------------------------------------------------------- statements
    def stmt(self, fr: _Frame, s: L.Stmt) -> None:
        if isinstance(s, L.For):
            if s.kind == "parallel":
                self.parallel_for(fr, s)
            else:
                self.serial_for(fr, s)
        elif isinstance(s, L.BufferStore):
            value = self.expr(fr, s.value)
            if s.buffer.dtype == "bool":
                value = fr.builder.zext(value, I8)
            fr.builder.store(value, self.address(fr, s.buffer, s.indices))
        elif isinstance(s, L.SeqStmt):
            for x in s.stmts:
                self.stmt(fr, x)
        elif isinstance(s, L.Allocate):
            self.allocate(fr, s)
        elif isinstance(s, L.IfThenElse):
            self.if_then_else(fr, s)
        elif isinstance(s, L.AssertStmt):
            self.assert_stmt(fr, s)
            self.stmt(fr, s.body)
        elif isinstance(s, L.Evaluate):
            self.expr(fr, s.value)
        else:
            raise CompileError(f"LLVM codegen: unknown statement {type(s).__name__}")

    def serial_for(self, fr: _Frame, s: L.For) -> None:
        lo = self.expr(fr, s.min)
        end = self.expr(fr, s.extent)
        if not (isinstance(s.min, L.IntImm) and s.min.value == 0):
            end = fr.builder.add(lo, end, flags=self._nsw(s.var.dtype))
        md = None
        if s.kind == "unrolled":
            md = self.mc.loop_id([["llvm.loop.unroll.full"]])
        elif s.kind == "vectorized":
            props: list[list] = [["llvm.loop.vectorize.enable", I1(1)]]
            lanes = self.mc.vector_bits // _max_bits(s.body)
            if lanes > 1 and not self.mc.scalable and not (isinstance(s.extent, L.IntImm) and s.extent.value < lanes):
                props.append(["llvm.loop.vectorize.width", I32(lanes)])
            md = self.mc.loop_id(props)
        self.loop(fr, s.var, lo, end, lambda: self.stmt(fr, s.body), md)

    def loop(self, fr: _Frame, var: L.Var, lo: ir.Value, end: ir.Value, body, md=None) -> None:
        """``for (var = lo; var < end; ++var) body()``; ``md`` goes on the back edge."""
        b = fr.builder
        pre = b.block
        head, loop_body, done = fr.block(f"{var.name}.head"), fr.block(f"{var.name}.body"), \
            fr.block(f"{var.name}.done")
        b.branch(head)
        b.position_at_end(head)
        iv = b.phi(lo.type, name=var.name)
        iv.add_incoming(lo, pre)
        signed = not _unsigned(var.dtype)
        cmp = b.icmp_signed if signed else b.icmp_unsigned
        b.cbranch(cmp("<", iv, end), loop_body, done)
        b.position_at_end(loop_body)
        fr.vars[var] = iv
        body()
        del fr.vars[var]
        nxt = b.add(iv, ir.Constant(lo.type, 1), flags=self._nsw(var.dtype))
        back = b.branch(head)
        if md is not None:
            back.set_metadata("llvm.loop", md)
        iv.add_incoming(nxt, b.block)
        b.position_at_end(done)

    def parallel_for(self, fr: _Frame, s: L.For) -> None:
        mc, b = self.mc, fr.builder
        bufs, vars_ = free_refs(s.body)
        vars_ = [v for v in vars_ if v is not s.var]
        for buf in bufs:
            if buf not in fr.bufs:
                raise CompileError(f"LLVM codegen: buffer {buf.name} is used outside its "
                                   "allocation")
        if s.var.dtype != L.INT:
            raise CompileError(f"LLVM codegen: parallel loop {s.var.name} must have an int64 "
                               f"variable, not {s.var.dtype}")
        name = f"{self.func.name}_parallel{self.n_parallel}"
        self.n_parallel += 1
        # The chunk: for var in [lo + begin, lo + end).
        body_fn, bfr, (lo_a, begin_a, end_a) = self.outline(f"{name}_body", bufs, vars_,
                                                            [I64, I64, I64])
        bb = bfr.builder
        start = bb.add(lo_a, begin_a, flags=("nsw",))
        stop = bb.add(lo_a, end_a, flags=("nsw",))
        self.loop(bfr, s.var, start, stop, lambda: self.stmt(bfr, s.body))
        bb.ret(I32(0))
        bfr.finish()
        # The lambda: unpack the closure, compute this task's chunk, run it.
        closure_ty = ir.LiteralStructType([PTR] * len(bufs) + [value_type(v.dtype)
                                                                for v in vars_] + [I64, I64])
        lam = mc.define(name, I32, [I32, PTR, PTR])
        task_id, penv, cdata = lam.args
        task_id.name, penv.name, cdata.name = "task_id", "penv", "cdata"
        lfr = _Frame(lam)
        lb = lfr.builder
        fields = [lb.load(lb.gep(cdata, [I32(0), I32(k)], source_etype=closure_ty),
                          typ=closure_ty.elements[k]) for k in range(len(closure_ty.elements))]
        lo, n = fields[-2], fields[-1]
        num_task = lb.sext(lb.load(lb.gep(penv, [I32(0), I32(1)], source_etype=PARALLEL_ENV),
                                   typ=I32), I64)
        chunk = lb.sdiv(lb.add(n, lb.sub(num_task, I64(1))), num_task)
        begin = self._smin(lb, lb.mul(lb.sext(task_id, I64), chunk), n)
        end = self._smin(lb, lb.add(begin, chunk), n)
        lb.ret(lb.call(body_fn, [*fields[:-2], lo, begin, end]))
        lfr.finish()
        # The launch.
        cl = fr.alloca(closure_ty, None, f"{name}_closure")
        lo_v = self._to_i64(fr, self.expr(fr, s.min), s.min.dtype)
        n_v = self._to_i64(fr, self.expr(fr, s.extent), s.extent.dtype)
        values = [fr.bufs[x] for x in bufs] + [fr.vars[v] for v in vars_] + [lo_v, n_v]
        for k, v in enumerate(values):
            b.store(v, b.gep(cl, [I32(0), I32(k)], source_etype=closure_ty))
        launch = mc.declare("TVMBackendParallelLaunch", I32, [PTR, PTR, I32])
        rc = b.call(launch, [lam, cl, I32(0)])
        failed, ok = fr.block(f"{name}.failed"), fr.block(f"{name}.ok")
        b.cbranch(b.icmp_signed("!=", rc, I32(0)), failed, ok)
        b.position_at_end(failed)
        b.ret(I32(-1))  # the task's message is already the caller's error
        b.position_at_end(ok)

    def allocate(self, fr: _Frame, s: L.Allocate) -> None:
        buf, b = s.buffer, fr.builder
        ty = memory_type(buf.dtype)
        nbytes = buf.size * max(1, dtype_bits(buf.dtype) // 8)
        if buf.scope == "local" or nbytes <= STACK_LIMIT:
            fr.bufs[buf] = fr.alloca(ty, buf.size, buf.name, align=TENSOR_ALIGN)
            self.stmt(fr, s.body)
            del fr.bufs[buf]
            return
        alloc = self.mc.declare("TVMBackendAllocWorkspace", PTR, [I32, I32, I64, I32, I32])
        free = self.mc.declare("TVMBackendFreeWorkspace", I32, [I32, I32, PTR])
        code, bits = dl_dtype(buf.dtype)
        ptr = b.call(alloc, [I32(1), I32(0), I64(nbytes), I32(code), I32(bits)], name=buf.name)
        self.check(fr, b.icmp_unsigned("!=", ptr, ir.Constant(PTR, None)),
                   f"{self.func.name}: cannot allocate {nbytes} bytes of workspace for "
                   f"{buf.name}")
        fr.bufs[buf] = ptr
        self.stmt(fr, s.body)
        del fr.bufs[buf]
        fr.builder.call(free, [I32(1), I32(0), ptr])

    def if_then_else(self, fr: _Frame, s: L.IfThenElse) -> None:
        b = fr.builder
        cond = self.to_bool(fr, self.expr(fr, s.cond), s.cond.dtype)
        then, done = fr.block("if.then"), fr.block("if.done")
        other = fr.block("if.else") if s.else_case is not None else done
        b.cbranch(cond, then, other)
        b.position_at_end(then)
        self.stmt(fr, s.then_case)
        b.branch(done)
        if s.else_case is not None:
            b.position_at_end(other)
            self.stmt(fr, s.else_case)
            b.branch(done)
        b.position_at_end(done)

    def assert_stmt(self, fr: _Frame, s: L.AssertStmt) -> None:
        cond = self.to_bool(fr, self.expr(fr, s.cond), s.cond.dtype)
        self.check(fr, cond, s.message, s.args)

    def check(self, fr: _Frame, cond: ir.Value, message: str,
              args: Sequence[L.PrimExpr] = ()) -> None:
        """Continue if ``cond``; else set the error ``message`` (printf-formatted with
        ``args`` as long long) and return -1."""
        b, mc = fr.builder, self.mc
        ok, fail = fr.block("check.ok"), fr.block("check.fail")
        br = b.cbranch(cond, ok, fail)
        br.set_weights([1 << 20, 1])
        b.position_at_end(fail)
        set_error = mc.declare("TVMAPISetLastError", ir.VoidType(), [PTR])
        fmt = mc.cstring(message)
        if args or "%" in message:
            buf = fr.error_buffer()
            snprintf = mc.declare("snprintf", I32, [PTR, I64, PTR], var_arg=True)
            values = [self._to_i64(fr, self.expr(fr, a), a.dtype) for a in args]
            b.call(snprintf, [buf, I64(ERROR_BUFFER), fmt, *values])
            b.call(set_error, [buf])
        else:
            b.call(set_error, [fmt])
        b.ret(I32(-1))
        b.position_at_end(ok)

    # -------------------------------------------------------------------------- expressions
    def expr(self, fr: _Frame, e: L.PrimExpr) -> ir.Value:
        if isinstance(e, L.Var):
            try:
                return fr.vars[e]
            except KeyError:
                raise CompileError(f"LLVM codegen: variable {e.name} is used outside its "
                                   "loop") from None
        if isinstance(e, L.IntImm):
            ty = value_type(e.dtype)
            return ir.Constant(ty, _int_const(e.value, ty.width))
        if isinstance(e, L.FloatImm):
            return ir.Constant(value_type(e.dtype), e.value)
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

    def address(self, fr: _Frame, buf: L.Buffer, indices: list[L.PrimExpr]) -> ir.Value:
        """Row-major element address (C codegen's ``access``)."""
        base = fr.bufs.get(buf)
        if base is None:
            raise CompileError(f"LLVM codegen: buffer {buf.name} is used outside its "
                               "allocation")
        b = fr.builder
        offset = None
        stride = 1
        for extent, idx in zip(reversed(buf.shape), reversed(indices)):
            if not (isinstance(idx, L.IntImm) and idx.value == 0):
                term = self._to_i64(fr, self.expr(fr, idx), idx.dtype)
                if stride != 1:
                    term = b.mul(term, I64(stride), flags=("nsw",))
                offset = term if offset is None else b.add(offset, term, flags=("nsw",))
            stride *= extent
        if offset is None:
            return base
        return b.gep(base, [offset], inbounds=True, source_etype=memory_type(buf.dtype))

    def binary(self, fr: _Frame, e: L.Binary) -> ir.Value:
        if e.op in ("and", "or"):
            return self.logical(fr, e)
        b, op, dt = fr.builder, e.op, e.a.dtype
        x, y = self.expr(fr, e.a), self.expr(fr, e.b)
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
            unsigned = _unsigned(dt)
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

    def logical(self, fr: _Frame, e: L.Binary) -> ir.Value:
        b = fr.builder
        x = self.to_bool(fr, self.expr(fr, e.a), e.a.dtype)
        if not _may_trap(e.b):
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

    def select(self, fr: _Frame, e: L.Select) -> ir.Value:
        b = fr.builder
        cond = self.to_bool(fr, self.expr(fr, e.cond), e.cond.dtype)
        if not (_may_trap(e.true_value) or _may_trap(e.false_value)):
            return b.select(cond, self.expr(fr, e.true_value), self.expr(fr, e.false_value))
        # Only the chosen side is evaluated (C's ?:): a guarded load must not run out of bounds.
        # SimplifyCFG turns this back into a select where speculation is safe.
        then, other, done = fr.block("sel.true"), fr.block("sel.false"), fr.block("sel.done")
        b.cbranch(cond, then, other)
        b.position_at_end(then)
        tv = self.expr(fr, e.true_value)
        then_end = b.block
        b.branch(done)
        b.position_at_end(other)
        fv = self.expr(fr, e.false_value)
        other_end = b.block
        b.branch(done)
        b.position_at_end(done)
        phi = b.phi(tv.type)
        phi.add_incoming(tv, then_end)
        phi.add_incoming(fv, other_end)
        return phi

    def cast(self, fr: _Frame, v: ir.Value, src: str, dst: str) -> ir.Value:
        b = fr.builder
        if src == dst:
            return v
        if dst == "bool":
            return self.to_bool(fr, v, src)
        to = value_type(dst)
        if L.is_float(src):
            if L.is_float(dst):
                return b.fpext(v, to) if dtype_bits(dst) > dtype_bits(src) else b.fptrunc(v, to)
            return b.fptoui(v, to) if _unsigned(dst) else b.fptosi(v, to)
        if L.is_float(dst):
            return b.uitofp(v, to) if _unsigned(src) else b.sitofp(v, to)
        width = 1 if src == "bool" else v.type.width
        if to.width == width:
            return v
        if to.width < width:
            return b.trunc(v, to)
        return b.zext(v, to) if _unsigned(src) else b.sext(v, to)

    def to_bool(self, fr: _Frame, v: ir.Value, dtype: str) -> ir.Value:
        if dtype == "bool":
            return v
        if L.is_float(dtype):
            return fr.builder.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
        return fr.builder.icmp_unsigned("!=", v, ir.Constant(v.type, 0))

    def call(self, fr: _Frame, e: L.Call) -> ir.Value:
        if e.name.startswith("kiln."):
            return self.accessor(fr, e)
        if not L.is_float(e.dtype) or e.name not in L.INTRINSICS:
            raise CompileError(f"LLVM codegen: intrinsic {e.name} on {e.dtype} is not "
                               "supported")
        args = [self.expr(fr, a) for a in e.args]
        ty = value_type(e.dtype)
        libm = _LIBM.get((e.name, e.dtype))
        if libm is not None:
            fn = self.mc.declare(libm, ty, [ty] * len(args),
                                 attrs=("nounwind", "willreturn", "memory(none)"))
        else:
            fn = self.mc.intrinsic(_LLVM_INTRINSICS[e.name], ty)
        return fr.builder.call(fn, args)

    # -------------------------------------------------------------------------- packed API
    def arg_tensor(self, fr: _Frame, i: int) -> ir.Value:
        """``(DLTensor*)args[i].v_handle``."""
        b = fr.builder
        args = self._packed(fr)[0]
        return b.load(b.gep(args, [I64(i)], source_etype=I64), typ=PTR)

    def accessor(self, fr: _Frame, e: L.Call) -> ir.Value:
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
        if field == "arg_compact":
            return b.sext(b.call(self.mc.is_compact(), [self.arg_tensor(fr, idx[0])]), I64)
        raise CompileError(f"LLVM codegen: unknown packed accessor {e.name}")

    def _packed(self, fr: _Frame) -> tuple:
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

    def _to_i64(self, fr: _Frame, v: ir.Value, dtype: str) -> ir.Value:
        """``v`` (of ``dtype``) as an i64."""
        if v.type == I64:
            return v
        if L.is_float(dtype):
            return fr.builder.fptosi(v, I64)
        return self.cast(fr, v, dtype, "int64")

    @staticmethod
    def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
        return b.select(b.icmp_signed("<", x, y), x, y)
