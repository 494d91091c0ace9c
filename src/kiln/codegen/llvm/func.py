"""Loop IR → LLVM IR, one packed function at a time (TVM's ``CodeGenLLVM`` and ``CodeGenCPU``,
src/target/llvm/codegen_llvm.cc and codegen_cpu.cc), built with ``llvmlite.ir``.

Each packed PrimFunc ``f`` (after MakePackedAPI) becomes:

- ``f``: the packed-ABI entry (docs/formats.md §3.3). It runs the leading ``AssertStmt``s (the
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

Loops: ``serial`` loops are plain (``llvm.loop.unroll.disable`` around a register block or
over the rows of a scalar min / max nest); ``vectorized`` ones carry
``llvm.loop.vectorize.enable`` and, on fixed-width SIMD targets when the extent allows,
``llvm.loop.vectorize.width`` = the target's lanes for the loop's widest element; ``unrolled``
ones ``llvm.loop.unroll.full``. Local and small (≤ 1 KiB) allocations are ``alloca``s in the
function's entry block so SROA/mem2reg promote them; larger ones use
``TVMBackendAllocWorkspace``/``TVMBackendFreeWorkspace``. Expressions:
:mod:`kiln.codegen.llvm.expr`.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from kiln.codegen.c.source import STACK_LIMIT
from kiln.codegen.llvm.expr import ExprCodegen
from kiln.codegen.llvm.ir import (
    DLTENSOR,
    ERROR_BUFFER,
    I1,
    I8,
    I32,
    I64,
    PARALLEL_ENV,
    PTR,
    T_BYTE_OFFSET,
    T_DATA,
    TENSOR_ALIGN,
    Frame,
    ModuleCodegen,
    dtype_bits,
    is_unsigned,
    memory_type,
    value_type,
)
from kiln.codegen.llvm.vector import VectorLoopCodegen
from kiln.codegen.outline import free_refs
from kiln.errors import CompileError
from kiln.tir import loop as L
from kiln.tir.transform.make_packed_api import dl_dtype, split_prologue


def _max_bits(body: L.Stmt) -> int:
    """Widest element stored or loaded in ``body`` (sets the vectorization factor)."""
    bits = 8
    for s in L.walk_stmts(body):
        if isinstance(s, L.BufferStore):
            bits = max(bits, dtype_bits(s.buffer.dtype))
        for x in L.walk_exprs(L.stmt_exprs(s)):
            if isinstance(x, L.BufferLoad):
                bits = max(bits, dtype_bits(x.dtype))
    return bits


def _holds_register_block(body: L.Stmt) -> bool:
    """Whether ``body`` contains an unrolled loop (a schedule's register block)."""
    return any(isinstance(x, L.For) and x.kind == "unrolled" for x in L.walk_stmts(body))


def _min_max_chain(body: L.Stmt) -> bool:
    """Whether ``body`` is ``acc[0] = min(acc[0], x)`` (or max) into a one-element local
    accumulator."""
    return (isinstance(body, L.BufferStore) and body.buffer.scope == "local"
            and body.buffer.shape == (1,) and isinstance(body.value, L.Binary)
            and body.value.op in ("min", "max") and isinstance(body.value.a, L.BufferLoad)
            and body.value.a.buffer is body.buffer)


def _min_max_rows(body: L.Stmt) -> set[int]:
    """The ids of the innermost loops of serial nests around a min / max chain (``for r0: for
    r1: acc[0] = max(acc[0], x)``): a reduction over several axes left scalar, its rows too
    short for the vector partial results of
    :func:`kiln.schedules.reduce_rfactor.vectorize_reductions`."""
    return {id(s.body) for s in L.walk_stmts(body)
            if isinstance(s, L.For) and s.kind == "serial" and isinstance(s.body, L.For)
            and s.body.kind == "serial" and _min_max_chain(s.body.body)}


class FuncCodegen(VectorLoopCodegen, ExprCodegen):
    """The LLVM functions of one packed PrimFunc (see the module docstring)."""

    def __init__(self, mc: ModuleCodegen, func: L.PrimFunc):
        self.mc = mc
        self.func = func
        self.n_parallel = 0
        self.min_max_rows = _min_max_rows(func.body)

    # -------------------------------------------------------------------------- functions
    def emit(self) -> None:
        f, mc = self.func, self.mc
        names = f.attrs.get("arg_names") or [b.name for b in f.params]
        entry = mc.define(f.name, I32, [PTR, PTR, I32, PTR, PTR, PTR], internal=False)
        for arg, name in zip(entry.args, ("args", "type_codes", "num_args", "out_ret_value",
                                          "out_ret_tcode", "resource_handle")):
            arg.name = name
        fr = Frame(entry, packed=tuple(entry.args[:3]))
        prologue, body = split_prologue(f)
        symbols: list[L.Var] = []  # shape symbols bound by the prologue, passed to the compute
        for s in prologue:
            if isinstance(s, L.LetStmt):
                fr.vars[s.var] = self.expr(fr, s.value)
                symbols.append(s.var)
            else:
                self.assert_stmt(fr, s)
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
        compute, cfr, _ = self.outline(f"{f.name}_compute_", list(f.params), symbols, [])
        self.stmt(cfr, body)
        cfr.builder.ret(I32(0))
        cfr.finish()
        b.ret(b.call(compute, ptrs + [fr.vars[v] for v in symbols]))
        fr.finish()

    def outline(self, name: str, bufs: list[L.Buffer], vars_: list[L.Var],
                extra: list[ir.Type]) -> tuple[ir.Function, Frame, list[ir.Argument]]:
        """An internal function over ``bufs`` (noalias, 64-byte aligned), ``vars_`` and
        ``extra`` arguments, returning i32; its frame binds the buffers and variables."""
        fn = self.mc.define(name, I32, [PTR] * len(bufs) + [value_type(v.dtype) for v in vars_]
                            + list(extra))
        fr = Frame(fn)
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
    def stmt(self, fr: Frame, s: L.Stmt) -> None:
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
        elif isinstance(s, L.LetStmt):
            fr.vars[s.var] = self.expr(fr, s.value)
            self.stmt(fr, s.body)
        elif isinstance(s, L.Evaluate):
            self.expr(fr, s.value)
        else:
            raise CompileError(f"LLVM codegen: unknown statement {type(s).__name__}")

    def serial_for(self, fr: Frame, s: L.For) -> None:
        if s.kind == "vectorized" and not self.mc.scalable \
                and self.vector_for(fr, s, self.mc.vector_bits):
            return
        lo = self.expr(fr, s.min)
        end = self.expr(fr, s.extent)
        if not (isinstance(s.min, L.IntImm) and s.min.value == 0):
            end = fr.builder.add(lo, end, flags=self._nsw(s.var.dtype))
        md = None
        if s.kind == "unrolled":
            md = self.mc.loop_id([["llvm.loop.unroll.full"]])
        elif s.kind == "serial" and _holds_register_block(s.body):
            # The block inside already fills the registers: unrolling this loop too (LLVM does
            # for short trip counts, e.g. a 3x3 window) keeps loaded values alive across
            # iterations and spills (depthwise convolutions ran ~15% slower).
            md = self.mc.loop_id([["llvm.loop.unroll.disable"]])
        elif s.kind == "serial" and id(s) in self.min_max_rows:
            # Each update waits for the previous one: unrolling gains nothing, and LLVM's
            # optimizer took minutes over 8 rows of 32 unrolled (openWakeWord's ReduceMax
            # over [1, 1, 8, 32]: 120 s of LLVM CPU in a 5 s build; 8 rows of 16 or 64, or
            # one row of 256, took 0.05 s).
            md = self.mc.loop_id([["llvm.loop.unroll.disable"]])
        elif s.kind == "vectorized":
            props: list[list] = [["llvm.loop.vectorize.enable", I1(1)]]
            lanes = self.mc.vector_bits // _max_bits(s.body)
            short = isinstance(s.extent, L.IntImm) and s.extent.value < lanes
            if lanes > 1 and not self.mc.scalable and not short:
                props.append(["llvm.loop.vectorize.width", I32(lanes)])
            md = self.mc.loop_id(props)
        self.loop(fr, s.var, lo, end, lambda: self.stmt(fr, s.body), md)

    def loop(self, fr: Frame, var: L.Var, lo: ir.Value, end: ir.Value, body, md=None) -> None:
        """``for (var = lo; var < end; ++var) body()``; ``md`` goes on the back edge."""
        b = fr.builder
        pre = b.block
        head, loop_body, done = fr.block(f"{var.name}.head"), fr.block(f"{var.name}.body"), \
            fr.block(f"{var.name}.done")
        b.branch(head)
        b.position_at_end(head)
        iv = b.phi(lo.type, name=var.name)
        iv.add_incoming(lo, pre)
        signed = not is_unsigned(var.dtype)
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

    def parallel_for(self, fr: Frame, s: L.For) -> None:
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
        lfr = Frame(lam)
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

    def allocate(self, fr: Frame, s: L.Allocate) -> None:
        buf, b = s.buffer, fr.builder
        ty = memory_type(buf.dtype)
        itemsize = max(1, dtype_bits(buf.dtype) // 8)
        if not buf.is_static:  # a symbolic size: workspace, sized at run time
            self._workspace(fr, s, b.mul(self.expr(fr, buf.size_expr()), I64(itemsize)))
            return
        nbytes = buf.size * itemsize
        if buf.scope == "local" or nbytes <= STACK_LIMIT:
            fr.bufs[buf] = fr.alloca(ty, buf.size, buf.name, align=TENSOR_ALIGN)
            self.stmt(fr, s.body)
            del fr.bufs[buf]
            return
        self._workspace(fr, s, I64(nbytes), f"{nbytes} bytes of ")

    def _workspace(self, fr: Frame, s: L.Allocate, nbytes: ir.Value, size: str = "") -> None:
        """``s``'s buffer from TVMBackendAllocWorkspace (``nbytes``: an i64; ``size`` the
        static size for the error message), freed after."""
        buf, b = s.buffer, fr.builder
        alloc = self.mc.declare("TVMBackendAllocWorkspace", PTR, [I32, I32, I64, I32, I32])
        free = self.mc.declare("TVMBackendFreeWorkspace", I32, [I32, I32, PTR])
        code, bits = dl_dtype(buf.dtype)
        ptr = b.call(alloc, [I32(1), I32(0), nbytes, I32(code), I32(bits)], name=buf.name)
        self.check(fr, b.icmp_unsigned("!=", ptr, ir.Constant(PTR, None)),
                   f"{self.func.name}: cannot allocate {size}workspace for {buf.name}")
        fr.bufs[buf] = ptr
        self.stmt(fr, s.body)
        del fr.bufs[buf]
        fr.builder.call(free, [I32(1), I32(0), ptr])

    def if_then_else(self, fr: Frame, s: L.IfThenElse) -> None:
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

    def assert_stmt(self, fr: Frame, s: L.AssertStmt) -> None:
        cond = self.to_bool(fr, self.expr(fr, s.cond), s.cond.dtype)
        self.check(fr, cond, s.message, s.args)

    def check(self, fr: Frame, cond: ir.Value, message: str,
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
