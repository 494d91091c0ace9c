"""Compile a fused graph function to VM bytecode (TVM's ``relax.build`` → ``VMExecutable``).

The program of ``main`` (docs/decisions/014-vm-executable.md):

1. ``vm.builtin.match_shape`` per input: checks dtype and rank, binds each shape symbol to its
   heap slot at its first occurrence and checks the later ones;
2. one ``vm.builtin.shape_compute`` for every derived dim the function needs (intermediate
   shapes, the arena's offsets and size), each distinct expression once (:class:`ShapeHeap`);
3. one ``vm.builtin.alloc_storage`` of the arena that holds every intermediate tensor, at
   offsets planned here from the symbolic sizes (:func:`plan_arena`: tensors whose lifetimes do
   not overlap share a slot, sized by the symbolic max of its tenants);
4. per fused kernel, ``vm.builtin.alloc_tensor`` of its output and a destination-passing call
   (shape symbols the kernel cannot read from its tensors follow as heap arguments);
5. ``Ret`` of the output (``vm.builtin.make_tuple`` of several).

A static model compiles the same way: every dim is an immediate and the heap program is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.errors import CompileError
from kiln.ir import arith
from kiln.ir.arith import Dim, SymVar
from kiln.ir.graph import Constant, Expr, Function, PrimitiveCall, TupleGetItem, Var, post_order
from kiln.passes.loop.make_packed_api import dl_dtype
from kiln.runtime.ndarray import array
from kiln.runtime.vm_format import KIND_PACKED, KIND_VM, Sym, TensorSig, VMFunction

# Instruction opcodes and argument kinds (decision 014).
OP_CALL, OP_RET, OP_GOTO, OP_IF = 1, 2, 3, 4
ARG_REG, ARG_IMM, ARG_CONST, ARG_FUNC, ARG_HEAP = 0, 1, 2, 3, 4
#: shape-program opcodes
SHAPE_OPS = {"add": 0, "sub": 1, "mul": 2, "floordiv": 3, "floormod": 4, "min": 5, "max": 6}
#: match-spec dim kinds
MATCH_EQUAL, MATCH_BIND, MATCH_CHECK = 0, 1, 2
#: byte alignment of every tensor in the arena (NDArray's alignment)
ALIGN = 64


def encode_arg(kind: int, value: int) -> int:
    """One argument word: the kind in bits 63..56, the value in the low 56 bits (two's
    complement, sign-extended when read)."""
    return (kind << 56) | (int(value) & ((1 << 56) - 1))


@dataclass
class Program:
    """What the bytecode compiler produces: the parts of a ``VMExecutable``."""

    symbols: list[SymVar]
    functions: list[VMFunction] = field(default_factory=list)
    constants: list = field(default_factory=list)
    code: list[int] = field(default_factory=list)


class ShapeHeap:
    """Heap slots of the symbols and of every derived dim, with the program computing them.

    Slots ``0 .. len(symbols)-1`` are the symbols; :meth:`operand` gives a dim as an immediate
    (an int) or the slot of its expression, emitting the program's operations on first use so
    that each distinct subexpression is computed once."""

    def __init__(self, symbols: list[SymVar]):
        self.slots: dict[Dim, int] = {s: k for k, s in enumerate(symbols)}
        self.size = len(symbols)
        self.program: list[int] = []

    def operand(self, d: Dim) -> tuple[int, int]:
        """(kind, value) for the shape program: (1, int) or (0, slot)."""
        if isinstance(d, int):
            return 1, d
        return 0, self.slot(d)

    def arg(self, d: Dim) -> int:
        """A bytecode argument word for ``d``: an immediate or a heap slot."""
        kind, value = self.operand(d)
        return encode_arg(ARG_IMM if kind == 1 else ARG_HEAP, value)

    def slot(self, d: arith.SymExpr) -> int:
        if d in self.slots:
            return self.slots[d]
        if isinstance(d, SymVar):
            raise CompileError(f"symbol {d.name} is not bound by any input of the model")
        op, a, b = _decompose(d)
        ka, va = self.operand(a)
        kb, vb = self.operand(b)
        dst = self.size
        self.size += 1
        self.program += [SHAPE_OPS[op], dst, ka, va, kb, vb]
        self.slots[d] = dst
        return dst


def _decompose(d: arith.SymExpr) -> tuple[str, Dim, Dim]:
    """``d`` as one operation over smaller dims."""
    if isinstance(d, arith.SymOp):
        return d.op, d.args[0], d.args[1]
    assert isinstance(d, arith.Poly), f"unexpected dim {d!r}"
    if d.const:
        return "add", arith.sub(d, d.const), d.const
    if len(d.terms) > 1:
        (mono, coeff), *rest = d.terms
        first = arith.mul(coeff, arith.prod(mono))
        return "add", first, arith.sub(d, first)
    ((mono, coeff),) = d.terms
    if coeff != 1:
        return "mul", arith.prod(mono), coeff
    return "mul", arith.prod(mono[:-1]), mono[-1]


def _round_up(nbytes: Dim) -> Dim:
    return arith.mul(arith.floordiv(arith.add(nbytes, ALIGN - 1), ALIGN), ALIGN)


def plan_arena(sizes: list[Dim], frees: list[list[int]]) -> tuple[list[Dim], Dim]:
    """Offsets of tensors in one arena, and its total size (bytes, symbolic).

    ``sizes[k]`` is tensor ``k``'s byte size, in allocation order; ``frees[k]`` lists the tensors
    whose last use is the call that produces tensor ``k`` (free after it). A tensor takes a free
    slot its size provably fits in, else the largest free slot, grown to the symbolic max of its
    tenants, else a new slot (greedy by first fit, as TVM's StorageRewrite for static sizes).
    """
    slot_size: list[Dim] = []
    slot_of: list[int] = []
    free: list[int] = []
    for k, size in enumerate(sizes):
        pick = next((s for s in free if _fits(size, slot_size[s])), None)
        if pick is None and free:
            pick = free[-1]
            slot_size[pick] = arith.maximum(slot_size[pick], size)
        if pick is None:
            pick = len(slot_size)
            slot_size.append(size)
        else:
            free.remove(pick)
        slot_of.append(pick)
        free.extend(slot_of[t] for t in frees[k])
    starts: list[Dim] = []
    total: Dim = 0
    for size in slot_size:
        starts.append(total)
        total = arith.add(total, _round_up(size))
    return [starts[s] for s in slot_of], total


def _fits(size: Dim, capacity: Dim) -> bool:
    lo, _ = arith.bounds(arith.sub(capacity, size))
    return lo is not None and lo >= 0


class _Emitter:
    def __init__(self, symbols: list[SymVar]):
        self.prog = Program(symbols)
        self.heap = ShapeHeap(symbols)
        self.func_index: dict[str, int] = {}
        self.const_index: dict[object, int] = {}
        self.num_regs = 0

    def reg(self) -> int:
        self.num_regs += 1
        return self.num_regs - 1

    def func(self, name: str) -> int:
        if name not in self.func_index:
            self.func_index[name] = len(self.prog.functions)
            self.prog.functions.append(VMFunction(KIND_PACKED, name))
        return self.func_index[name]

    def const(self, value, key=None) -> int:
        key = key if key is not None else id(value)
        if key not in self.const_index:
            self.const_index[key] = len(self.prog.constants)
            self.prog.constants.append(value)
        return self.const_index[key]

    def call(self, dst: int, name: str, args: list[int]) -> None:
        self.prog.code += [OP_CALL, dst, self.func(name), len(args), *args]


def compile_vm(func: Function, kernel_names: dict[int, str], kernel_symbol_args: dict[str, list[str]],
               ) -> Program:
    """Bytecode for ``func`` (fused: PrimitiveCalls only), as one VM function ``main``.

    Parameters
    ----------
    func : the fused graph function (:func:`kiln.build_module.optimize`).
    kernel_names : each PrimitiveCall's uid → the kernel it calls.
    kernel_symbol_args : kernel name → the shape symbols it takes as int64 scalars after its
        tensors (``attrs["symbol_args"]`` of MakePackedAPI).

    Raises
    ------
    CompileError
        For a node the VM cannot run yet (an external BYOC function) or a symbol no input binds.
    """
    symbols = _input_symbols(func)
    em = _Emitter(symbols)
    regs: dict[int, int] = {}
    params = []
    for k, v in enumerate(func.params):
        regs[v.uid] = em.reg()
        params.append(_signature(v.name, v.checked_type, symbols))
    calls = [n for n in post_order(func.outputs) if isinstance(n, PrimitiveCall)]
    for node in post_order(func.outputs):
        if not isinstance(node, (Var, Constant, PrimitiveCall)):
            kind = "an external (BYOC) function" if not isinstance(node, TupleGetItem) else \
                "a multi-output function"
            raise CompileError(f"the VM executor cannot run {kind} yet ({node!r}); use "
                               "executor='graph' with static shapes")
    body: list[int] = []
    em.prog.code = body
    bound: set[str] = set()
    for k, v in enumerate(func.params):
        spec = _match_spec(v.checked_type, symbols, bound)
        em.call(-1, "vm.builtin.match_shape",
                [encode_arg(ARG_REG, regs[v.uid]), encode_arg(ARG_IMM, k),
                 encode_arg(ARG_CONST, em.const(spec))])
    # Everything after the shape program is emitted into `tail`, so that the program (which
    # grows while the tail asks for dims) can be placed before it.
    em.prog.code = tail = []
    sizes = [arith.mul(c.checked_type.size, np.dtype(c.checked_type.dtype).itemsize)
             for c in calls]
    offsets, total = plan_arena(sizes, _frees(calls, func.outputs))
    arena = em.reg()
    em.call(arena, "vm.builtin.alloc_storage", [encode_arg(ARG_IMM, 0), em.heap.arg(total)])
    for call, offset in zip(calls, offsets):
        t = call.checked_type
        out = regs[call.uid] = em.reg()
        em.call(out, "vm.builtin.alloc_tensor",
                [encode_arg(ARG_REG, arena), em.heap.arg(offset),
                 encode_arg(ARG_CONST, em.const(t.dtype, ("dtype", t.dtype))),
                 *(em.heap.arg(d) for d in t.shape)])
        name = kernel_names[call.uid]
        args = [_value_arg(a, regs, em) for a in call.args] + [encode_arg(ARG_REG, out)]
        args += [em.heap.arg(_symbol(symbols, s)) for s in kernel_symbol_args.get(name, [])]
        em.call(-1, name, args)
    results = [_value_arg(o, regs, em) for o in func.outputs]
    if len(results) == 1 and results[0] >> 56 == ARG_REG:
        ret = results[0] & ((1 << 56) - 1)
    else:
        ret = em.reg()
        em.call(ret, "vm.builtin.make_tuple", results)
    tail += [OP_RET, ret]
    program = list(em.heap.program)
    code = list(body)
    if program:
        prog_const = em.const(np.array(program, dtype=np.int64))
        code += [OP_CALL, -1, em.func("vm.builtin.shape_compute"), 1,
                 encode_arg(ARG_CONST, prog_const)]
    code += tail
    outputs = [_signature(n, o.checked_type, symbols)
               for n, o in zip(func.output_names, func.outputs)]
    em.prog.functions.append(VMFunction(
        KIND_VM, "main", 0, len(code), em.num_regs, em.heap.size, tuple(params),
        tuple(o for o in outputs if o is not None)))
    em.prog.code = code
    return em.prog


def _value_arg(e: Expr, regs: dict[int, int], em: _Emitter) -> int:
    if isinstance(e, Constant):
        if e.is_symbolic:
            raise CompileError(f"a symbolic shape value {e.data.tolist()} is used as tensor data "
                               "(not supported by the VM yet)")
        return encode_arg(ARG_CONST, em.const(array(e.data), key=("tensor", e.uid)))
    return encode_arg(ARG_REG, regs[e.uid])


def _frees(calls: list[PrimitiveCall], outputs: list[Expr]) -> list[list[int]]:
    """For each call, the calls whose value is last used by it (outputs are never freed)."""
    index = {c.uid: k for k, c in enumerate(calls)}
    last: dict[int, int] = {}
    for k, c in enumerate(calls):
        for a in c.args:
            if a.uid in index:
                last[index[a.uid]] = k
    keep = {index[o.uid] for o in outputs if o.uid in index}
    frees: list[list[int]] = [[] for _ in calls]
    for t, k in last.items():
        if t not in keep:
            frees[k].append(t)
    for t in range(len(calls)):  # a value nobody reads (and no output): free right away
        if t not in last and t not in keep:
            frees[t].append(t)
    return frees


def _input_symbols(func: Function) -> list[SymVar]:
    found: dict[str, SymVar] = {}
    for v in func.params:
        for d in v.checked_type.shape:
            for s in arith.free_symbols(d):
                found.setdefault(s.name, s)
    return list(found.values())


def _symbol(symbols: list[SymVar], name: str) -> SymVar:
    for s in symbols:
        if s.name == name:
            return s
    raise CompileError(f"kernel argument symbol {name} is not a symbol of the model's inputs")


def _match_spec(t, symbols: list[SymVar], bound: set[str]) -> np.ndarray:
    code, bits = dl_dtype(t.dtype)
    spec = [code, bits, t.ndim]
    for d in t.shape:
        if isinstance(d, int):
            spec += [MATCH_EQUAL, d]
        elif isinstance(d, SymVar):
            slot = symbols.index(d)
            spec += [MATCH_CHECK if d.name in bound else MATCH_BIND, slot]
            bound.add(d.name)
        else:
            raise CompileError(f"input dim {d} is an expression; inputs take symbols or ints")
    return np.array(spec, dtype=np.int64)


def _signature(name: str, t, symbols: list[SymVar]) -> TensorSig | None:
    """A parameter's or output's signature; None for an output with a derived dim (the format
    records ints and symbols only)."""
    dims: list = []
    for d in t.shape:
        if isinstance(d, int):
            dims.append(d)
        elif isinstance(d, SymVar):
            dims.append(Sym(symbols.index(d)))
        else:
            return None
    return TensorSig(name, t.dtype, tuple(dims))
