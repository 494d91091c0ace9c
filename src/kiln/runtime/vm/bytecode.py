"""The VM's instruction words: argument encoding, instruction encoders, decoding and checks.

Decision 014 (docs/decisions/014-vm-executable.md), after TVM's Relax VM bytecode
(include/tvm/runtime/vm/bytecode.h; docs/formats.md §9.3). Every word is an ``i64``:

- an argument carries its kind in bits 63..56 (:data:`REG`, :data:`IMM`, :data:`CONST`,
  :data:`FUNC`, :data:`HEAP`) and its value sign-extended from the low 56 bits;
- ``Call  [1, dst, func_idx, nargs, arg*nargs]`` (``dst = -1``: the result is dropped),
  ``Ret [2, reg]``, ``Goto [3, offset]``, ``If [4, cond_reg, false_offset]``; offsets are in
  words, relative to the instruction's first word.

The compiler builds code with the encoders (:func:`call`, :func:`ret`, :func:`goto`,
:func:`if_`, :func:`encode_arg`); the runtime decodes it once with :func:`decode_function`,
which checks every index against the executable and raises :class:`ModuleLoadError` naming the
function and the instruction.

The C VM's copy of the opcodes and argument kinds (``rt_vocabulary.h`` of the native runtime)
is generated from this module by ``make vocabulary`` (tools/gen_c_vocabulary.py); a unit test
fails when it is stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.errors import ModuleLoadError

# opcodes
OP_CALL = 1
OP_RET = 2
OP_GOTO = 3
OP_IF = 4
OPCODE_NAMES = {OP_CALL: "call", OP_RET: "ret", OP_GOTO: "goto", OP_IF: "if"}

# argument kinds
REG = 0
IMM = 1
CONST = 2
FUNC = 3
HEAP = 4
ARG_KIND_NAMES = {REG: "REG", IMM: "IMM", CONST: "CONST", FUNC: "FUNC", HEAP: "HEAP"}

#: bits of an argument's value (the kind sits above them)
VALUE_BITS = 56
_VALUE_MASK = (1 << VALUE_BITS) - 1
_SIGN_BIT = 1 << (VALUE_BITS - 1)
#: the range of an argument's value (56-bit two's complement)
ARG_MIN = -(1 << (VALUE_BITS - 1))
ARG_MAX = (1 << (VALUE_BITS - 1)) - 1


def _to_i64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def encode_arg(kind: int, value: int) -> int:
    """One argument word: ``kind`` in bits 63..56, ``value`` in the low 56 bits.

    Parameters
    ----------
    kind : int
        :data:`REG`, :data:`IMM`, :data:`CONST`, :data:`FUNC` or :data:`HEAP`.
    value : int
        In ``[ARG_MIN, ARG_MAX]`` (an immediate larger than that must go in the constant pool).

    Returns
    -------
    int
        The word as a signed 64-bit integer.

    Raises
    ------
    ValueError
        An unknown kind or a value out of range (a compiler bug, not user input).
    """
    if kind not in ARG_KIND_NAMES:
        raise ValueError(f"encode_arg: unknown argument kind {kind}")
    if not ARG_MIN <= value <= ARG_MAX:
        raise ValueError(f"encode_arg: {ARG_KIND_NAMES[kind]} value {value} does not fit in "
                         f"56 bits")
    return _to_i64((kind << VALUE_BITS) | (value & _VALUE_MASK))


def decode_arg(word: int) -> tuple[int, int]:
    """``(kind, value)`` of an argument word (the kind is not checked here)."""
    u = word & ((1 << 64) - 1)
    value = u & _VALUE_MASK
    if value & _SIGN_BIT:
        value -= 1 << VALUE_BITS
    return u >> VALUE_BITS, value


def reg(v: int) -> int:
    """``encode_arg(REG, v)``."""
    return encode_arg(REG, v)


def imm(v: int) -> int:
    """``encode_arg(IMM, v)``."""
    return encode_arg(IMM, v)


def const(v: int) -> int:
    """``encode_arg(CONST, v)``."""
    return encode_arg(CONST, v)


def func(v: int) -> int:
    """``encode_arg(FUNC, v)``."""
    return encode_arg(FUNC, v)


def heap(v: int) -> int:
    """``encode_arg(HEAP, v)``."""
    return encode_arg(HEAP, v)


def call(dst: int, func_idx: int, args: Sequence[int]) -> list[int]:
    """``Call [1, dst, func_idx, nargs, arg*nargs]``; ``args`` are encoded argument words
    (:func:`reg`, :func:`imm`, ...), ``dst = -1`` drops the result."""
    return [OP_CALL, dst, func_idx, len(args), *args]


def ret(register: int) -> list[int]:
    """``Ret [2, reg]``."""
    return [OP_RET, register]


def goto(offset: int) -> list[int]:
    """``Goto [3, offset]``; ``offset`` in words from this instruction's first word."""
    return [OP_GOTO, offset]


def if_(cond_reg: int, false_offset: int) -> list[int]:
    """``If [4, cond_reg, false_offset]``: falls through when the register is true, else
    jumps ``false_offset`` words from this instruction's first word."""
    return [OP_IF, cond_reg, false_offset]


@dataclass(frozen=True)
class Instr:
    """One decoded instruction.

    Attributes
    ----------
    pc : int
        Word index of its first word in the code (absolute).
    index : int
        Its position among the function's instructions.
    op : int
        :data:`OP_CALL`, :data:`OP_RET`, :data:`OP_GOTO` or :data:`OP_IF`.
    dst : int
        Call: the destination register (-1: none); Ret and If: the register read.
    func_idx : int
        Call: the function table entry called.
    args : tuple of (kind, value)
        Call: the decoded arguments.
    target : int
        Goto and If: the instruction index jumped to (If: when false).
    """

    pc: int
    index: int
    op: int
    dst: int = -1
    func_idx: int = -1
    args: tuple[tuple[int, int], ...] = ()
    target: int = -1


@dataclass(frozen=True)
class DecodeContext:
    """What decoding checks indices against."""

    name: str
    num_regs: int
    heap_size: int
    num_funcs: int
    num_consts: int


def _fail(ctx: DecodeContext, pc: int, msg: str) -> ModuleLoadError:
    return ModuleLoadError(f"VM executable: function {ctx.name!r}, instruction at word {pc}: "
                           f"{msg}")


def _check_arg(ctx: DecodeContext, pc: int, i: int, kind: int, value: int) -> None:
    limits = {REG: ("register", ctx.num_regs), CONST: ("constant", ctx.num_consts),
              FUNC: ("function", ctx.num_funcs), HEAP: ("heap slot", ctx.heap_size)}
    if kind == IMM:
        return
    if kind not in limits:
        raise _fail(ctx, pc, f"argument {i} has unknown kind {kind}")
    what, n = limits[kind]
    if not 0 <= value < n:
        raise _fail(ctx, pc, f"argument {i}: {what} {value} out of range (0..{n - 1})")


def _decode_call(ctx: DecodeContext, code: Sequence[int], pc: int, end: int,
                 index: int) -> Instr:
    if pc + 4 > end:
        raise _fail(ctx, pc, "call instruction truncated")
    dst, func_idx, nargs = code[pc + 1], code[pc + 2], code[pc + 3]
    if not -1 <= dst < ctx.num_regs:
        raise _fail(ctx, pc, f"destination register {dst} out of range")
    if not 0 <= func_idx < ctx.num_funcs:
        raise _fail(ctx, pc, f"function index {func_idx} out of range")
    if nargs < 0 or pc + 4 + nargs > end:
        raise _fail(ctx, pc, f"call with {nargs} arguments runs past the function's end")
    args = []
    for i in range(nargs):
        kind, value = decode_arg(code[pc + 4 + i])
        _check_arg(ctx, pc, i, kind, value)
        args.append((kind, value))
    return Instr(pc, index, OP_CALL, dst, func_idx, tuple(args))


def decode_function(ctx: DecodeContext, code: Sequence[int], start: int, end: int
                    ) -> list[Instr]:
    """Decode and check the instructions in ``code[start:end]``.

    Parameters
    ----------
    ctx : DecodeContext
        The function's name, register and heap counts, and the table sizes.
    code : sequence of int
        All instruction words of the executable.
    start, end : int
        The function's word range (checked by the caller against ``len(code)``).

    Returns
    -------
    list of Instr
        With jump targets turned into instruction indices.

    Raises
    ------
    ModuleLoadError
        An unknown opcode, a truncated instruction, an index out of range, a jump outside the
        function or into the middle of an instruction, a jump to itself, or an empty function.
    """
    raw: list[Instr] = []
    jumps: dict[int, int] = {}  # instruction index → absolute word target
    pc = start
    while pc < end:
        op = code[pc]
        index = len(raw)
        if op == OP_CALL:
            ins = _decode_call(ctx, code, pc, end, index)
            size = 4 + len(ins.args)
        elif op in (OP_RET, OP_GOTO):
            if pc + 2 > end:
                raise _fail(ctx, pc, f"{OPCODE_NAMES[op]} instruction truncated")
            if op == OP_RET:
                if not 0 <= code[pc + 1] < ctx.num_regs:
                    raise _fail(ctx, pc, f"ret of register {code[pc + 1]} out of range")
                ins = Instr(pc, index, op, dst=code[pc + 1])
            else:
                ins = Instr(pc, index, op)
                jumps[index] = pc + code[pc + 1]
            size = 2
        elif op == OP_IF:
            if pc + 3 > end:
                raise _fail(ctx, pc, "if instruction truncated")
            if not 0 <= code[pc + 1] < ctx.num_regs:
                raise _fail(ctx, pc, f"if on register {code[pc + 1]} out of range")
            ins = Instr(pc, index, op, dst=code[pc + 1])
            jumps[index] = pc + code[pc + 2]
            size = 3
        else:
            raise _fail(ctx, pc, f"unknown opcode {op}")
        raw.append(ins)
        pc += size
    if not raw:
        raise ModuleLoadError(f"VM executable: function {ctx.name!r} has no instructions")
    by_pc = {ins.pc: ins.index for ins in raw}
    out = list(raw)
    for index, word in jumps.items():
        target = by_pc.get(word)
        if target is None:
            raise _fail(ctx, raw[index].pc, f"jump to word {word}, which is not an instruction "
                        f"of the function (words {start}..{end - 1})")
        if target == index and raw[index].op == OP_GOTO:
            raise _fail(ctx, raw[index].pc, "goto jumps to itself (an endless loop)")
        ins = raw[index]
        out[index] = Instr(ins.pc, ins.index, ins.op, ins.dst, ins.func_idx, ins.args, target)
    return out


def arg_text(kind: int, value: int, func_names: Sequence[str]) -> str:
    """An argument as text: ``%3`` register, ``7`` immediate, ``c[2]`` constant, ``@name``
    function, ``heap[4]`` heap slot."""
    if kind == REG:
        return f"%{value}"
    if kind == IMM:
        return str(value)
    if kind == CONST:
        return f"c[{value}]"
    if kind == FUNC:
        return f"@{func_names[value]}" if 0 <= value < len(func_names) else f"@{value}"
    if kind == HEAP:
        return f"heap[{value}]"
    return f"?{kind}:{value}"


def instr_text(ins: Instr, func_names: Sequence[str]) -> str:
    """One instruction as text, e.g. ``%5 = call fused_dense_add(%0, c[2], heap[7])``."""
    if ins.op == OP_CALL:
        args = ", ".join(arg_text(k, v, func_names) for k, v in ins.args)
        head = f"%{ins.dst} = " if ins.dst >= 0 else ""
        return f"{head}call {func_names[ins.func_idx]}({args})"
    if ins.op == OP_RET:
        return f"ret %{ins.dst}"
    if ins.op == OP_GOTO:
        return f"goto {ins.target}"
    return f"if %{ins.dst} else goto {ins.target}"


__all__ = [
    "ARG_MAX", "ARG_MIN", "CONST", "FUNC", "HEAP", "IMM", "OP_CALL", "OP_GOTO", "OP_IF",
    "OP_RET", "REG", "VALUE_BITS", "DecodeContext", "Instr", "arg_text", "call", "const",
    "decode_arg", "decode_function", "encode_arg", "func", "goto", "heap", "if_", "imm",
    "instr_text", "reg", "ret",
]
