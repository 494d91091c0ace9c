"""Hand-assembled VM executables for the VM tests and the ``vm_exec`` fuzz target.

:class:`Asm` is a tiny assembler over ``kiln.runtime.vm.executable``'s encoders; the programs
below use Python "kernels" (a :class:`PyFunctionModule`) with destination passing, so they run
without a C compiler:

- :func:`add_mul`: ``main(x: f32[n, 4], y: f32[n, 4]) -> (x + y) * x`` with ``n`` in [1, 64];
- :func:`loop`: ``main(x: f32[n], k: i64[]) -> x * (k + 1)``, adding ``x`` in a loop run
  ``k`` times (``tensor_to_heap``, ``read_bool``, ``If``, ``Goto``);
- :func:`tuple_prog`: ``pair(x, y) -> (x + y, reshape(x * y, [4n]))`` and
  ``first(x, y) -> pair(x, y)[0]`` (a VM call, ``make_tuple``, ``tuple_get``, ``reshape``),
  ``twice(x, y) -> (pair(x, y)[0], pair(y, y)[0])`` (two calls of one callee).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.runtime import PyFunctionModule, array
from kiln.runtime.vm.executable import (
    CONST,
    HEAP,
    IMM,
    REG,
    Symbol,
    VMExecutable,
    VMFunction,
    call,
    const,
    encode_arg,
    goto,
    if_,
    ret,
)
from kiln.runtime.vm.executable_format import Sym

B = "vm.builtin."
__all__ = ["Asm", "B", "H", "I", "R", "add_mul", "call", "const", "consts_exe", "loop",
           "py_kernels", "ret", "tuple_prog"]


def R(v: int) -> int:
    return encode_arg(REG, v)


def I(v: int) -> int:
    return encode_arg(IMM, v)


def H(v: int) -> int:
    return encode_arg(HEAP, v)


class Asm:
    """Collects the function table, constants and code of one executable."""

    def __init__(self, symbols: list[Symbol]):
        self.symbols = symbols
        self.functions: list[VMFunction | None] = []
        self.names: dict[str, int] = {}
        self.constants: list[Any] = []
        self.code: list[int] = []
        self._open: dict[int, tuple] = {}

    def fn(self, name: str) -> int:
        """The table index of packed function ``name`` (added on first use)."""
        if name not in self.names:
            self.names[name] = len(self.functions)
            self.functions.append(VMFunction(0, name))
        return self.names[name]

    def c(self, value: Any) -> int:
        """An argument word for a new constant."""
        self.constants.append(value)
        return encode_arg(CONST, len(self.constants) - 1)

    def spec(self, dtype_code: int, bits: int, dims: list[tuple[int, int]]) -> int:
        words = [dtype_code, bits, len(dims)]
        for kind, value in dims:
            words += [kind, value]
        return self.c(np.array(words, dtype=np.int64))

    def prog(self, *steps: tuple[int, ...]) -> int:
        return self.c(np.array([w for s in steps for w in s], dtype=np.int64))

    def begin(self, name: str, params: list, outputs: list, num_regs: int,
              heap_size: int) -> int:
        fidx = len(self.functions)
        self.names[name] = fidx
        self.functions.append(None)
        self._open[fidx] = (name, len(self.code), num_regs, heap_size, params, outputs)
        return fidx

    def end(self, fidx: int) -> None:
        name, start, num_regs, heap_size, params, outputs = self._open.pop(fidx)
        self.functions[fidx] = VMFunction(1, name, start, len(self.code), num_regs, heap_size,
                                          params, outputs)

    def here(self) -> int:
        return len(self.code)

    def emit(self, words: list[int]) -> int:
        at = len(self.code)
        self.code += words
        return at

    def call(self, dst: int, name: str, *args: int) -> int:
        return self.emit(call(dst, self.fn(name), list(args)))

    def vmcall(self, dst: int, fidx: int, *args: int) -> int:
        return self.emit(call(dst, fidx, list(args)))

    def build(self, lib: Any = None) -> VMExecutable:
        assert not self._open, "every function ended"
        return VMExecutable(self.symbols, self.functions, self.constants, self.code, lib)


# ------------------------------------------------------------------------------ kernels
def _add(a, b, out):
    np.add(a._arr, b._arr, out=out._arr)


def _mul(a, b, out):
    np.multiply(a._arr, b._arr, out=out._arr)


def _less(i, k, out):
    out._arr[...] = i < k


def py_kernels() -> PyFunctionModule:
    """``add(a, b, out)``, ``mul(a, b, out)``, ``less(i: int, k: int, out: bool[])``."""
    return PyFunctionModule({"add": _add, "mul": _mul, "less": _less})


F32 = (2, 32)
I64 = (0, 64)


def add_mul(lib: Any = None, symbols: list[Symbol] | None = None,
            kernels: tuple[str, str] = ("add", "mul")) -> VMExecutable:
    """``main(x: f32[n, 4], y: f32[n, 4]) -> (x + y) * x``; heap: 0 n, 1 bytes = 16n; the
    kernels are called ``kernels`` (add, mul)."""
    a = Asm(symbols or [Symbol("n", 1, 64)])
    f = a.begin("main", [("x", "float32", [Sym(0), 4]), ("y", "float32", [Sym(0), 4])],
                [("out", "float32", [Sym(0), 4])], num_regs=6, heap_size=2)
    a.call(-1, B + "match_shape", R(0), I(0), a.spec(*F32, [(1, 0), (0, 4)]))
    a.call(-1, B + "match_shape", R(1), I(1), a.spec(*F32, [(2, 0), (0, 4)]))
    a.call(-1, B + "shape_compute", a.prog((2, 1, 0, 0, 1, 16)))
    f32 = a.c("float32")
    a.call(2, B + "alloc_storage", I(0), H(1))
    a.call(3, B + "alloc_tensor", R(2), I(0), f32, H(0), I(4))
    a.call(-1, kernels[0], R(0), R(1), R(3))
    a.call(4, B + "alloc_storage", I(1), H(1))
    a.call(5, B + "alloc_tensor", R(4), I(0), f32, H(0), I(4))
    a.call(-1, kernels[1], R(3), R(0), R(5))
    a.emit(ret(5))
    a.end(f)
    return a.build(lib)


def loop(lib: Any = None) -> VMExecutable:
    """``main(x: f32[n], k: i64[]) -> x * (k + 1)``; heap: 0 n, 1 bytes, 2 k, 3 i."""
    a = Asm([Symbol("n", 0)])
    f = a.begin("main", [("x", "float32", [Sym(0)]), ("k", "int64", [])],
                [("out", "float32", [Sym(0)])], num_regs=9, heap_size=4)
    a.call(-1, B + "match_shape", R(0), I(0), a.spec(*F32, [(1, 0)]))
    a.call(-1, B + "match_shape", R(1), I(1), a.spec(*I64, []))
    a.call(-1, B + "tensor_to_heap", R(1), a.c(np.array([2], dtype=np.int64)))
    a.call(-1, B + "shape_compute", a.prog((2, 1, 0, 0, 1, 4)))
    f32 = a.c("float32")
    a.call(2, B + "alloc_storage", I(0), H(1))
    a.call(3, B + "alloc_tensor", R(2), I(0), f32, H(0))   # acc
    a.call(-1, B + "copy", R(0), R(3))
    a.call(4, B + "alloc_storage", I(1), H(1))
    a.call(5, B + "alloc_tensor", R(4), I(0), f32, H(0))   # tmp
    a.call(6, B + "alloc_storage", I(2), I(1))
    a.call(7, B + "alloc_tensor", R(6), I(0), a.c("bool"))  # the condition
    top = a.call(-1, "less", H(3), H(2), R(7))
    a.call(8, B + "read_bool", R(7))
    branch = a.emit(if_(8, 0))
    a.call(-1, "add", R(3), R(0), R(5))
    a.call(-1, B + "copy", R(5), R(3))
    a.call(-1, B + "shape_compute", a.prog((0, 3, 0, 3, 1, 1)))
    a.emit(goto(top - a.here()))
    done = a.emit(ret(3))
    a.code[branch + 2] = done - branch
    a.end(f)
    return a.build(lib)


def tuple_prog(lib: Any = None) -> VMExecutable:
    """``pair(x, y) -> (x + y, reshape(x * y, [4n]))``; ``first(x, y) -> pair(x, y)[0]``."""
    a = Asm([Symbol("n", 1, 64)])
    sig = [("x", "float32", [Sym(0), 4]), ("y", "float32", [Sym(0), 4])]
    p = a.begin("pair", sig, [], num_regs=8, heap_size=3)
    a.call(-1, B + "match_shape", R(0), I(0), a.spec(*F32, [(1, 0), (0, 4)]))
    a.call(-1, B + "match_shape", R(1), I(1), a.spec(*F32, [(2, 0), (0, 4)]))
    a.call(-1, B + "shape_compute", a.prog((2, 1, 0, 0, 1, 16), (2, 2, 0, 0, 1, 4)))
    f32 = a.c("float32")
    a.call(2, B + "alloc_storage", I(0), H(1))
    a.call(3, B + "alloc_tensor", R(2), I(0), f32, H(0), I(4))
    a.call(-1, "add", R(0), R(1), R(3))
    a.call(4, B + "alloc_storage", I(1), H(1))
    a.call(5, B + "alloc_tensor", R(4), I(0), f32, H(0), I(4))
    a.call(-1, "mul", R(0), R(1), R(5))
    a.call(6, B + "reshape", R(5), H(2))
    a.call(7, B + "make_tuple", R(3), R(6))
    a.emit(ret(7))
    a.end(p)
    f = a.begin("first", sig, [], num_regs=4, heap_size=1)
    a.vmcall(2, p, R(0), R(1))
    a.call(3, B + "tuple_get", R(2), I(0))
    a.emit(ret(3))
    a.end(f)
    t = a.begin("twice", sig, [], num_regs=7, heap_size=1)  # (pair(x, y)[0], pair(y, y)[0])
    a.vmcall(2, p, R(0), R(1))
    a.vmcall(3, p, R(1), R(1))
    a.call(4, B + "tuple_get", R(2), I(0))
    a.call(5, B + "tuple_get", R(3), I(0))
    a.call(6, B + "make_tuple", R(4), R(5))
    a.emit(ret(6))
    a.end(t)
    return a.build(lib)


def consts_exe() -> VMExecutable:
    """An executable with every kind of constant (for the format tests)."""
    a = Asm([Symbol("n", 2, 512, 2), Symbol("m")])
    a.c(array(np.arange(6, dtype=np.float32).reshape(2, 3)))
    a.c(np.array([1, -2, 3], dtype=np.int64))
    a.c("int8")
    a.c(-7)
    f = a.begin("main", [("x", "float32", [Sym(0), 3, Sym(1)])],
                [("y", "float32", [Sym(0)])], num_regs=1, heap_size=2)
    a.emit(ret(0))
    a.end(f)
    return a.build()


# ------------------------------------------------------------------ graph JSON → bytecode
def from_graph_json(graph_json: str, lib: Any, params: dict[str, Any] | None = None
                    ) -> VMExecutable:
    """A static-shape VM program doing what the graph executor does with ``graph_json``:
    ``main(*inputs)`` checks each input, allocates one storage per ``storage_id`` (sized to its
    largest entry), views every op output in it, calls the kernels in order and returns the
    heads (a tuple when several). Params become tensor constants. For comparing the two
    executors on one compiled model until the VM compiler exists."""
    import json

    from kiln.runtime import c_types as C

    g = json.loads(graph_json)
    nodes, row_ptr = g["nodes"], g["node_row_ptr"]
    dltype, sids, shapes = (g["attrs"][k][1] for k in ("dltype", "storage_id", "shape"))
    params = params or {}

    def eid(nid: int, idx: int = 0) -> int:
        return row_ptr[nid] + idx

    inputs = [nid for nid in g["arg_nodes"] if nodes[nid]["name"] not in params]
    a = Asm([])
    words: dict[int, int] = {}  # entry → argument word (a register or a constant)
    nreg = len(inputs)

    def new_reg() -> int:
        nonlocal nreg
        nreg += 1
        return nreg - 1

    main = a.begin("main", [(nodes[n]["name"], dltype[eid(n)], shapes[eid(n)]) for n in inputs],
                   [], num_regs=0, heap_size=0)
    for i, nid in enumerate(inputs):
        code, bits, _ = C.dl_dtype(dltype[eid(nid)])
        a.call(-1, B + "match_shape", R(i), I(i),
               a.spec(code, bits, [(0, d) for d in shapes[eid(nid)]]))
        words[eid(nid)] = R(i)
    pool: dict[int, int] = {}
    for e, sid in enumerate(sids):
        size = int(np.prod(shapes[e], dtype=np.int64)) * np.dtype(dltype[e]).itemsize
        pool[sid] = max(pool.get(sid, 0), size)
    storage = {}
    for sid, size in sorted(pool.items()):
        storage[sid] = new_reg()
        a.call(storage[sid], B + "alloc_storage", I(sid), I(size))
    for nid, node in enumerate(nodes):
        if node["op"] == "null":
            if nid not in inputs:
                words[eid(nid)] = a.c(array(np.asarray(params[node["name"]])))
            continue
        attrs = node.get("attrs", {})
        ins = [eid(s, k) for s, k, *_ in node["inputs"]]
        if attrs["func_name"] == "__nop":
            words[eid(nid)] = words[ins[0]]
            continue
        outs = [eid(nid, k) for k in range(int(attrs.get("num_outputs", 1)))]
        for e in outs:
            r = new_reg()
            a.call(r, B + "alloc_tensor", R(storage[sids[e]]), I(0), a.c(dltype[e]),
                   *[I(d) for d in shapes[e]])
            words[e] = R(r)
        args = [words[e] for e in ins + outs]
        if str(attrs.get("flatten_data", "0")) == "1":
            flat = []
            for e in ins + outs:
                r = new_reg()
                a.call(r, B + "reshape", words[e], I(int(np.prod(shapes[e], dtype=np.int64))))
                flat.append(R(r))
            args = flat
        if attrs["func_name"] == "__copy":
            a.call(-1, B + "copy", *args)
        else:
            a.call(-1, attrs["func_name"], *args)
    heads = [words[eid(n, k)] for n, k, *_ in g["heads"]]
    out = new_reg()
    if len(heads) == 1 and heads[0] >> 56 == REG:
        a.emit(ret(heads[0] & 0xFFFFFF))
    else:
        a.call(out, B + "make_tuple", *heads)
        a.emit(ret(out))
    a._open[main] = (*a._open[main][:2], nreg, *a._open[main][3:])
    a.end(main)
    return a.build(lib)
