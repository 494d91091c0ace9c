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
5. a run-time If (:class:`~kiln.relay.graph.IfCall`): ``vm.builtin.read_bool`` of the condition,
   ``If``/``Goto`` around the two branches, each emitted like a function body (its own arena,
   its own storage id) with its results landing in the same registers;
6. a data-dependent op (``dyn.*``, docs/decisions/016-data-dependent-shapes.md): its builtin
   (``vm.builtin.nonzero``...; one call for the outputs of one node) and
   ``vm.builtin.bind_shape``, which binds the op's *late symbols* (in ``Program.symbols``
   with their bounds) from the result's shape. Dims over late symbols are computed by an
   inline ``shape_compute`` after the binding, their slots valid only in the body that
   computed them; a kernel output sized by a late symbol gets an ``alloc_storage`` of its
   own right before the kernel (the arena is allocated before the op runs);
7. a run-time loop (:class:`~kiln.relay.graph.LoopCall`): its state (iteration, condition,
   carried values) in storage of its own, the step and the body emitted like branches
   between ``If``/``Goto``; each scan output collects a copy of its element every
   iteration (``vm.builtin.list_new`` / ``list_append``) and is stacked after the loop
   (``list_stack``) into a new ``[count, *elem]`` tensor whose shape binds the loop's late
   count symbol (``bind_shape``), so the kernels after it see ``count`` like any late symbol;
8. ``Ret`` of the output (``vm.builtin.make_tuple`` of several).

A static model compiles the same way: every dim is an immediate and the heap program is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln import arith
from kiln.arith import Dim, SymVar
from kiln.backend.vm_arena import plan_arena
from kiln.backend.vm_dynamic import (
    MULTI_OUTPUT,
    builtin_args,
    depends_on,
    is_dynamic,
    label,
    late_symbols_of,
    sibling_key,
)
from kiln.backend.vm_shape_heap import ShapeHeap
from kiln.backend.vm_signature import (
    input_symbols,
    match_spec,
    shape_spec,
    signature,
    symbol,
)
from kiln.errors import CompileError
from kiln.relay.graph import (
    Call,
    Constant,
    Expr,
    Function,
    IfCall,
    LoopCall,
    PrimitiveCall,
    TensorType,
    TupleGetItem,
    Var,
    post_order,
)
from kiln.relay.provenance import ONNX_NODES, covered_nodes
from kiln.runtime.ndarray import array
from kiln.runtime.vm.bytecode import (
    REG,
    call,
    const,
    decode_arg,
    goto,
    if_,
    imm,
    reg,
    ret,
)
from kiln.runtime.vm.executable_format import KIND_PACKED, KIND_VM, VMFunction


@dataclass
class Program:
    """What the bytecode compiler produces: the parts of a ``VMExecutable``."""

    symbols: list[SymVar]
    functions: list[VMFunction] = field(default_factory=list)
    constants: list = field(default_factory=list)
    code: list[int] = field(default_factory=list)
    #: ``("main", word index of a kernel call) → (ONNX node names, op types)``
    sources: dict = field(default_factory=dict)


class _Emitter:
    def __init__(self, symbols: list[SymVar], late: list[SymVar] = ()):
        self.prog = Program(symbols)
        self.heap = ShapeHeap(symbols, late)
        # per body scope: late symbols bound so far, shared builtin results (sibling outputs)
        self.bound: list[set[str]] = [set()]
        self.shared: list[dict[tuple, int]] = [{}]
        self.func_index: dict[str, int] = {}
        self.const_index: dict[object, int] = {}
        self.num_regs = 0
        self.storages = 0
        self.if_results: dict[int, list[int]] = {}
        self.onnx_table: dict = {}  # the importer's node table (kiln.relay.provenance)
        self.sources: list[tuple[int, tuple, tuple]] = []  # (index in the tail, nodes, ops)
        self.kernel_names: dict[int, str] = {}
        self.kernel_symbol_args: dict[str, list[str]] = {}

    def reg(self) -> int:
        self.num_regs += 1
        return self.num_regs - 1

    def storage_id(self) -> int:
        """A new storage id (one arena per function body: main, each If branch)."""
        self.storages += 1
        return self.storages - 1

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
        """Emit a call (after the late-dependent shape operations its arguments need)."""
        self.flush()
        self.prog.code += call(dst, self.func(name), args)

    def flush(self) -> None:
        """Emit the pending late-dependent shape operations as an inline ``shape_compute``."""
        inline = self.heap.take_inline()
        if inline:
            program = const(self.const(np.array(inline, dtype=np.int64)))
            self.prog.code += call(-1, self.func("vm.builtin.shape_compute"), [program])

    def push_scope(self) -> None:
        self.flush()
        self.heap.push()
        self.bound.append(set())
        self.shared.append({})

    def pop_scope(self) -> None:
        self.flush()
        self.heap.pop()
        self.bound.pop()
        self.shared.pop()

    def is_bound(self, name: str) -> bool:
        return any(name in b for b in self.bound)

    def shared_value(self, key: tuple) -> int | None:
        return next((s[key] for s in reversed(self.shared) if key in s), None)

    def move(self, dst: int, word: int) -> None:
        """Register ``dst`` = the value of argument ``word`` (the VM has no move: a one-item
        tuple and its item)."""
        pair = self.reg()
        self.call(pair, "vm.builtin.make_tuple", [word])
        self.call(dst, "vm.builtin.tuple_get", [reg(pair), imm(0)])

    def alloc_tensor(self, dst: int, storage: int, offset: Dim, t: TensorType) -> None:
        """Register ``dst`` = a tensor of type ``t`` at ``offset`` bytes into ``storage``."""
        self.call(dst, "vm.builtin.alloc_tensor",
                  [reg(storage), self.heap.arg(offset),
                   const(self.const(t.dtype, ("dtype", t.dtype))),
                   *(self.heap.arg(d) for d in t.shape)])


def compile_vm(func: Function, kernel_names: dict[int, str],
               kernel_symbol_args: dict[str, list[str]]) -> Program:
    """Bytecode for ``func`` (fused: PrimitiveCalls, and run-time Ifs whose branches are fused
    too), as one VM function ``main``.

    Parameters
    ----------
    func : the fused graph function (:func:`kiln.driver.build_module.optimize`).
    kernel_names : each PrimitiveCall's uid → the kernel it calls.
    kernel_symbol_args : kernel name → the shape symbols it takes as int64 scalars after its
        tensors (``attrs["symbol_args"]`` of MakePackedAPI).

    Raises
    ------
    CompileError
        For a node the VM cannot run yet (an external BYOC function) or a symbol no input binds.
    """
    symbols = input_symbols(func)
    late = late_symbols_of(func)
    clash = {s.name for s in symbols} & {s.name for s in late}
    if clash:
        raise CompileError(f"data-dependent dim(s) {sorted(clash)} have the name of an input "
                           "symbol")
    symbols += late
    em = _Emitter(symbols, late)
    em.kernel_names, em.kernel_symbol_args = kernel_names, kernel_symbol_args
    em.onnx_table = func.attrs.get(ONNX_NODES) or {}
    regs: dict[int, int] = {}
    params = []
    for v in func.params:
        regs[v.uid] = em.reg()
        params.append(signature(v.name, v.checked_type, symbols))
    head: list[int] = []
    em.prog.code = head
    bound: set[str] = set()
    for k, v in enumerate(func.params):
        spec = match_spec(v.checked_type, symbols, bound)
        em.call(-1, "vm.builtin.match_shape", [reg(regs[v.uid]), imm(k), const(em.const(spec))])
    # Everything after the shape program is emitted into `tail`, so that the program (which
    # grows while the tail asks for dims) can be placed before it.
    em.prog.code = tail = []
    results = _emit_body(em, func.outputs, regs)
    if len(results) == 1 and decode_arg(results[0])[0] == REG:
        out = decode_arg(results[0])[1]
    else:
        out = em.reg()
        em.call(out, "vm.builtin.make_tuple", results)
    tail += ret(out)
    code = list(head)
    if em.heap.program:
        prog_const = em.const(np.array(em.heap.program, dtype=np.int64))
        code += call(-1, em.func("vm.builtin.shape_compute"), [const(prog_const)])
    em.prog.sources = {("main", len(code) + at): (nodes, ops) for at, nodes, ops in em.sources}
    code += tail  # jump offsets are relative: the tail moves as it is
    outputs = [signature(n, o.checked_type, symbols)
               for n, o in zip(func.output_names, func.outputs)]
    em.prog.functions.append(VMFunction(
        KIND_VM, "main", 0, len(code), em.num_regs, em.heap.size, tuple(params),
        tuple(o for o in outputs if o is not None)))
    em.prog.code = code
    return em.prog


def _emit_body(em: _Emitter, outputs: list[Expr], regs: dict[int, int],
               result_regs: list[int] | None = None) -> list[int]:
    """Emit the nodes ``outputs`` need (kernels into one arena of their own storage id, and
    Ifs); returns an argument word per output. With ``result_regs`` (a branch of an If), each
    output ends in its register."""
    em.push_scope()
    words = _emit_nodes(em, outputs, regs, result_regs)
    em.pop_scope()
    return words


def _emit_nodes(em: _Emitter, outputs: list[Expr], regs: dict[int, int],
                result_regs: list[int] | None) -> list[int]:
    nodes = list(post_order(outputs))
    calls = [n for n in nodes if isinstance(n, PrimitiveCall)]
    for node in nodes:
        if isinstance(node, Call) and node.op.runtime:
            continue
        if not isinstance(node, (Var, Constant, PrimitiveCall, IfCall, LoopCall, TupleGetItem)) or (
                isinstance(node, TupleGetItem) and not isinstance(node.value, (IfCall, LoopCall))):
            raise CompileError(f"the VM executor cannot run an external (BYOC) function yet "
                               f"({node!r}); use executor='graph' with static shapes")
        if isinstance(node, Var) and node.uid not in regs:
            raise CompileError(f"graph input {node.name} is not a parameter of the function")
    if result_regs is not None:  # a branch's kernels write its results' registers directly
        for k, o in enumerate(outputs):
            if isinstance(o, PrimitiveCall) and o.uid not in regs:
                regs[o.uid] = result_regs[k]
    placed = _plan(em, calls, nodes, outputs)
    for node in nodes:
        if isinstance(node, PrimitiveCall):
            _emit_kernel(em, node, regs, placed)
        elif isinstance(node, IfCall):
            _emit_if(em, node, regs)
        elif isinstance(node, LoopCall):
            _emit_loop(em, node, regs)
        elif isinstance(node, Call):
            _emit_runtime_op(em, node, regs)
        elif isinstance(node, TupleGetItem):
            regs[node.uid] = em.if_results[node.value.uid][node.index]
    words = [_value_arg(o, regs, em) for o in outputs]
    if result_regs is None:
        return words
    for word, dst in zip(words, result_regs):
        if word != reg(dst):  # a parameter, constant or shared value
            em.move(dst, word)
    return [reg(r) for r in result_regs]


def _plan(em: _Emitter, calls: list[PrimitiveCall], nodes: list[Expr],
          outputs: list[Expr]) -> dict[int, tuple[int, Dim]]:
    """Allocate the arena of ``calls`` (one storage id): call uid → (arena register, offset).
    Values an If or a Loop reads stay alive to the end (their last use is inside a branch or
    the body)."""
    if not calls:
        return {}
    read_by_control = {a.uid for n in nodes if isinstance(n, (IfCall, LoopCall))
                       for a in n.args}
    keep = list(outputs) + [c for c in calls if c.uid in read_by_control]
    frees = _frees(calls, keep, nodes)
    # a tensor whose size depends on a late symbol gets storage of its own where it is made
    # (the arena is allocated before the data-dependent op has run)
    own = [depends_on(_nbytes(c.checked_type), em.heap.late) for c in calls]
    early = [k for k, c in enumerate(calls) if not own[k]]
    if not early:
        return {}
    offsets, total = plan_arena([_nbytes(calls[k].checked_type) for k in early],
                                _early_frees(frees, own, early))
    arena = em.reg()
    em.call(arena, "vm.builtin.alloc_storage", [imm(em.storage_id()), em.heap.arg(total)])
    return {calls[k].uid: (arena, off) for k, off in zip(early, offsets)}


def _early_frees(frees: list[list[int]], own: list[bool], early: list[int]) -> list[list[int]]:
    """``frees`` over the arena's tensors only (indices into ``early``): what is freed after a
    tensor with storage of its own is freed after the arena tensor made before it instead
    (the next arena tensor is made after that tensor's call all the same)."""
    pos = {k: j for j, k in enumerate(early)}
    out: list[list[int]] = [[] for _ in early]
    at = -1
    for k, freed in enumerate(frees):
        if not own[k]:
            at = pos[k]
        if at >= 0:
            out[at] += [pos[t] for t in freed if not own[t]]
    return out


def _nbytes(t: TensorType) -> Dim:
    return arith.mul(t.size, np.dtype(t.dtype).itemsize)


def _emit_kernel(em: _Emitter, call: PrimitiveCall, regs: dict[int, int], placed) -> None:
    out = regs.setdefault(call.uid, em.reg())
    if call.uid in placed:
        arena, offset = placed[call.uid]
        em.alloc_tensor(out, arena, offset, call.checked_type)
    else:  # sized by late symbols: storage of its own, allocated now
        _own_storage_tensor(em, out, call.checked_type)
    name = em.kernel_names[call.uid]
    args = [_value_arg(a, regs, em) for a in call.args] + [reg(out)]
    args += [em.heap.arg(symbol(em.prog.symbols, s))
             for s in em.kernel_symbol_args.get(name, [])]
    em.flush()  # the call's words start here
    nodes = covered_nodes(call.body, em.onnx_table)
    if nodes:
        em.sources.append((len(em.prog.code), tuple(nodes),
                           tuple(em.onnx_table[n].op_type for n in nodes)))
    em.call(-1, name, args)


def _emit_runtime_op(em: _Emitter, node: Call, regs: dict[int, int]) -> None:
    """An op the VM runs itself (``OpDef.runtime``): ``match_cast`` is a view with the refined
    shape; ``trap`` raises its message; ``kv_append`` appends to a key/value cache
    (``vm.builtin.kv_append``); a data-dependent op calls its builtin and binds its late
    symbols (:func:`_emit_dynamic`)."""
    if is_dynamic(node):
        _emit_dynamic(em, node, regs)
        return
    dst = regs.setdefault(node.uid, em.reg())
    if node.op.name == "match_cast":  # check every dim (errors name the value), then view
        value = _value_arg(node.args[0], regs, em)
        what = (f"match_cast of {node.span or 'a value'} to "
                f"{arith.shape_str(node.checked_type.shape)}")
        spec = shape_spec(node.checked_type, em.heap.slot, lambda d: False)
        em.call(-1, "vm.builtin.bind_shape", [value, const(em.const(what, ("label", what))),
                                              const(em.const(spec))])
        em.call(dst, "vm.builtin.reshape", [value,
                                            *(em.heap.arg(d) for d in node.checked_type.shape)])
    elif node.op.name == "kv_append":  # in place behind a past the VM returned earlier
        em.call(dst, "vm.builtin.kv_append", [_value_arg(a, regs, em) for a in node.args])
    elif node.op.name == "trap":
        message = node.attrs["message"]
        em.call(dst, "vm.builtin.trap", [const(em.const(message, ("message", message)))])
    else:
        raise CompileError(f"the VM has no builtin for op {node.op.name}")


def _emit_dynamic(em: _Emitter, node: Call, regs: dict[int, int]) -> None:
    """The op's builtin (once for the outputs of one node), its result into a register, then
    ``bind_shape``: bind each late symbol at its first occurrence, check every other dim."""
    key = sibling_key(node)
    value = em.shared_value(key)
    if value is None:
        name, args = builtin_args(node, [_value_arg(a, regs, em) for a in node.args], em.const)
        value = em.reg()
        em.call(value, name, args)
        em.shared[-1][key] = value
    if node.op.name in MULTI_OUTPUT:
        dst = em.reg()
        em.call(dst, "vm.builtin.tuple_get", [reg(value), imm(node.attrs["output"])])
    else:
        dst = value
    regs[node.uid] = dst
    _emit_bind_shape(em, dst, node.checked_type,
                     f"{label(node)} output {node.attrs.get('output', 0)}")


def _emit_bind_shape(em: _Emitter, value: int, t: TensorType, text: str) -> None:
    """``bind_shape`` of register ``value`` (of type ``t``): bind each late symbol at its
    first occurrence in scope, check every other dim; errors name ``text``."""
    def binds(d: SymVar) -> bool:
        if d.name in em.heap.late and not em.is_bound(d.name):
            em.bound[-1].add(d.name)
            return True
        return False

    spec = shape_spec(t, em.heap.slot, binds)
    em.call(-1, "vm.builtin.bind_shape", [reg(value), const(em.const(text, ("label", text))),
                                          const(em.const(spec))])


def _emit_if(em: _Emitter, node: IfCall, regs: dict[int, int]) -> None:
    """``If`` on the condition's value, each branch emitted with its parameters bound to the
    captures' registers and its results landing in shared registers."""
    cond = em.reg()
    em.call(cond, "vm.builtin.read_bool", [_value_arg(node.args[0], regs, em)])
    results = [em.reg() for _ in node.output_types]
    code = em.prog.code
    at_if = len(code)
    code += if_(cond, 0)  # offsets patched once the branches' lengths are known
    _emit_branch(em, node.then_body, node.args[1:], regs, results)
    at_goto = len(code)
    code += goto(0)
    code[at_if + 2] = len(code) - at_if
    _emit_branch(em, node.else_body, node.args[1:], regs, results)
    code[at_goto + 1] = len(code) - at_goto
    em.if_results[node.uid] = results
    regs[node.uid] = results[0]


def _emit_loop(em: _Emitter, node: LoopCall, regs: dict[int, int]) -> None:
    """The loop's state (iteration, condition, carried values) in storage of its own and an
    empty list per scan output (``vm.builtin.list_new``), then: run the step; leave when it
    says so; run the body; append a copy of each scan element to its list; copy the body's
    other results into the state; jump back. After the loop each list is stacked into a new
    ``[count, *elem]`` tensor whose leading dim binds the count symbol. The body's and the
    step's arenas are reused every iteration."""
    n = 2 + node.num_carried
    types = [TensorType((), "int64"), TensorType((), "bool"),
             *node.output_types[:node.num_carried]]
    state = [_state_tensor(em, t) for t in types]
    zero = const(em.const(array(np.array(0, np.int64)), key=("zero", "int64")))
    for src, dst in zip([zero, *(_value_arg(a, regs, em) for a in node.args[1:n])], state):
        em.call(-1, "vm.builtin.copy", [src, reg(dst)])
    lists = [em.reg() for _ in range(node.num_scan)]
    for lst in lists:
        em.call(lst, "vm.builtin.list_new", [])
    max_trip = _value_arg(node.args[0], regs, em)
    code = em.prog.code
    top = len(code)
    go, next_i = em.reg(), em.reg()
    _emit_body_with(em, node.step, [reg(state[0]), max_trip, reg(state[1])], [go, next_i])
    decide = em.reg()
    em.call(decide, "vm.builtin.read_bool", [reg(go)])
    at_if = len(code)
    code += if_(decide, 0)
    results = [em.reg() for _ in range(n - 1 + node.num_scan)]
    _emit_body_with(em, node.body, [reg(r) for r in state] +
                    [_value_arg(a, regs, em) for a in node.args[n:]], results)
    # append before the state is overwritten: an element may be a carried value itself
    for lst, elem in zip(lists, results[n - 1:]):
        em.call(-1, "vm.builtin.list_append", [reg(lst), reg(elem)])
    for src, dst in zip([next_i, *results[:n - 1]], state):
        em.call(-1, "vm.builtin.copy", [reg(src), reg(dst)])
    code += goto(top - len(code))
    code[at_if + 2] = len(code) - at_if
    outs = state[2:] + [_emit_stack(em, node, k, lst) for k, lst in enumerate(lists)]
    em.if_results[node.uid] = outs
    regs[node.uid] = outs[0]


def _emit_stack(em: _Emitter, node: LoopCall, k: int, lst: int) -> int:
    """Scan output ``k`` of ``node`` from its list (``vm.builtin.list_stack``, the element
    dims from the heap), then ``bind_shape`` of its count; returns its register."""
    t = node.output_types[node.num_carried + k]
    assert node.count is not None, "a loop with scan outputs has a count symbol"
    text = f"Loop scan output {k} (count {node.count.name})"
    out = em.reg()
    em.call(out, "vm.builtin.list_stack",
            [reg(lst), const(em.const(text, ("label", text))),
             const(em.const(t.dtype, ("dtype", t.dtype))),
             *(em.heap.arg(d) for d in t.shape[1:])])
    _emit_bind_shape(em, out, t, text)
    return out


def _state_tensor(em: _Emitter, t: TensorType) -> int:
    """A tensor of type ``t`` in a storage of its own (a loop's state)."""
    out = em.reg()
    _own_storage_tensor(em, out, t)
    return out


def _own_storage_tensor(em: _Emitter, dst: int, t: TensorType) -> None:
    """Register ``dst`` = a tensor of type ``t`` in a storage of its own."""
    storage = em.reg()
    em.call(storage, "vm.builtin.alloc_storage", [imm(em.storage_id()), em.heap.arg(_nbytes(t))])
    em.alloc_tensor(dst, storage, 0, t)


def _emit_body_with(em: _Emitter, body: Function, words: list[int], results: list[int]) -> None:
    """``body`` with its parameters bound to the argument ``words``, results into
    ``results``."""
    inner: dict[int, int] = {}
    for p, word in zip(body.params, words):
        inner[p.uid] = _as_register(em, word)
    _emit_body(em, body.outputs, inner, results)


def _as_register(em: _Emitter, word: int) -> int:
    """The register of an argument word (a constant gets one)."""
    kind, value = decode_arg(word)
    if kind == REG:
        return value
    dst = em.reg()
    em.move(dst, word)
    return dst


def _emit_branch(em: _Emitter, body: Function, captures: list[Expr], regs: dict[int, int],
                 results: list[int]) -> None:
    _emit_body_with(em, body, [_value_arg(a, regs, em) for a in captures], results)


def _value_arg(e: Expr, regs: dict[int, int], em: _Emitter) -> int:
    """The argument word of value ``e``; a symbolic constant (a shape used as data: ``If``
    on ``Shape(x)[2] == 1``) is made into a tensor from the heap here, where it is used."""
    if isinstance(e, Constant) and e.is_symbolic:
        dst = em.reg()
        t = e.checked_type
        shape = np.array(t.shape, dtype=np.int64)
        em.call(dst, "vm.builtin.shape_to_tensor",
                [const(em.const(t.dtype, ("dtype", t.dtype))),
                 const(em.const(shape, ("shape", t.shape))),
                 *(em.heap.arg(d) for d in e.data.reshape(-1).tolist())])
        return reg(dst)
    if isinstance(e, Constant):
        return const(em.const(array(e.data), key=("tensor", e.uid)))
    return reg(regs[e.uid])


def _frees(calls: list[PrimitiveCall], outputs: list[Expr],
           nodes: list[Expr] | None = None) -> list[list[int]]:
    """For each call, the calls whose value is last used by it (outputs are never freed).

    With ``nodes`` (the body in emission order), a run-time op reading a call's value uses it
    until the next call, and a ``match_cast`` (a view) stands for the value it views."""
    index = {c.uid: k for k, c in enumerate(calls)}
    alias: dict[int, int] = {}
    last: dict[int, int] = {}
    k = -1
    for n in nodes if nodes is not None else calls:
        if isinstance(n, PrimitiveCall):
            k = index[n.uid]
        elif not (isinstance(n, Call) and n.op.runtime):
            continue
        for a in n.args:
            root = alias.get(a.uid, a.uid)
            if root in index:
                last[index[root]] = max(last.get(index[root], k), k)
        if isinstance(n, Call) and n.op.name == "match_cast":
            alias[n.uid] = alias.get(n.args[0].uid, n.args[0].uid)
    keep = {index[r] for r in (alias.get(o.uid, o.uid) for o in outputs) if r in index}
    frees: list[list[int]] = [[] for _ in calls]
    for t, k in last.items():
        if t not in keep:
            frees[k].append(t)
    for t in range(len(calls)):  # a value nobody reads (and no output): free right away
        if t not in last and t not in keep:
            frees[t].append(t)
    return frees
