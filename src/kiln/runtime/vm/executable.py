"""``VMExecutable``: the VM's bytecode, constants and function table, as a runtime module.

TVM's ``relax.Executable`` (include/tvm/runtime/vm/executable.h; docs/formats.md §9) with
Kiln's own format (decision 014, ``vm_format``). It is binary-serializable (type_key
``relax.VMExecutable``, also loaded under TVM v0.18's ``relax.Executable``) and imports the
kernel library, as the ``GraphExecutorFactory`` does, so ``export_library`` packs both into one
``.so`` and ``load_module`` gives it back as the root. ``exe["vm_load_executable"]()`` returns a
``kiln.runtime.vm.virtual_machine.VirtualMachine`` over it.

Building one (the compiler, or a test by hand)::

    from kiln.runtime.vm.bytecode import call, ret, reg, imm, const, heap
    code = [*call(-1, 1, [reg(0), imm(0), const(0)]),   # match_shape(x, 0, spec)
            *call(1, 2, [reg(0), reg(0)]),               # ... kernels and builtins
            *ret(1)]
    exe = VMExecutable(symbols=[Symbol("n", 1, 64)],
                       functions=[VMFunction(1, "main", 0, len(code), 2, 1,
                                             params=[("x", "float32", [Sym(0)])]),
                                  VMFunction(0, "vm.builtin.match_shape"), ...],
                       constants=[np.array([2, 32, 1, 1, 0])], code=code, lib=kernels)

Everything is checked when constructed (and so when loaded): malformed parts raise
:class:`ModuleLoadError` naming the function, instruction or field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime import c_types as C
from kiln.runtime.binary_module import register_module_loader
from kiln.runtime.module import Module
from kiln.runtime.ndarray import NDArray, array
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.vm.bytecode import (  # noqa: F401 - the builder API, re-exported
    CONST,
    FUNC,
    HEAP,
    IMM,
    OP_CALL,
    OP_GOTO,
    OP_IF,
    REG,
    DecodeContext,
    Instr,
    call,
    const,
    decode_function,
    encode_arg,
    func,
    goto,
    heap,
    if_,
    imm,
    instr_text,
    reg,
    ret,
)
from kiln.runtime.vm.executable_format import (
    KIND_PACKED,
    KIND_VM,
    Constant,
    Sources,
    Sym,
    Symbol,
    TensorSig,
    VMFunction,
    read_executable,
    read_sources,
    write_executable,
)

TYPE_KEY = "relax.VMExecutable"
ALIASES = ("relax.Executable",)
#: most registers / heap slots a function may ask for per call (a corrupt count must not make
#: every call allocate gigabytes)
MAX_REGS = 1 << 20
MAX_HEAP = 1 << 20


def _fail(msg: str) -> ModuleLoadError:
    return ModuleLoadError(f"VM executable: {msg}")


# ------------------------------------------------------------------- normalizing the parts
def _symbol(s: Any) -> Symbol:
    if isinstance(s, Symbol):
        return s
    if isinstance(s, str):
        return Symbol(s)
    name, lo, hi, div = s
    return Symbol(str(name), int(lo), None if hi is None or hi == -1 else int(hi), int(div))


def _dim(d: Any, symbols: list[Symbol]) -> int | Sym:
    if isinstance(d, Sym):
        return d
    if isinstance(d, str):
        names = [s.name for s in symbols]
        if d not in names:
            raise _fail(f"signature dim {d!r} is not a symbol of the executable")
        return Sym(names.index(d))
    d = int(d)
    return Sym(-1 - d) if d < 0 else d


def _sig(s: Any, symbols: list[Symbol]) -> TensorSig:
    if isinstance(s, TensorSig):
        name, dtype, dims = s.name, s.dtype, s.dims
    else:
        name, dtype, dims = s
    try:
        dtype = C.dtype_name(dtype)
    except KilnError as err:
        raise _fail(f"signature of {name!r}: {err}") from None
    return TensorSig(str(name), dtype, tuple(_dim(d, symbols) for d in dims))


def _function(f: VMFunction, symbols: list[Symbol]) -> VMFunction:
    return VMFunction(int(f.kind), str(f.name), int(f.start), int(f.end), int(f.num_regs),
                      int(f.heap_size), tuple(_sig(s, symbols) for s in f.params),
                      tuple(_sig(s, symbols) for s in f.outputs))


def _constant(c: Any, i: int) -> Constant:
    if isinstance(c, (NDArray, str)):
        return c
    if isinstance(c, (bool, int, np.integer)):
        return int(c)
    if isinstance(c, np.ndarray):
        if c.dtype != np.int64:
            raise _fail(f"constant {i}: a numpy constant must be an int64 array (wrap tensors "
                        f"in kiln.runtime.array), got {c.dtype}")
        return np.ascontiguousarray(c).reshape(-1)
    raise _fail(f"constant {i}: unsupported type {type(c).__name__}")


# ----------------------------------------------------------------------------- checking
def _check_function(f: VMFunction, n_code: int, n_symbols: int) -> None:
    for s in (*f.params, *f.outputs):
        for d in s.dims:
            if isinstance(d, Sym) and not 0 <= d.index < n_symbols:
                raise _fail(f"function {f.name!r}: {s.name!r} refers to symbol {d.index}, but "
                            f"there are {n_symbols}")
    if f.kind == KIND_PACKED:
        return
    if f.kind != KIND_VM:
        raise _fail(f"function {f.name!r}: unknown kind {f.kind}")
    if not 0 <= f.start < f.end <= n_code:
        raise _fail(f"function {f.name!r}: code range [{f.start}, {f.end}) is not inside the "
                    f"{n_code} code words")
    if not len(f.params) <= f.num_regs <= MAX_REGS:
        raise _fail(f"function {f.name!r}: {f.num_regs} registers (needs {len(f.params)} for "
                    f"its params, at most {MAX_REGS})")
    if not n_symbols <= f.heap_size <= MAX_HEAP:
        raise _fail(f"function {f.name!r}: heap of {f.heap_size} slots (needs at least the "
                    f"{n_symbols} symbols, at most {MAX_HEAP})")


class VMExecutable(Module):
    """The VM executable: symbols, function table, constant pool and bytecode.

    Parameters
    ----------
    symbols : list of Symbol or (name, lo, hi, divisor)
        The model's symbolic dims; heap slot ``i`` of every function holds symbol ``i``.
        ``hi`` None (or -1): unbounded.
    functions : list of VMFunction
        The function table: VM functions (kind 1) and packed functions (kind 0: kernels of
        ``lib`` by name, or ``vm.builtin.*``). Signature entries may be :class:`TensorSig` or
        ``(name, dtype, dims)``; a dim is an int >= 0, a :class:`Sym`, a symbol's name, or the
        byte form ``-1 - symbol_index``.
    constants : list
        :class:`NDArray` (tensors), int64 numpy arrays (shape specs, programs, slot lists),
        str (dtypes) or int.
    code : sequence of int
        The instruction words (``vm_bytecode`` encoders).
    lib : Module, optional
        The kernel library; imported (its kernels are found through the import tree).
    sources : dict, optional
        ``(VM function, word index of a kernel call) → (ONNX node names, op types)``: what
        each kernel call computes, for profiles (docs/formats.md §9.2).

    Raises
    ------
    ModuleLoadError
        Duplicate function names, a code range outside ``code``, register or heap counts out of
        range, a signature naming an unknown symbol or dtype, an unsupported constant, any
        instruction that does not decode (``vm_bytecode.decode_function``), or a source that
        is not at a call instruction of a VM function.
    """

    type_key = TYPE_KEY
    is_binary_serializable = True

    def __init__(self, symbols: Sequence[Any], functions: Sequence[VMFunction],
                 constants: Sequence[Any], code: Sequence[int] | np.ndarray,
                 lib: Module | None = None, sources: Sources | None = None):
        super().__init__()
        self.symbols: list[Symbol] = [_symbol(s) for s in symbols]
        self.functions: list[VMFunction] = [_function(f, self.symbols) for f in functions]
        self.constants: list[Constant] = [_constant(c, i) for i, c in enumerate(constants)]
        try:
            self.code = np.asarray(code, dtype=np.int64).reshape(-1)
        except (OverflowError, ValueError, TypeError) as err:
            raise _fail(f"code must be int64 words: {err}") from None
        self.func_index: dict[str, int] = {}
        for i, f in enumerate(self.functions):
            if f.name in self.func_index:
                raise _fail(f"function name {f.name!r} appears twice in the function table")
            self.func_index[f.name] = i
        words = self.code.tolist()
        self.decoded: dict[int, list[Instr]] = {}
        for i, f in enumerate(self.functions):
            _check_function(f, len(words), len(self.symbols))
            if f.is_vm:
                ctx = DecodeContext(f.name, f.num_regs, f.heap_size, len(self.functions),
                                    len(self.constants))
                self.decoded[i] = decode_function(ctx, words, f.start, f.end)
        self.sources: Sources = {(str(f), int(pc)): (tuple(map(str, nodes)), tuple(map(str, ops)))
                                 for (f, pc), (nodes, ops) in (sources or {}).items()}
        self._check_sources()
        if lib is not None:
            self.import_module(lib)

    def _check_sources(self) -> None:
        calls = {(self.functions[i].name, ins.pc) for i, body in self.decoded.items()
                 for ins in body if ins.op == OP_CALL}
        for name, pc in self.sources:
            if (name, pc) not in calls:
                raise _fail(f"source of {name!r} word {pc}: not a call instruction of a VM "
                            "function")

    # -- the library
    @property
    def lib(self) -> Module | None:
        """The kernel library (first import), or None for an executable without kernels."""
        return self._imports[0] if self._imports else None

    def find_packed(self, name: str) -> PackedFunc | None:
        """A kernel ``name`` of the imported modules (not this module's own functions)."""
        return self._find_in_imports(name)

    # -- module functions
    def _functions(self) -> dict[str, Callable[..., Any]]:
        return {"vm_load_executable": self.vm_load_executable, "as_text": self.as_text,
                "stats": self.stats, "get_function_names": self.vm_function_names}

    def _get_own_function(self, name: str) -> PackedFunc | None:
        fn = self._functions().get(name)
        return PackedFunc(fn, name) if fn is not None else None

    def missing_function_hint(self, name: str) -> str:
        # usually "default": a program written for graph executor libraries
        return ("this is a VM library (symbolic shapes): run it with "
                "kiln.vm.VirtualMachine(lib, kiln.cpu()), which calls its vm_load_executable "
                "and vm_initialization (from C or C++: see examples/deploy_vm_c)")

    def list_function_names(self) -> list[str]:
        return list(self._functions())

    def vm_load_executable(self) -> Module:
        """A new VM module over this executable (call its ``vm_initialization`` next)."""
        from kiln.runtime.vm.virtual_machine import VirtualMachine

        return VirtualMachine(self)

    def vm_function_names(self) -> list[str]:
        """Names of the VM (bytecode) functions, callable on a VM by name."""
        return [f.name for f in self.functions if f.is_vm]

    # -- serialization
    def save_to_binary(self) -> bytes:
        """The executable in the format of decision 014 (see ``vm_format``)."""
        return write_executable(self.symbols, self.functions, self.constants, self.code,
                                self.sources)

    @staticmethod
    def load_from_binary(data: bytes | bytearray | memoryview) -> VMExecutable:
        """Inverse of :meth:`save_to_binary` (the library is linked later, as an import).

        Raises
        ------
        ModuleLoadError
            Anything malformed, naming the section, field, function or instruction.
        """
        symbols, functions, constants, code = read_executable(data)
        return VMExecutable(symbols, functions, constants, code, sources=read_sources(data))

    # -- inspection
    def signature_text(self, f: VMFunction) -> str:
        """``name(x: float32[1, n], ...) -> (float32[1, n])`` with symbol names."""
        def sig(s: TensorSig) -> str:
            dims = ", ".join(self.symbols[d.index].name if isinstance(d, Sym) else str(d)
                             for d in s.dims)
            return f"{s.name}: {s.dtype}[{dims}]"

        outs = ", ".join(sig(s) for s in f.outputs)
        return f"{f.name}({', '.join(sig(s) for s in f.params)}) -> ({outs})"

    def _constant_text(self, i: int) -> str:
        c = self.constants[i]
        if isinstance(c, NDArray):
            return f"c[{i}] = tensor {c.dtype}{list(c.shape)}"
        if isinstance(c, np.ndarray):
            vals = c[:16].tolist()
            more = f", ... ({c.size} values)" if c.size > 16 else ""
            return f"c[{i}] = int64[{c.size}] {vals}"[:-1] + more + "]"
        return f"c[{i}] = {c!r}"

    def as_text(self) -> str:
        """Readable bytecode: symbols with bounds, constants, then each VM function's header
        (signature, registers, heap) and one line per instruction (``3: %5 = call k(%0)``;
        jump targets are instruction numbers)."""
        names = [f.name for f in self.functions]
        head = (f"VM executable: {len(self.symbols)} symbols, {len(self.functions)} functions, "
                f"{len(self.constants)} constants, {self.code.size} code words")
        lines = [head]
        lines += [f"  symbol {i}: {s.describe()}" for i, s in enumerate(self.symbols)]
        lines += [f"  {self._constant_text(i)}" for i in range(len(self.constants))]
        for i, f in enumerate(self.functions):
            if not f.is_vm:
                lines.append(f"packed {f.name}")
                continue
            lines.append(f"vm {self.signature_text(f)}  regs={f.num_regs} heap={f.heap_size} "
                         f"words=[{f.start}, {f.end})")
            lines += [f"  {ins.index}: {instr_text(ins, names)}" for ins in self.decoded[i]]
        return "\n".join(lines)

    def stats(self) -> dict[str, Any]:
        """Counts for ``kiln inspect``: symbols, VM functions, packed functions (kernels and
        builtins), constants and their tensor bytes, code words and instructions."""
        packed = [f.name for f in self.functions if not f.is_vm]
        return {
            "symbols": [s.describe() for s in self.symbols],
            "vm_functions": self.vm_function_names(),
            "kernels": [n for n in packed if not n.startswith("vm.builtin.")],
            "builtins": [n for n in packed if n.startswith("vm.builtin.")],
            "constants": len(self.constants),
            "constant_bytes": sum(c.nbytes for c in self.constants if isinstance(c, NDArray)),
            "code_words": int(self.code.size),
            "instructions": sum(len(v) for v in self.decoded.values()),
        }

    def __repr__(self) -> str:
        return (f"<kiln.runtime.VMExecutable functions={self.vm_function_names()} "
                f"imports={len(self._imports)}>")


def tensor_constant(value: Any) -> NDArray:
    """A tensor for the constant pool (an aligned copy of ``value``)."""
    return value if isinstance(value, NDArray) else array(np.asarray(value))


register_module_loader(TYPE_KEY, VMExecutable.load_from_binary, aliases=ALIASES, override=True,
                       zero_copy=True)  # everything read is copied

__all__ = ["ALIASES", "CONST", "FUNC", "HEAP", "IMM", "KIND_PACKED", "KIND_VM", "REG",
           "TYPE_KEY", "Sym", "Symbol", "TensorSig", "VMExecutable", "VMFunction", "call",
           "const", "encode_arg", "func", "goto", "heap", "if_", "imm", "reg", "ret",
           "tensor_constant"]
