"""The VM executable's byte format and text form (decision 014): round trips, every truncation
and a set of targeted corruptions raise ModuleLoadError naming what is wrong, the bytecode
decoder rejects malformed instructions, and the loader is registered under both type keys."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import vm_programs as P

import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime.blob import LOADER_PREFIX
from kiln.runtime.vm.bytecode import (
    ARG_MAX,
    ARG_MIN,
    CONST,
    FUNC,
    HEAP,
    IMM,
    REG,
    call,
    decode_arg,
    encode_arg,
    goto,
    if_,
    ret,
)
from kiln.runtime.vm.executable import VMExecutable, VMFunction
from kiln.runtime.vm.executable_format import MAGIC, Sym, Symbol


def _same(a: VMExecutable, b: VMExecutable) -> None:
    assert a.symbols == b.symbols
    assert a.functions == b.functions
    assert np.array_equal(a.code, b.code)
    assert len(a.constants) == len(b.constants)
    for x, y in zip(a.constants, b.constants):
        assert type(x) is type(y)
        if isinstance(x, rt.NDArray):
            assert x.dtype == y.dtype and np.array_equal(x.numpy(), y.numpy())
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y) and y.dtype == np.int64
        else:
            assert x == y


@pytest.mark.parametrize("build", [P.add_mul, P.loop, P.tuple_prog, P.consts_exe])
def test_round_trip(build):
    exe = build()
    data = exe.save_to_binary()
    assert data.startswith(MAGIC)
    back = VMExecutable.load_from_binary(data)
    _same(exe, back)
    assert back.save_to_binary() == data
    assert back.as_text() == exe.as_text()


def test_symbols_and_signatures_survive():
    back = VMExecutable.load_from_binary(P.consts_exe().save_to_binary())
    assert back.symbols == [Symbol("n", 2, 512, 2), Symbol("m", 0, None, 1)]
    main = back.functions[back.func_index["main"]]
    assert main.params[0].dims == (Sym(0), 3, Sym(1))
    assert main.outputs[0].name == "y"


def test_loader_registered_under_both_keys():
    names = rt.list_module_loaders()
    assert "relax.VMExecutable" in names and "relax.Executable" in names
    data = P.add_mul().save_to_binary()
    for key in ("relax.VMExecutable", "relax.Executable"):
        mod = rt.get_global_func(LOADER_PREFIX + key)(data)
        assert isinstance(mod, VMExecutable)


def test_as_text():
    text = P.add_mul().as_text()
    assert "symbol 0: n in [1, 64]" in text
    assert "vm main(x: float32[n, 4], y: float32[n, 4]) -> (out: float32[n, 4])" in text
    assert "  4: %3 = call vm.builtin.alloc_tensor(%2, 0, c[3], heap[0], 4)" in text
    assert "  5: call add(%0, %1, %3)" in text
    assert "  9: ret %5" in text
    loop = P.loop().as_text()
    assert "13: if %8 else goto 18" in loop and "17: goto 11" in loop
    text = P.consts_exe().as_text()
    assert "n in [2, 512] divisible by 2" in text
    assert "c[0] = tensor float32[2, 3]" in text and "c[1] = int64[3] [1, -2, 3]" in text
    assert "c[2] = 'int8'" in text and "c[3] = -7" in text


def test_stats():
    s = P.add_mul().stats()
    assert s["vm_functions"] == ["main"] and s["kernels"] == ["add", "mul"]
    assert "vm.builtin.match_shape" in s["builtins"] and s["instructions"] == 10


def test_arg_encoding():
    for kind in (REG, IMM, CONST, FUNC, HEAP):
        for v in (0, 1, 7, ARG_MAX, ARG_MIN, -1):
            word = encode_arg(kind, v)
            assert -(1 << 63) <= word < (1 << 63)
            assert decode_arg(word) == (kind, v)
    assert encode_arg(IMM, -1) >> 56 == 1
    with pytest.raises(ValueError):
        encode_arg(IMM, ARG_MAX + 1)
    with pytest.raises(ValueError):
        encode_arg(9, 0)


def test_every_truncation_is_a_load_error():
    data = P.tuple_prog().save_to_binary()
    for cut in range(len(data)):
        with pytest.raises(ModuleLoadError):
            VMExecutable.load_from_binary(data[:cut])


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _section(data: bytes, sid: int) -> tuple[int, int]:
    n = struct.unpack_from("<I", data, 12)[0]
    for i in range(n):
        s, off, length = struct.unpack_from("<IQQ", data, 16 + 20 * i)
        if s == sid:
            return off, length
    raise AssertionError(sid)


@pytest.mark.parametrize("change, message", [
    (lambda d: b"KILNVMEY" + d[8:], "not a Kiln VM executable"),
    (lambda d: _patch(d, 8, "<I", 2), "format version 2"),
    (lambda d: _patch(d, 12, "<I", 10**9), "section table"),
    (lambda d: _patch(d, 16 + 4, "<Q", 2**63), "runs past the end"),
    (lambda d: _patch(d, 16 + 12, "<Q", 2**40), "runs past the end"),
    (lambda d: _patch(d, 16, "<I", 2), "appears twice"),
    (lambda d: _patch(d, 16, "<I", 99), "'symbols' is missing"),
    (lambda d: _patch(d, _section(d, 1)[0], "<Q", 2**62), "symbol count"),
    (lambda d: _patch(d, _section(d, 2)[0], "<Q", 2**62), "function count"),
    (lambda d: _patch(d, _section(d, 3)[0], "<Q", 2**62), "constant count"),
    (lambda d: _patch(d, _section(d, 4)[0], "<Q", 2**62), "code length"),
    (lambda d: _patch(d, _section(d, 2)[0] + 8, "<i", 5), "unknown kind 5"),
    (lambda d: _patch(d, _section(d, 3)[0] + 8, "<I", 77), "unknown tag 77"),
])
def test_corrupt_bytes_name_the_problem(change, message):
    data = change(P.consts_exe().save_to_binary())
    with pytest.raises(ModuleLoadError, match=message):
        VMExecutable.load_from_binary(data)


def test_unknown_sections_are_skipped():
    data = P.add_mul().save_to_binary()
    n = struct.unpack_from("<I", data, 12)[0]
    extra = b"future section"
    # one more table entry (id 42) pointing at bytes appended at the end; shift the others
    table = bytearray(data[16:16 + 20 * n])
    for i in range(n):
        sid, off, length = struct.unpack_from("<IQQ", table, 20 * i)
        struct.pack_into("<IQQ", table, 20 * i, sid, off + 20, length)
    body = data[16 + 20 * n:]
    total = 16 + 20 * (n + 1) + len(body)
    new = (data[:12] + struct.pack("<I", n + 1) + bytes(table)
           + struct.pack("<IQQ", 42, total, len(extra)) + body + extra)
    _same(VMExecutable.load_from_binary(new), P.add_mul())


def _exe(code, functions=None, num_regs=2, heap_size=1, constants=()):
    functions = functions or [VMFunction(1, "main", 0, len(code), num_regs, heap_size,
                                         [("x", "float32", [Sym(0)])]),
                              VMFunction(0, "k")]
    return VMExecutable([Symbol("n")], functions, list(constants), code)


@pytest.mark.parametrize("code, message", [
    ([9, 0], "unknown opcode 9"),
    ([*call(-1, 1, [encode_arg(REG, 5)]), *ret(0)], "register 5 out of range"),
    ([*call(-1, 1, [encode_arg(CONST, 0)]), *ret(0)], "constant 0 out of range"),
    ([*call(-1, 1, [encode_arg(HEAP, 3)]), *ret(0)], "heap slot 3 out of range"),
    ([*call(-1, 1, [encode_arg(FUNC, 9)]), *ret(0)], "function 9 out of range"),
    ([*call(-1, 7, []), *ret(0)], "function index 7"),
    ([*call(5, 1, []), *ret(0)], "destination register 5"),
    ([1, -1, 1, 10**6, *ret(0)], "runs past"),
    ([*goto(0), *ret(0)], "jumps to itself"),
    ([*goto(1), *ret(0)], "not an instruction"),
    ([*if_(0, 100), *ret(0)], "not an instruction"),
    ([*ret(9)], "ret of register 9"),
    ([2], "truncated"),
    ([*call(-1, 1, [7 << 56]), *ret(0)], "unknown kind 7"),
])
def test_decoder_rejects(code, message):
    with pytest.raises(ModuleLoadError, match=message):
        _exe(code)


@pytest.mark.parametrize("func, message", [
    (VMFunction(1, "main", 0, 5, 2, 1), "code range"),
    (VMFunction(1, "main", 0, 2, 10**9, 1), "registers"),
    (VMFunction(1, "main", 0, 2, 2, 0), "heap of 0 slots"),
    (VMFunction(1, "main", 0, 2, 0, 1, [("x", "float32", [])]), "registers"),
    (VMFunction(1, "main", 0, 2, 2, 1, [("x", "float32", [Sym(4)])]), "symbol 4"),
    (VMFunction(1, "main", 0, 2, 2, 1, [("x", "complex64", [])]), "not supported"),
])
def test_function_table_checks(func, message):
    with pytest.raises(ModuleLoadError, match=message):
        _exe(ret(0), [func])


def test_duplicate_names_and_bad_constants():
    with pytest.raises(ModuleLoadError, match="appears twice"):
        _exe(ret(0), [VMFunction(1, "main", 0, 2, 2, 1), VMFunction(0, "main")])
    with pytest.raises(ModuleLoadError, match="int64 array"):
        _exe(ret(0), constants=[np.zeros(3, np.float32)])
    with pytest.raises(ModuleLoadError, match="unsupported type"):
        _exe(ret(0), constants=[1.5])


def test_executable_functions():
    exe = P.add_mul(P.py_kernels())
    assert set(exe.list_function_names()) >= {"vm_load_executable", "as_text", "stats"}
    assert exe["as_text"]() == exe.as_text()
    assert exe["get_function_names"]() == ["main"]
    assert exe.lib is not None and exe.find_packed("add") is not None
    assert "relax.VMExecutable" in repr(exe) or "VMExecutable" in repr(exe)


def test_names_of_dims_and_negative_dims():
    exe = VMExecutable([Symbol("n")], [VMFunction(1, "main", 0, 2, 1, 1,
                                                  [("x", "float32", ["n", -1, 3])])], [],
                       ret(0))
    assert exe.functions[0].params[0].dims == (Sym(0), Sym(0), 3)
    with pytest.raises(KilnError, match="not a symbol"):
        VMExecutable([Symbol("n")], [VMFunction(1, "main", 0, 2, 1, 1,
                                                [("x", "float32", ["m"])])], [], ret(0))
